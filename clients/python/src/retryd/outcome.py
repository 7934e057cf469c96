"""What recover() decides, and how a waiting call is given up."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Callable, List, Literal, Optional

import grpc

from .v1 import events_pb2, retry_service_pb2

#: The first wait before await_retry re-attaches to a broken stream (s).
DEFAULT_REATTACH_INITIAL = 0.05
#: The cap of the wait between re-attach attempts (s).
DEFAULT_REATTACH_MAX = 2.0
#: The bound of the CancelRetries call recover makes when its wait is given
#: up (s).
DEFAULT_CANCEL_TIMEOUT = 5.0

OutcomeKind = Literal["retry", "delegate", "cancelled"]


@dataclass(frozen=True)
class Outcome:
    """What recover() decided for one failed model request.

    kind is "retry" (start the retry attempt now: schedule and started are
    set), "delegate" (hand the failure to the next recovery policy:
    delegate is set) or "cancelled" (the scheduled retry was cancelled
    instead of started, by a CancelRetries call, as abandoned, at server
    shutdown or on expiry: schedule and cancelled are set). event is the
    event record of the decision (scheduled or delegated), for the agent to
    append to its own history.

    local is True when the client decided (or started the retry) itself in
    degraded mode because no retryd replica answered; its records are then
    marked local (retryd.is_local)."""

    kind: OutcomeKind
    event: events_pb2.Event
    schedule: Optional[retry_service_pb2.Schedule] = None
    started: Optional[events_pb2.RetryStarted] = None
    delegate: Optional[retry_service_pb2.Delegate] = None
    cancelled: Optional[events_pb2.RetryCancelled] = None
    local: bool = False
    unreachable: Optional[BaseException] = None
    """The error that made the client act locally, when local is True."""
    local_start: bool = False
    """The retry is retryd's (scheduled by the server), but the client
    started it by itself: its AwaitRetry could not re-attach until the
    decision timeout after its due time (local is True too)."""

    @property
    def retry(self) -> bool:
        """Whether the agent should start the retry attempt now."""
        return self.kind == "retry"


class RecoverAbortedError(Exception):
    """recover() gave up waiting for a scheduled retry (its timeout passed,
    or its Cancellation was cancelled) and cancelled the retry on the
    server: cancelled (or started, when the retry won the race) is the
    server's answer. When that cancel call failed too, cancel_error holds
    its error, and the server cancels the retry as abandoned after its
    grace. reason is "timeout" or "cancelled"."""

    def __init__(
        self,
        reason: Literal["timeout", "cancelled"],
        schedule: retry_service_pb2.Schedule,
        event: events_pb2.Event,
        cancelled: Optional[events_pb2.RetryCancelled] = None,
        started: Optional[events_pb2.RetryStarted] = None,
        cancel_error: Optional[BaseException] = None,
    ) -> None:
        super().__init__(f"retryd: recover gave up ({reason}) while waiting for retry {schedule.retry_id}")
        self.reason = reason
        self.schedule = schedule
        self.event = event
        self.cancelled = cancelled
        self.started = started
        self.cancel_error = cancel_error


class Cancellation:
    """A signal that a blocking call of the synchronous Client should give
    up: cancel() from any thread ends the waits that were given it. (The
    AsyncClient needs none: cancel its task.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: List[Callable[[], None]] = []

    def cancel(self) -> None:
        """Cancels; idempotent."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    @property
    def cancelled(self) -> bool:
        """Whether cancel() was called."""
        with self._lock:
            return self._cancelled

    def subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Calls fn once on cancel() (at once if already cancelled) and
        returns a function that unsubscribes it."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(fn)

                def remove() -> None:
                    with self._lock:
                        if fn in self._callbacks:
                            self._callbacks.remove(fn)

                return remove
        fn()
        return lambda: None


class OperationCancelled(Exception):
    """A call of the synchronous Client ended because its Cancellation was
    cancelled."""


class NoDecisionError(Exception):
    """FailedStep answered neither schedule nor delegate (a server speaking
    a newer API)."""


class StreamEndedError(Exception):
    """An AwaitRetry stream ended without a started or cancelled message."""


class AwaitUnreachable(Exception):
    """AwaitRetry could not re-attach until its give-up time (degraded
    mode): err is the last error."""

    def __init__(self, err: BaseException) -> None:
        super().__init__(f"retryd: AwaitRetry could not re-attach: {err}")
        self.err = err


def reattachable(err: BaseException) -> bool:
    """Whether an AwaitRetry error means the stream broke (try again) rather
    than that the server refused the request: UNAVAILABLE, INTERNAL, or a
    stream that ended without a terminal message. It is asked only while
    the caller has not given up."""
    if isinstance(err, StreamEndedError):
        return True
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        return err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
    return False


def jittered(d: float) -> float:
    """Spreads the re-attach attempts of many agents over [d/2, d]."""
    return d / 2 + random.random() * (d / 2)


def positive(v: Optional[float], default: float) -> float:
    """v when it is a positive number, else default."""
    return v if v is not None and v > 0 else default
