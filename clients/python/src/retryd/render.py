"""The user-visible line of a scheduled retry, as the harness's chat UI
shows it: ``Retrying model request (2/5). 4s``.

The text is identical to the Go client's RenderRetry and the TypeScript
client's renderRetryLine, digit for digit (the shared conformance vectors
check all three).
"""

from __future__ import annotations

import math
from typing import Optional, Union, overload

from .v1 import events_pb2, policy_pb2


def retry_denominator(s: events_pb2.RetryScheduled) -> Optional[int]:
    """The denominator of the line: the chain's finite maximum when it has
    one; the schedule's length while a schedule-mode retry is within the
    schedule (dsh-retry shows 2/5); None when unlimited (rendered ∞)."""
    if s.HasField("max_retries"):
        return s.max_retries
    if s.mode == policy_pb2.MODE_SCHEDULE and s.retry_number <= len(s.policy.schedule):
        return len(s.policy.schedule)
    return None


def format_delay(ms: int) -> str:
    """A delay in milliseconds as the line shows it: whole seconds as "4s",
    anything else in seconds with one decimal ("1.5s", "0.5s") and a
    trailing ".0" dropped, so that 20 ms prints "0s". The decimal is rounded
    like Go's %.1f of the float64 number of seconds (exactly, ties to even:
    1250 ms prints "1.2s")."""
    if ms < 0:
        return "-" + format_delay(-ms)
    # Go's time.Duration.Seconds: whole seconds plus nanoseconds / 1e9 in
    # float64 arithmetic, which Python's float is.
    secs = float(ms // 1000) + float((ms % 1000) * 1_000_000) / 1e9
    if secs == math.trunc(secs):
        return f"{int(secs)}s"
    # Python's %-formatting rounds the exact binary value half to even,
    # as Go's strconv does.
    text = "%.1f" % secs
    if text.endswith(".0"):
        text = text[:-2]
    return text + "s"


@overload
def render_retry(scheduled: events_pb2.RetryScheduled) -> str: ...


@overload
def render_retry(scheduled: events_pb2.Event) -> Optional[str]: ...


def render_retry(scheduled: Union[events_pb2.RetryScheduled, events_pb2.Event]) -> Optional[str]:
    """Renders a scheduled retry as ``Retrying model request (n/max). delay``,
    where max is the finite maximum, the schedule's length while a
    schedule-mode retry is within it, or ∞.

    Given an event, it renders the event's scheduled record and returns
    None for every other kind of event (delegated, started, cancelled,
    closed), which has no retry line."""
    if isinstance(scheduled, events_pb2.Event):
        if scheduled.WhichOneof("kind") != "scheduled":
            return None
        scheduled = scheduled.scheduled
    denom = retry_denominator(scheduled)
    return (
        f"Retrying model request ({scheduled.retry_number}/{'∞' if denom is None else denom}). "
        f"{format_delay(scheduled.delay_ms)}"
    )
