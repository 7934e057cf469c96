"""Requests and checks the suites share."""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

import grpc

import retryd
from retryd.v1 import events_pb2, policy_pb2, retry_service_pb2 as pb


def backoff_policy(initial_ms: int, max_retries: Optional[int] = 2, max_delay_ms: int = 10_000) -> policy_pb2.RetryPolicy:
    """Normal mode with exact (jitter 0) exponential delays."""
    p = policy_pb2.RetryPolicy(
        mode=policy_pb2.MODE_NORMAL,
        backoff=policy_pb2.Backoff(initial_delay_ms=initial_ms, max_delay_ms=max_delay_ms, jitter_ratio=0),
    )
    if max_retries is not None:
        p.max_retries = max_retries
    return p


def failed_step(
    session: str,
    turn: int,
    step: int,
    policy: policy_pb2.RetryPolicy,
    provider: str = "anthropic",
    code: str = "RATE_LIMIT",
) -> pb.FailedStepRequest:
    return pb.FailedStepRequest(
        session_id=session,
        turn=turn,
        step=step,
        provider=provider,
        failure=events_pb2.Failure(code=code, http_status=429 if code == "RATE_LIMIT" else 0),
        policy=policy,
    )


def watch_session(client: retryd.Client, session: str) -> List[events_pb2.Event]:
    """Every event of the session recorded so far."""
    return list(client.watch_events(pb.WatchEventsRequest(session_id=session, stop_at_end=True), timeout=10))


def kinds(events: List[events_pb2.Event]) -> List[str]:
    return [str(e.WhichOneof("kind")) for e in events]


def wait_awaiters(client: retryd.Client, session: str, n: int, timeout: float = 10) -> None:
    """Waits until the session's latest retry is pending with n awaiters
    (a recover() or await_retry is attached), so a test acts on a waiting
    call, not on one still reporting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chains: Sequence[pb.Chain] = client.get_chains(session).chains
        except grpc.RpcError:
            chains = []
        if chains and chains[0].latest.status == pb.RETRY_STATUS_PENDING and chains[0].latest.awaiters >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"{session}: no pending retry with {n} awaiters within {timeout} s")
