"""The asyncio client over grpc.aio: the same calls as Client, as
coroutines, and recover(), which cancels the retry on the server when its
task is cancelled."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any, AsyncIterator, Optional, Sequence, Tuple, Union, cast

import grpc
import grpc.aio

from ._base import ClientBase, refused, request_of
from ._log import log
from .request import FailureLike, PolicyLike, ReplayLike
from .tracing import RecoverSpan
from ._exhausted import honor_retry_info_async
from ._degraded import local_started, unreachable_code
from .outcome import (
    AwaitUnreachable,
    NoDecisionError,
    Outcome,
    RecoverAbortedError,
    StreamEndedError,
    jittered,
    reattachable,
)
from .client import _why
from .errors import is_retry_pending, retry_delay, status_code
from .v1 import events_pb2, retry_service_pb2

pb = retry_service_pb2


class _TimedOut(Exception):
    """The call's own timeout passed."""


class _Deadline:
    def __init__(self, timeout: Optional[float]) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise _TimedOut()
        return left

    def over(self) -> bool:
        """Whether the caller's time has run out."""
        return self.at is not None and time.monotonic() >= self.at

    def ended(self, err: BaseException) -> bool:
        if self.at is None:
            return False
        if time.monotonic() >= self.at:
            return True
        return isinstance(err, grpc.RpcError) and hasattr(err, "code") and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED


