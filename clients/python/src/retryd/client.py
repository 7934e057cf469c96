"""The synchronous client: typed calls over a grpc.Channel and recover(),
the agent loop's one call for a failed model request."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator, Optional, Sequence, Tuple, cast

import grpc

from ._transport import CallMetadata, TraceparentSource, TransportCredentials, channel_options
from .outcome import (
    DEFAULT_CANCEL_TIMEOUT,
    DEFAULT_REATTACH_INITIAL,
    DEFAULT_REATTACH_MAX,
    Cancellation,
    NoDecisionError,
    OperationCancelled,
    Outcome,
    RecoverAbortedError,
    StreamEndedError,
    jittered,
    positive,
    reattachable,
)
from .v1 import events_pb2, retry_service_pb2, retry_service_pb2_grpc

pb = retry_service_pb2


class _TimedOut(Exception):
    """The call's own timeout passed."""


class _Wait:
    """The end of one blocking call: its deadline (time.monotonic) and its
    Cancellation."""

    def __init__(self, timeout: Optional[float], cancel: Optional[Cancellation]) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.cancel = cancel

    def remaining(self) -> Optional[float]:
        """Seconds left (None: no deadline); raises when the wait ended."""
        self.check()
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _TimedOut()
        return left

    def check(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise OperationCancelled("retryd: cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise _TimedOut()

    def ended(self, err: BaseException) -> Optional[BaseException]:
        """The error to raise when err means the wait ended: its
        cancellation, its deadline (also a DEADLINE_EXCEEDED status, the
        server's copy of the deadline passing a moment before ours)."""
        try:
            self.check()
        except (OperationCancelled, _TimedOut) as e:
            return e
        if (
            self.deadline is not None
            and isinstance(err, grpc.RpcError)
            and hasattr(err, "code")
            and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        ):
            return _TimedOut()
        return None

    def sleep(self, seconds: float) -> None:
        """Sleeps, ending early (and raising) when the wait ends."""
        left = self.remaining()
        if left is not None and left < seconds:
            seconds = left
        woken = threading.Event()
        remove = self.cancel.subscribe(woken.set) if self.cancel is not None else (lambda: None)
        try:
            woken.wait(seconds)
        finally:
            remove()
        self.check()


def _public(err: BaseException) -> BaseException:
    """What a wait's end looks like to the caller: TimeoutError for a
    timeout, OperationCancelled for a cancellation."""
    if isinstance(err, _TimedOut):
        return TimeoutError("retryd: the call's timeout passed")
    return err


class Client:
    """Calls one retryd server. Safe for concurrent use by many agent
    threads; create one per process and close it at exit (or use it as a
    context manager).

    target is a gRPC target ("127.0.0.1:7700", "dns:///retryd.internal:7700").
    credentials is required and explicit: ``retryd.tls()`` (or
    ``retryd.tls_credentials(...)``) or ``retryd.insecure()``. bearer_token
    is sent with every call as ``authorization: Bearer <token>`` (a retryd
    started with --auth-credentials maps it to the caller's tenant), only
    over TLS; insecure_bearer_token is sent over plaintext too (loopback, a
    sidecar, tests). traceparent, if given, is called for each call and
    returns the caller's current W3C trace context, sent as the
    ``traceparent`` metadata so retryd's spans join the caller's trace.

    The channel balances a dns:/// target round robin and retries the
    idempotent calls (FailedStep, GetChains, CancelRetries, StepSucceeded,
    GetProviderState) on UNAVAILABLE. options are more grpc channel
    options."""

    def __init__(
        self,
        target: str,
        *,
        credentials: TransportCredentials,
        bearer_token: Optional[str] = None,
        insecure_bearer_token: Optional[str] = None,
        traceparent: Optional[TraceparentSource] = None,
        reattach_initial: Optional[float] = None,
        reattach_max: Optional[float] = None,
        cancel_timeout: Optional[float] = None,
        options: Sequence[Tuple[str, Any]] = (),
    ) -> None:
        self._md = CallMetadata(credentials, bearer_token, insecure_bearer_token, traceparent)
        opts = channel_options(options)
        if credentials.channel_credentials is not None:
            self._channel = grpc.secure_channel(target, credentials.channel_credentials, options=opts)
        else:
            self._channel = grpc.insecure_channel(target, options=opts)
        self._stub: Any = retry_service_pb2_grpc.RetryServiceStub(self._channel)
        self._reattach_initial = positive(reattach_initial, DEFAULT_REATTACH_INITIAL)
        self._reattach_max = max(self._reattach_initial, positive(reattach_max, DEFAULT_REATTACH_MAX))
        self._cancel_timeout = positive(cancel_timeout, DEFAULT_CANCEL_TIMEOUT)

    def close(self) -> None:
        """Closes the channel (and every call on it). Idempotent."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def failed_step(
        self,
        request: pb.FailedStepRequest,
        *,
        timeout: Optional[float] = None,
        traceparent: Optional[str] = None,
    ) -> pb.FailedStepResponse:
        """Reports one failed model request and returns retryd's decision
        (schedule or delegate) with its event record. Idempotent per
        (session, turn, step, downstream phase), so it is safe to repeat
        after a transport error. Errors are grpc.RpcError as the server sent
        them; see is_retry_pending, error_reason and field_violations."""
        return cast(
            pb.FailedStepResponse,
            self._stub.FailedStep(request, timeout=timeout, metadata=self._md.for_call(traceparent)),
        )

    def await_retry(
        self,
        retry_id: str,
        *,
        timeout: Optional[float] = None,
        cancel: Optional[Cancellation] = None,
        traceparent: Optional[str] = None,
    ) -> pb.AwaitRetryResponse:
        """Waits until the retry starts or is cancelled and returns that
        terminal message: ``WhichOneof("message")`` is "started" when the
        agent may start the retry attempt now, "cancelled" when the retry
        will not start.

        While it waits the server counts it as an awaiter, which is what
        lets a due retry start. If the stream breaks (UNAVAILABLE,
        INTERNAL, or a stream that ends without a terminal message) it
        re-attaches after a jittered backoff for as long as timeout allows;
        the retry starts at most once however often it re-attaches. Any
        other error (NOT_FOUND for an unknown or forgotten retry,
        INVALID_ARGUMENT) is raised as is. When timeout passes it raises
        TimeoutError, when cancel is cancelled OperationCancelled; it does
        not cancel the retry (recover does)."""
        wait = _Wait(timeout, cancel)
        try:
            return self._await(retry_id, wait, self._md.for_call(traceparent))
        except _TimedOut as e:
            raise _public(e) from None

    def _await(self, retry_id: str, wait: _Wait, metadata: Sequence[Tuple[str, str]]) -> pb.AwaitRetryResponse:
        backoff = self._reattach_initial
        while True:
            attached = False
            call = self._stub.AwaitRetry(
                pb.AwaitRetryRequest(retry_id=retry_id), timeout=wait.remaining(), metadata=metadata
            )
            remove = wait.cancel.subscribe(call.cancel) if wait.cancel is not None else (lambda: None)
            try:
                for msg in call:
                    kind = msg.WhichOneof("message")
                    if kind == "state":
                        attached = True
                    elif kind in ("started", "cancelled"):
                        return cast(pb.AwaitRetryResponse, msg)
                raise StreamEndedError(f"retryd: AwaitRetry {retry_id} ended without started or cancelled")
            except (grpc.RpcError, StreamEndedError) as err:
                ended = wait.ended(err)
                if ended is not None:
                    raise ended from None
                if not reattachable(err):
                    raise
            finally:
                remove()
                call.cancel()
            if attached:
                backoff = self._reattach_initial
            wait.sleep(jittered(backoff))
            backoff = min(2 * backoff, self._reattach_max)

    def recover(
        self,
        request: pb.FailedStepRequest,
        *,
        timeout: Optional[float] = None,
        cancel: Optional[Cancellation] = None,
        traceparent: Optional[str] = None,
    ) -> Outcome:
        """The agent loop's one call for a failed model request. It reports
        the failure (FailedStep), and then:

        - on a delegate decision, returns Outcome(kind="delegate") with the
          reason;
        - on a schedule decision, waits with await_retry (re-attaching if
          the stream breaks) and returns kind "retry" when the retry
          started, or "cancelled" when it was cancelled instead.

        If timeout passes or cancel is cancelled while it waits, it cancels
        the retry on the server (CancelRetries by id, bounded by the
        client's cancel_timeout) and raises RecoverAbortedError with the
        server's answer. A KeyboardInterrupt while it waits cancels the
        retry the same way and is raised again. If the timeout passes
        during the report itself, its grpc.RpcError (DEADLINE_EXCEEDED) is
        raised as is: the server may have scheduled a retry recover never
        learned of, which the session's next report names
        (is_retry_pending) and which is otherwise cancelled as abandoned.

        Server errors are grpc.RpcError raised as is: a report for a
        session that still has a pending retry fails with
        FAILED_PRECONDITION, and is_retry_pending(err) names that retry."""
        wait = _Wait(timeout, cancel)
        metadata = self._md.for_call(traceparent)
        try:
            resp = self._stub.FailedStep(request, timeout=wait.remaining(), metadata=metadata)
        except _TimedOut as e:
            raise _public(e) from None
        outcome = resp.decision.WhichOneof("outcome")
        if outcome == "delegate":
            return Outcome(kind="delegate", event=resp.event, delegate=resp.decision.delegate)
        if outcome != "schedule":
            raise NoDecisionError("retryd: FailedStep answered neither schedule nor delegate")
        schedule = resp.decision.schedule
        try:
            term = self._await(schedule.retry_id, wait, metadata)
        except _TimedOut:
            raise self._cancel_waiting(schedule, resp.event, metadata, "timeout") from None
        except OperationCancelled:
            raise self._cancel_waiting(schedule, resp.event, metadata, "cancelled") from None
        except KeyboardInterrupt:
            self._cancel_waiting(schedule, resp.event, metadata, "cancelled")
            raise
        if term.WhichOneof("message") == "started":
            return Outcome(kind="retry", event=resp.event, schedule=schedule, started=term.started)
        return Outcome(kind="cancelled", event=resp.event, schedule=schedule, cancelled=term.cancelled)

    def _cancel_waiting(
        self,
        schedule: pb.Schedule,
        event: events_pb2.Event,
        metadata: Sequence[Tuple[str, str]],
        reason: "Any",
    ) -> RecoverAbortedError:
        try:
            resp = self._stub.CancelRetries(
                pb.CancelRetriesRequest(retry_id=schedule.retry_id), timeout=self._cancel_timeout, metadata=metadata
            )
        except grpc.RpcError as err:
            return RecoverAbortedError(reason, schedule, event, cancel_error=err)
        for st in resp.retries:
            if st.retry_id == schedule.retry_id:
                return RecoverAbortedError(
                    reason,
                    schedule,
                    event,
                    cancelled=st.cancelled if st.HasField("cancelled") else None,
                    started=st.started if st.HasField("started") else None,
                )
        return RecoverAbortedError(reason, schedule, event)

    def cancel_retry(
        self, retry_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.CancelRetriesResponse:
        """Cancels one pending retry. Idempotent: a retry that already
        started or was cancelled is reported in its terminal state and
        nothing changes. Cancelling a retry closes its chain: the next
        failure is retry 1."""
        return cast(
            pb.CancelRetriesResponse,
            self._stub.CancelRetries(
                pb.CancelRetriesRequest(retry_id=retry_id), timeout=timeout, metadata=self._md.for_call(traceparent)
            ),
        )

    def cancel_session(
        self, session_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.CancelRetriesResponse:
        """Cancels the session's pending retry and open always-mode
        delegation, and closes its open chains (for an agent whose session
        ends). NOT_FOUND for a session retryd does not know."""
        return cast(
            pb.CancelRetriesResponse,
            self._stub.CancelRetries(
                pb.CancelRetriesRequest(session_id=session_id), timeout=timeout, metadata=self._md.for_call(traceparent)
            ),
        )

    def step_succeeded(
        self, request: pb.StepSucceededRequest, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.StepSucceededResponse:
        """Reports a successful model request: the session's open chains
        close, so its next failure starts again at retry 1."""
        return cast(
            pb.StepSucceededResponse,
            self._stub.StepSucceeded(request, timeout=timeout, metadata=self._md.for_call(traceparent)),
        )

    def get_chains(
        self, session_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.GetChainsResponse:
        """Reads a session's retry chains and its latest turn and step."""
        return cast(
            pb.GetChainsResponse,
            self._stub.GetChains(
                pb.GetChainsRequest(session_id=session_id), timeout=timeout, metadata=self._md.for_call(traceparent)
            ),
        )

    def get_provider_state(
        self, provider: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.GetProviderStateResponse:
        """Reads the fleet protection of one provider for the caller's
        tenant: its retry budget, failure rate, circuit and pacing.
        ``protected`` is False, and every other field zero, when the
        server's policy file gives the provider no fleet protection. An
        empty provider is INVALID_ARGUMENT; with authentication, a provider
        the tenant may not use is PERMISSION_DENIED (is_provider_not_allowed)."""
        return cast(
            pb.GetProviderStateResponse,
            self._stub.GetProviderState(
                pb.GetProviderStateRequest(provider=provider), timeout=timeout, metadata=self._md.for_call(traceparent)
            ),
        )

    def watch_events(
        self,
        request: pb.WatchEventsRequest,
        *,
        timeout: Optional[float] = None,
        cancel: Optional[Cancellation] = None,
        traceparent: Optional[str] = None,
    ) -> Iterator[events_pb2.Event]:
        """Streams the event log. With request.stop_at_end the iteration
        ends once every event recorded so far was yielded; otherwise it
        follows new events until timeout passes (TimeoutError), cancel is
        cancelled (OperationCancelled), the caller stops iterating (the
        stream closes) or the stream fails (grpc.RpcError, UNAVAILABLE when
        the server shuts down). It does not resume: watch again with
        after_sequence set to the last event's sequence."""
        wait = _Wait(timeout, cancel)
        try:
            call = self._stub.WatchEvents(request, timeout=wait.remaining(), metadata=self._md.for_call(traceparent))
        except _TimedOut as e:
            raise _public(e) from None
        remove = cancel.subscribe(call.cancel) if cancel is not None else (lambda: None)
        try:
            for resp in call:
                yield resp.event
        except grpc.RpcError as err:
            ended = wait.ended(err)
            if ended is not None:
                raise _public(ended) from None
            raise
        finally:
            remove()
            call.cancel()
