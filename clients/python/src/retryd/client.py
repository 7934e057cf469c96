"""The synchronous client: typed calls over a grpc.Channel and recover(),
the agent loop's one call for a failed model request."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Iterator, Optional, Sequence, Tuple, Union, cast

import grpc

from ._base import ClientBase, refused, request_of
from ._log import log
from .request import FailureLike, PolicyLike, ReplayLike
from .tracing import RecoverSpan
from ._exhausted import honor_retry_info
from ._degraded import DegradedState, local_started, unreachable_code
from ._wait import Wait as _Wait, TimedOut as _TimedOut, public as _public
from .outcome import (
    AwaitUnreachable,
    Cancellation,
    NoDecisionError,
    OperationCancelled,
    Outcome,
    RecoverAbortedError,
    StreamEndedError,
    jittered,
    reattachable,
)
from .errors import is_retry_pending, retry_delay, status_code
from .v1 import events_pb2, retry_service_pb2

pb = retry_service_pb2


class Client(ClientBase):
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
    idempotent calls (FailedStep, GetChains, CancelRetries, StepSucceeded)
    on UNAVAILABLE. options are more grpc channel options. Those calls,
    when retryd's admission control refuses them (RESOURCE_EXHAUSTED with
    a RetryInfo), are sent again after the delay it asks for,
    exhausted_retries times while their timeout allows; await_retry waits
    out a full awaiter bound the same way.

    Degraded mode (on unless fail_closed): when no replica answers a
    recover() report within decision_timeout seconds, the client decides
    locally with retryd's policy semantics (see recover). local_policies
    are the policies the server would use for a request without an inline
    policy, by policy_name or by provider; local_retry_budget caps the
    local retries of a chain (default: the policy's own finite budget, and
    5 for a policy without one); local_chains bounds how many chains the
    process keeps."""

    _channel: grpc.Channel

    def _open_channel(
        self,
        target: str,
        credentials: Optional[grpc.ChannelCredentials],
        options: Sequence[Tuple[str, Any]],
    ) -> grpc.Channel:
        if credentials is not None:
            return grpc.secure_channel(target, credentials, options=options)
        return grpc.insecure_channel(target, options=options)

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
        them, retryd's refusals typed as in recover (LimitReachedError,
        RetryPendingError, InvalidArgumentError, NotAllowedError); see
        also is_retry_pending, error_reason and field_violations."""
        try:
            return cast(
                pb.FailedStepResponse,
                honor_retry_info(
                    lambda t: self._stub.FailedStep(request, timeout=t, metadata=self._md.for_call(traceparent)),
                    timeout,
                    self._exhausted,
                ),
            )
        except grpc.RpcError as err:
            typed = refused(err, "FailedStep", request)
            if typed is err:
                raise
            raise typed from err

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

    def _await(
        self,
        retry_id: str,
        wait: _Wait,
        metadata: Sequence[Tuple[str, str]],
        give_up: Optional[float] = None,
    ) -> pb.AwaitRetryResponse:
        """await_retry's loop; with give_up (seconds since the epoch) it
        stops re-attaching once that time has passed and raises
        AwaitUnreachable."""
        backoff = self._reattach_initial
        err_seen: Optional[BaseException] = None
        while True:
            attached = False
            pause: Optional[float] = None
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
                err_seen = err
                ended = wait.ended(err)
                if ended is not None:
                    raise ended from None
                pause = _exhausted_pause(err)
                if pause is None and not reattachable(err):
                    raise
                if pause is None and give_up is not None and time.time() > give_up:
                    raise AwaitUnreachable(err) from err
            finally:
                remove()
                call.cancel()
            if pause is not None:
                # The awaiter bounds are full: wait as long as the server asks.
                log.info("retryd: AwaitRetry %s refused (awaiters full): attaching again in %.3fs", retry_id, pause)
                wait.sleep(pause)
                continue
            if attached:
                backoff = self._reattach_initial
            delay = jittered(backoff)
            log.info("retryd: AwaitRetry %s broke (%s): re-attaching in %.3fs", retry_id, _why(err_seen), delay)
            wait.sleep(delay)
            backoff = min(2 * backoff, self._reattach_max)

    def recover(
        self,
        request: Optional[pb.FailedStepRequest] = None,
        *,
        session_id: Optional[str] = None,
        turn: Optional[int] = None,
        step: Optional[int] = None,
        provider: Optional[str] = None,
        failure: Optional[FailureLike] = None,
        code: Optional[str] = None,
        http_status: Optional[int] = None,
        message: Optional[str] = None,
        error: Optional[BaseException] = None,
        output_shown: bool = False,
        replay_safe: ReplayLike = None,
        policy: Optional[PolicyLike] = None,
        policy_name: Optional[str] = None,
        logical_turn_id: Optional[str] = None,
        deadline: Union[datetime, float, None] = None,
        downstream_declined: bool = False,
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

        retryd's refusals are raised typed (each also a grpc.RpcError):
        retryd.LimitReachedError (admission control, with the delay retryd
        asked for, after exhausted_retries sends), RetryPendingError (the
        session still has a pending retry: retry_id),
        InvalidArgumentError (also a ValueError: violations) and
        NotAllowedError; other server errors are grpc.RpcError as is.

        Degraded mode, as the Go client's Recover: when no replica answers
        the report within decision_timeout (UNAVAILABLE after gRPC's own
        retries, or no answer before the timeout), it decides locally with
        retryd's policy semantics (retryd.policy) and the request's policy,
        within the local cap, on a chain it keeps per (session, provider,
        policy key), waits the delay itself and returns the outcome with
        local set (its records are marked: retryd.is_local). When a
        scheduled retry's AwaitRetry cannot re-attach until
        decision_timeout after its due time, it starts the retry itself
        (local set, started names retryd's retry id). Every call asks
        retryd first, so the first answered call resumes server decisions.
        A later report that retryd refuses with RETRY_PENDING for a retry
        the client started by itself, or for a session it decided locally
        since retryd's last answer, awaits that retry (which records its
        start) and reports again. fail_closed turns degraded mode off.

        It takes the report as keyword arguments with plain values, or as
        a FailedStepRequest (``recover(request)``), not both:
        session_id, turn, step and provider, then what failed: ``failure``
        (a retryd.Failure, a dict of its fields, or a Failure message), or
        ``code`` (with ``http_status`` and ``message``), or ``error``, the
        exception the model call raised, classified by
        retryd.classify_exception (an exception no rule knows is reported
        as UNKNOWN). ``output_shown`` (streamed output of the attempt was
        shown: a replay is unsafe) or ``replay_safe`` set the replay;
        ``policy`` (a retryd.Policy, a dict of its fields, or a
        RetryPolicy) or ``policy_name`` the policy; ``logical_turn_id``,
        ``deadline`` (an aware datetime or seconds since the epoch) and
        ``downstream_declined`` the rest. A value of the wrong type raises
        TypeError, one out of range ValueError, before anything is sent.

        With opentelemetry-api installed it records a ``retryd.recover``
        span (see retryd.tracing), current while it runs, so retryd's
        decision spans are its children."""
        request = request_of(
            request,
            dict(
                session_id=session_id, turn=turn, step=step, provider=provider, failure=failure, code=code,
                http_status=http_status, message=message, error=error, output_shown=output_shown,
                replay_safe=replay_safe, policy=policy, policy_name=policy_name, logical_turn_id=logical_turn_id,
                deadline=deadline, downstream_declined=downstream_declined,
            ),
        )
        with RecoverSpan(self._tracer, request) as span:
            out = self._recover(request, timeout, cancel, traceparent, span)
            span.outcome(out)
            return out

    def _recover(
        self,
        request: pb.FailedStepRequest,
        timeout: Optional[float],
        cancel: Optional[Cancellation],
        traceparent: Optional[str],
        span: RecoverSpan,
    ) -> Outcome:
        wait = _Wait(timeout, cancel)
        metadata = self._md.for_call(traceparent)
        try:
            resp = self._report(request, wait, metadata)
        except _TimedOut as e:
            raise _public(e) from None
        except grpc.RpcError as err:
            if self._fail_closed or wait.over() or not unreachable_code(err):
                typed = refused(err, "the report", request)
                if typed is err:
                    raise
                raise typed from err
            span.event("retryd unreachable: deciding locally", err)
            return self._recover_locally(request, wait, err)
        self._degraded.observe(request, resp)
        outcome = resp.decision.WhichOneof("outcome")
        if outcome == "delegate":
            return Outcome(kind="delegate", event=resp.event, delegate=resp.decision.delegate)
        if outcome != "schedule":
            raise NoDecisionError("retryd: FailedStep answered neither schedule nor delegate")
        schedule = resp.decision.schedule
        give_up = None if self._fail_closed else schedule.due_at.ToNanoseconds() / 1e9 + self._degraded.decision_timeout
        try:
            term = self._await(schedule.retry_id, wait, metadata, give_up)
        except AwaitUnreachable as lost:
            span.event("retryd unreachable: starting the scheduled retry locally", lost.err)
            self._degraded.started_locally(request.session_id, schedule.retry_id, lost.err)
            started = local_started(schedule, resp.event.scheduled)
            return Outcome(kind="retry", event=resp.event, schedule=schedule, started=started, local=True, unreachable=lost.err, local_start=True)
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

    def _report(
        self, request: pb.FailedStepRequest, wait: _Wait, metadata: Sequence[Tuple[str, str]]
    ) -> pb.FailedStepResponse:
        """recover's FailedStep, within the decision timeout. A RETRY_PENDING
        refusal for a retry the client already dealt with without retryd
        (DegradedState.owns_pending) is resolved by awaiting that retry,
        which records its start, and reporting again once."""

        def send() -> pb.FailedStepResponse:
            left = wait.remaining()
            t = left if self._fail_closed else min(x for x in (left, self._degraded.decision_timeout) if x is not None)
            return cast(
                pb.FailedStepResponse,
                honor_retry_info(
                    lambda left: self._stub.FailedStep(request, timeout=left, metadata=metadata), t, self._exhausted
                ),
            )

        try:
            return send()
        except grpc.RpcError as err:
            rid = is_retry_pending(err)
            if rid is None or self._fail_closed or not self._degraded.owns_pending(request.session_id, rid):
                raise
        self._await(rid, wait, metadata)
        self._degraded.resolved(rid)
        return send()

    def _recover_locally(self, request: pb.FailedStepRequest, wait: _Wait, cause: grpc.RpcError) -> Outcome:
        """Degraded mode: decides in the process and waits the delay."""
        resp = self._degraded.decide(request, cause)
        if resp.decision.WhichOneof("outcome") == "delegate":
            return Outcome(kind="delegate", event=resp.event, delegate=resp.decision.delegate, local=True, unreachable=cause)
        schedule = resp.decision.schedule
        decider = self._degraded.decider

        def given_up(reason: Any) -> RecoverAbortedError:
            cancelled = decider.cancel(schedule.retry_id)
            return RecoverAbortedError(reason, schedule, resp.event, cancelled=cancelled)

        try:
            due = decider.due_ms(schedule.retry_id) or 0.0
            while (left := due - decider.now_ms()) > 0:
                wait.sleep(left / 1000)
        except _TimedOut:
            raise given_up("timeout") from None
        except OperationCancelled:
            raise given_up("cancelled") from None
        except KeyboardInterrupt:
            given_up("cancelled")
            raise
        started = decider.start(schedule.retry_id)
        if started is None:
            raise given_up("cancelled")
        return Outcome(kind="retry", event=resp.event, schedule=schedule, started=started, local=True, unreachable=cause)

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
            honor_retry_info(
                lambda t: self._stub.CancelRetries(
                    pb.CancelRetriesRequest(retry_id=retry_id), timeout=t, metadata=self._md.for_call(traceparent)
                ),
                timeout,
                self._exhausted,
            ),
        )

    def cancel_session(
        self, session_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.CancelRetriesResponse:
        """Cancels the session's pending retry and open always-mode
        delegation, and closes its open chains (for an agent whose session
        ends). NOT_FOUND for a session retryd does not know. The session's
        local chains (degraded mode) close too, whether or not the call
        reaches retryd."""
        self._degraded.close_session(session_id)
        return cast(
            pb.CancelRetriesResponse,
            honor_retry_info(
                lambda t: self._stub.CancelRetries(
                    pb.CancelRetriesRequest(session_id=session_id), timeout=t, metadata=self._md.for_call(traceparent)
                ),
                timeout,
                self._exhausted,
            ),
        )

    def step_succeeded(
        self, request: pb.StepSucceededRequest, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.StepSucceededResponse:
        """Reports a successful model request: the session's open chains
        close, so its next failure starts again at retry 1. The session's
        local chains (degraded mode) close too, whether or not the call
        reaches retryd."""
        self._degraded.close_session(request.session_id)
        return cast(
            pb.StepSucceededResponse,
            honor_retry_info(
                lambda t: self._stub.StepSucceeded(request, timeout=t, metadata=self._md.for_call(traceparent)),
                timeout,
                self._exhausted,
            ),
        )

    def get_chains(
        self, session_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.GetChainsResponse:
        """Reads a session's retry chains and its latest turn and step."""
        return cast(
            pb.GetChainsResponse,
            honor_retry_info(
                lambda t: self._stub.GetChains(
                    pb.GetChainsRequest(session_id=session_id), timeout=t, metadata=self._md.for_call(traceparent)
                ),
                timeout,
                self._exhausted,
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


def _exhausted_pause(err: BaseException) -> Optional[float]:
    """The RetryInfo delay of a RESOURCE_EXHAUSTED AwaitRetry (an awaiter
    bound is full), or None."""
    if status_code(err) != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    delay = retry_delay(err)
    return None if delay is None else delay.total_seconds()


def _why(err: Optional[BaseException]) -> str:
    """A short account of a broken AwaitRetry stream, for the log."""
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        return str(err.code().name)
    return type(err).__name__ if err is not None else "ended"