class AsyncClient(ClientBase):
    """The asyncio twin of Client, over grpc.aio; the same arguments.
    Create it inside the running event loop and close it with
    ``await client.close()`` (or ``async with``).

    Cancelling the task of a call cancels the call; cancelling the task of
    a waiting recover() also cancels the retry on the server. Degraded mode
    is Client's."""

    _channel: grpc.aio.Channel

    def _open_channel(
        self,
        target: str,
        credentials: Optional[grpc.ChannelCredentials],
        options: Sequence[Tuple[str, Any]],
    ) -> grpc.aio.Channel:
        if credentials is not None:
            return grpc.aio.secure_channel(target, credentials, options=options)
        return grpc.aio.insecure_channel(target, options=options)

    async def close(self) -> None:
        """Closes the channel (and every call on it)."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def failed_step(
        self, request: pb.FailedStepRequest, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.FailedStepResponse:
        """See Client.failed_step."""
        try:
            return cast(
                pb.FailedStepResponse,
                await honor_retry_info_async(
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

    async def await_retry(
        self, retry_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.AwaitRetryResponse:
        """See Client.await_retry: the terminal message, re-attaching while
        the stream breaks; TimeoutError when timeout passes. Cancelling the
        task ends the wait; it does not cancel the retry (recover does)."""
        try:
            return await self._await(retry_id, _Deadline(timeout), self._md.for_call(traceparent))
        except _TimedOut:
            raise TimeoutError("retryd: the call's timeout passed") from None

    async def _await(
        self,
        retry_id: str,
        deadline: _Deadline,
        metadata: Sequence[Tuple[str, str]],
        give_up: Optional[float] = None,
    ) -> pb.AwaitRetryResponse:
        backoff = self._reattach_initial
        err_seen: Optional[BaseException] = None
        while True:
            attached = False
            pause: Optional[float] = None
            call = self._stub.AwaitRetry(
                pb.AwaitRetryRequest(retry_id=retry_id), timeout=deadline.remaining(), metadata=metadata
            )
            try:
                async for msg in call:
                    kind = msg.WhichOneof("message")
                    if kind == "state":
                        attached = True
                    elif kind in ("started", "cancelled"):
                        return cast(pb.AwaitRetryResponse, msg)
                raise StreamEndedError(f"retryd: AwaitRetry {retry_id} ended without started or cancelled")
            except (grpc.RpcError, StreamEndedError) as err:
                err_seen = err
                if deadline.ended(err):
                    raise _TimedOut() from None
                pause = _exhausted_pause(err)
                if pause is None and not reattachable(err):
                    raise
                if pause is None and give_up is not None and time.time() > give_up:
                    raise AwaitUnreachable(err) from err
            finally:
                call.cancel()
            if pause is not None:
                # The awaiter bounds are full: wait as long as the server asks.
                log.info("retryd: AwaitRetry %s refused (awaiters full): attaching again in %.3fs", retry_id, pause)
                left = deadline.remaining()
                await asyncio.sleep(pause if left is None else min(pause, left))
                continue
            if attached:
                backoff = self._reattach_initial
            delay = jittered(backoff)
            log.info("retryd: AwaitRetry %s broke (%s): re-attaching in %.3fs", retry_id, _why(err_seen), delay)
            left = deadline.remaining()
            await asyncio.sleep(delay if left is None else min(delay, left))
            backoff = min(2 * backoff, self._reattach_max)

    async def recover(
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
        traceparent: Optional[str] = None,
    ) -> Outcome:
        """See Client.recover, degraded mode, the keyword form and the
        typed refusals included. If timeout passes
        while it waits, it cancels the retry (on the server, or the local
        one) and raises RecoverAbortedError. If its task is cancelled while
        it waits (task.cancel(), asyncio.timeout, asyncio.wait_for), it
        cancels the retry the same way (bounded by cancel_timeout) and
        raises the CancelledError again, so the caller's timeout and task
        group behave as usual."""
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
            out = await self._recover(request, timeout, traceparent, span)
            span.outcome(out)
            return out

    async def _recover(
        self, request: pb.FailedStepRequest, timeout: Optional[float], traceparent: Optional[str], span: RecoverSpan
    ) -> Outcome:
        deadline = _Deadline(timeout)
        metadata = self._md.for_call(traceparent)
        try:
            resp = await self._report(request, deadline, metadata)
        except _TimedOut:
            raise TimeoutError("retryd: the call's timeout passed") from None
        except grpc.RpcError as err:
            if self._fail_closed or deadline.over() or not unreachable_code(err):
                typed = refused(err, "the report", request)
                if typed is err:
                    raise
                raise typed from err
            span.event("retryd unreachable: deciding locally", err)
            return await self._recover_locally(request, deadline, err)
        self._degraded.observe(request, resp)
        outcome = resp.decision.WhichOneof("outcome")
        if outcome == "delegate":
            return Outcome(kind="delegate", event=resp.event, delegate=resp.decision.delegate)
        if outcome != "schedule":
            raise NoDecisionError("retryd: FailedStep answered neither schedule nor delegate")
        schedule = resp.decision.schedule
        give_up = None if self._fail_closed else schedule.due_at.ToNanoseconds() / 1e9 + self._degraded.decision_timeout
        try:
            term = await self._await(schedule.retry_id, deadline, metadata, give_up)
        except AwaitUnreachable as lost:
            span.event("retryd unreachable: starting the scheduled retry locally", lost.err)
            self._degraded.started_locally(request.session_id, schedule.retry_id, lost.err)
            started = local_started(schedule, resp.event.scheduled)
            return Outcome(kind="retry", event=resp.event, schedule=schedule, started=started, local=True, unreachable=lost.err, local_start=True)
        except _TimedOut:
            raise await self._cancel_waiting(schedule, resp.event, metadata, "timeout") from None
        except asyncio.CancelledError:
            await self._cancel_waiting(schedule, resp.event, metadata, "cancelled")
            raise
        if term.WhichOneof("message") == "started":
            return Outcome(kind="retry", event=resp.event, schedule=schedule, started=term.started)
        return Outcome(kind="cancelled", event=resp.event, schedule=schedule, cancelled=term.cancelled)

    async def _report(
        self, request: pb.FailedStepRequest, deadline: _Deadline, metadata: Sequence[Tuple[str, str]]
    ) -> pb.FailedStepResponse:
        """See Client._report."""

        async def send() -> pb.FailedStepResponse:
            left = deadline.remaining()
            t = left if self._fail_closed else min(x for x in (left, self._degraded.decision_timeout) if x is not None)
            return cast(
                pb.FailedStepResponse,
                await honor_retry_info_async(
                    lambda left: self._stub.FailedStep(request, timeout=left, metadata=metadata), t, self._exhausted
                ),
            )

        try:
            return await send()
        except grpc.RpcError as err:
            rid = is_retry_pending(err)
            if rid is None or self._fail_closed or not self._degraded.owns_pending(request.session_id, rid):
                raise
        await self._await(rid, deadline, metadata)
        self._degraded.resolved(rid)
        return await send()

    async def _recover_locally(self, request: pb.FailedStepRequest, deadline: _Deadline, cause: grpc.RpcError) -> Outcome:
        """Degraded mode: decides in the process and waits the delay."""
        resp = self._degraded.decide(request, cause)
        if resp.decision.WhichOneof("outcome") == "delegate":
            return Outcome(kind="delegate", event=resp.event, delegate=resp.decision.delegate, local=True, unreachable=cause)
        schedule = resp.decision.schedule
        decider = self._degraded.decider
        due = decider.due_ms(schedule.retry_id) or 0.0
        try:
            while (left := due - decider.now_ms()) > 0:
                budget = deadline.remaining()
                await asyncio.sleep(left / 1000 if budget is None else min(left / 1000, budget))
        except _TimedOut:
            cancelled = decider.cancel(schedule.retry_id)
            raise RecoverAbortedError("timeout", schedule, resp.event, cancelled=cancelled) from None
        except asyncio.CancelledError:
            decider.cancel(schedule.retry_id)
            raise
        started = decider.start(schedule.retry_id)
        if started is None:
            raise RecoverAbortedError("cancelled", schedule, resp.event, cancelled=decider.cancel(schedule.retry_id))
        return Outcome(kind="retry", event=resp.event, schedule=schedule, started=started, local=True, unreachable=cause)

    async def _cancel_waiting(
        self, schedule: pb.Schedule, event: events_pb2.Event, metadata: Sequence[Tuple[str, str]], reason: Any
    ) -> RecoverAbortedError:
        try:
            resp = await self._stub.CancelRetries(
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

    async def cancel_retry(
        self, retry_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.CancelRetriesResponse:
        """See Client.cancel_retry."""
        return cast(
            pb.CancelRetriesResponse,
            await honor_retry_info_async(
                lambda t: self._stub.CancelRetries(
                    pb.CancelRetriesRequest(retry_id=retry_id), timeout=t, metadata=self._md.for_call(traceparent)
                ),
                timeout,
                self._exhausted,
            ),
        )

    async def cancel_session(
        self, session_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.CancelRetriesResponse:
        """See Client.cancel_session."""
        self._degraded.close_session(session_id)
        return cast(
            pb.CancelRetriesResponse,
            await honor_retry_info_async(
                lambda t: self._stub.CancelRetries(
                    pb.CancelRetriesRequest(session_id=session_id), timeout=t, metadata=self._md.for_call(traceparent)
                ),
                timeout,
                self._exhausted,
            ),
        )

    async def step_succeeded(
        self, request: pb.StepSucceededRequest, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.StepSucceededResponse:
        """See Client.step_succeeded."""
        self._degraded.close_session(request.session_id)
        return cast(
            pb.StepSucceededResponse,
            await honor_retry_info_async(
                lambda t: self._stub.StepSucceeded(request, timeout=t, metadata=self._md.for_call(traceparent)),
                timeout,
                self._exhausted,
            ),
        )

    async def get_chains(
        self, session_id: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.GetChainsResponse:
        """See Client.get_chains."""
        return cast(
            pb.GetChainsResponse,
            await honor_retry_info_async(
                lambda t: self._stub.GetChains(
                    pb.GetChainsRequest(session_id=session_id), timeout=t, metadata=self._md.for_call(traceparent)
                ),
                timeout,
                self._exhausted,
            ),
        )

    async def get_provider_state(
        self, provider: str, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> pb.GetProviderStateResponse:
        """See Client.get_provider_state."""
        return cast(
            pb.GetProviderStateResponse,
            await self._stub.GetProviderState(
                pb.GetProviderStateRequest(provider=provider), timeout=timeout, metadata=self._md.for_call(traceparent)
            ),
        )

    async def watch_events(
        self, request: pb.WatchEventsRequest, *, timeout: Optional[float] = None, traceparent: Optional[str] = None
    ) -> AsyncIterator[events_pb2.Event]:
        """See Client.watch_events; cancel the consuming task, or stop
        iterating, to end it."""
        deadline = _Deadline(timeout)
        try:
            call = self._stub.WatchEvents(
                request, timeout=deadline.remaining(), metadata=self._md.for_call(traceparent)
            )
        except _TimedOut:
            raise TimeoutError("retryd: the call's timeout passed") from None
        try:
            async for resp in call:
                yield resp.event
        except grpc.RpcError as err:
            if deadline.ended(err):
                raise TimeoutError("retryd: the call's timeout passed") from None
            raise
        finally:
            call.cancel()


def _exhausted_pause(err: BaseException) -> Optional[float]:
    """The RetryInfo delay of a RESOURCE_EXHAUSTED AwaitRetry (an awaiter
    bound is full), or None."""
    if status_code(err) != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    delay = retry_delay(err)
    return None if delay is None else delay.total_seconds()
