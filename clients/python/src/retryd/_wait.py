"""The end of one blocking call of the synchronous Client: its deadline
and its Cancellation, and the waits that honour both."""

from __future__ import annotations

import threading
import time
from typing import Optional

import grpc

from .outcome import Cancellation, OperationCancelled


class TimedOut(Exception):
    """The call's own timeout passed."""


class Wait:
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
            raise TimedOut()
        return left

    def check(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise OperationCancelled("retryd: cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimedOut()

    def over(self) -> bool:
        """Whether the caller's time has run out or it cancelled."""
        try:
            self.check()
        except (OperationCancelled, TimedOut):
            return True
        return False

    def ended(self, err: BaseException) -> Optional[BaseException]:
        """The error to raise when err means the wait ended: its
        cancellation, its deadline (also a DEADLINE_EXCEEDED status, the
        server's copy of the deadline passing a moment before ours)."""
        try:
            self.check()
        except (OperationCancelled, TimedOut) as e:
            return e
        if (
            self.deadline is not None
            and isinstance(err, grpc.RpcError)
            and hasattr(err, "code")
            and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        ):
            return TimedOut()
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


def public(err: BaseException) -> BaseException:
    """What a wait's end looks like to the caller: TimeoutError for a
    timeout, OperationCancelled for a cancellation."""
    if isinstance(err, TimedOut):
        return TimeoutError("retryd: the call's timeout passed")
    return err
