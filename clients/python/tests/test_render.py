"""The status line, identical to the Go client's RenderRetry and the
TypeScript client's renderRetryLine (the same tables)."""

from __future__ import annotations

from typing import List, Optional

import pytest

import retryd
from retryd.v1 import events_pb2, policy_pb2

DSH_RETRY = [2000, 5000, 5000, 5000, 10000]


def scheduled(
    n: int, delay_ms: int, max_retries: Optional[int], mode: policy_pb2.Mode, schedule: List[int] = []
) -> events_pb2.RetryScheduled:
    s = events_pb2.RetryScheduled(
        retry_number=n, delay_ms=delay_ms, mode=mode, policy=policy_pb2.RetryPolicy(mode=mode, schedule=schedule)
    )
    if max_retries is not None:
        s.max_retries = max_retries
    return s


@pytest.mark.parametrize(
    "s, want",
    [
        (scheduled(2, 4000, 5, policy_pb2.MODE_NORMAL), "Retrying model request (2/5). 4s"),
        (scheduled(2, 1000, 2, policy_pb2.MODE_NORMAL), "Retrying model request (2/2). 1s"),
        (scheduled(1, 505, 2, policy_pb2.MODE_NORMAL), "Retrying model request (1/2). 0.5s"),
        (scheduled(7, 1500, None, policy_pb2.MODE_ALWAYS), "Retrying model request (7/∞). 1.5s"),
        (scheduled(7, 30000, None, policy_pb2.MODE_ALWAYS), "Retrying model request (7/∞). 30s"),
        (scheduled(2, 4000, None, policy_pb2.MODE_SCHEDULE, DSH_RETRY), "Retrying model request (2/5). 4s"),
        (scheduled(5, 10000, None, policy_pb2.MODE_SCHEDULE, DSH_RETRY), "Retrying model request (5/5). 10s"),
        (scheduled(6, 20000, None, policy_pb2.MODE_SCHEDULE, DSH_RETRY), "Retrying model request (6/∞). 20s"),
        (scheduled(2, 5000, 3, policy_pb2.MODE_SCHEDULE, DSH_RETRY), "Retrying model request (2/3). 5s"),
        (scheduled(1, 0, 3, policy_pb2.MODE_NORMAL), "Retrying model request (1/3). 0s"),
    ],
)
def test_render_retry(s: events_pb2.RetryScheduled, want: str) -> None:
    assert retryd.render_retry(s) == want


def test_render_retry_of_events() -> None:
    ev = events_pb2.Event(scheduled=scheduled(1, 2000, None, policy_pb2.MODE_SCHEDULE, DSH_RETRY))
    assert retryd.render_retry(ev) == "Retrying model request (1/5). 2s"
    assert retryd.render_retry(events_pb2.Event(started=events_pb2.RetryStarted(retry_number=1))) is None
    assert retryd.render_retry(events_pb2.Event()) is None


@pytest.mark.parametrize(
    "ms, want",
    [
        (0, "0s"), (1, "0s"), (20, "0s"), (50, "0.1s"), (150, "0.1s"), (250, "0.2s"), (450, "0.5s"),
        (505, "0.5s"), (750, "0.8s"), (999, "1s"), (1000, "1s"), (1001, "1s"), (1050, "1.1s"),
        (1250, "1.2s"), (1500, "1.5s"), (4000, "4s"), (59999, "60s"), (90000, "90s"),
        (3723400, "3723.4s"), (2147483647, "2147483.6s"),
    ],
)
def test_format_delay_matches_go(ms: int, want: str) -> None:
    """Go's %.1f of the float64 seconds: exact binary value, ties to even."""
    assert retryd.format_delay(ms) == want


def test_retry_denominator() -> None:
    assert retryd.retry_denominator(scheduled(2, 0, 5, policy_pb2.MODE_NORMAL)) == 5
    assert retryd.retry_denominator(scheduled(5, 0, None, policy_pb2.MODE_SCHEDULE, DSH_RETRY)) == 5
    assert retryd.retry_denominator(scheduled(6, 0, None, policy_pb2.MODE_SCHEDULE, DSH_RETRY)) is None
    assert retryd.retry_denominator(scheduled(1, 0, None, policy_pb2.MODE_ALWAYS)) is None
