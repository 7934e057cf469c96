"""Parity of the local decider (retryd.local, degraded mode) with the
server: every shared conformance vector that needs no server state is
played against it by the same runner and checks as against a live retryd,
on a clock that jumps to each retry's due time; and its local cap and
bounded chain count."""

from __future__ import annotations

import re
import time
from typing import Any, Dict, List, Optional

import pytest

import retryd
from retrydtest import ROOT
from retryd.local import LocalDecider, is_local
from retryd.v1 import events_pb2, policy_pb2, retry_service_pb2 as pb
from vectors import load_vectors, run_vector

VECTORS = load_vectors(ROOT)


def needs_server(v: Dict[str, Any]) -> Optional[str]:
    """Why a vector cannot be decided by one process alone, or None: the
    server's step records (re-reports, conflicts, stale reports, a pending
    retry refusing the next report), fleet protection, always mode's open
    delegations, a server-side cancel."""
    for s in v["steps"]:
        e = s["expect"]
        if "error" in e and e["error"]["code"] != "INVALID_ARGUMENT":
            return f"error {e['error']['code']} {e['error'].get('reason', '')}"
        if "sameRetryAs" in e:
            return "an idempotent re-report (server step records)"
        if re.search("FLEET|CIRCUIT|PACING", e.get("delaySource", "") + e.get("reason", "")):
            return "fleet protection"
        if e.get("outcome") in ("aborted", "cancelled"):
            return f"recover {e['outcome']} (a server-side cancel)"
        if e.get("delegationsCancelled", 0) > 0:
            return "an open always-mode delegation"
        if s["op"] == "cancelRetries" and "sessionId" in s and s["sessionId"] != v["session"]:
            return "a session the server must know"
        if s["op"] == "awaitRetry" and "retry" not in s:
            return "a retry id only the server could know"
    return None


class LocalVectorClient:
    """The runner's calls answered by a LocalDecider whose clock moves
    forward only when a retry is awaited; every record must be marked
    local."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.d = LocalDecider(now_ms=lambda: time.time() * 1000 + self.offset, retry_budget=float("inf"))

    def _jump_to_due(self, retry_id: str) -> None:
        due = self.d.due_ms(retry_id)
        assert due is not None, f"unknown local retry {retry_id}"
        self.offset += max(0.0, due - self.d.now_ms())

    def failed_step(self, req: pb.FailedStepRequest, timeout: float) -> pb.FailedStepResponse:
        resp = self.d.failed_step(req)
        assert is_local(resp.event), "the event is not marked local"
        return resp

    def recover(self, req: pb.FailedStepRequest, timeout: float) -> retryd.Outcome:
        resp = self.failed_step(req, timeout)
        if resp.decision.WhichOneof("outcome") == "delegate":
            return retryd.Outcome(kind="delegate", event=resp.event, delegate=resp.decision.delegate, local=True)
        sc = resp.decision.schedule
        self._jump_to_due(sc.retry_id)
        started = self.d.start(sc.retry_id)
        assert started is not None
        return retryd.Outcome(kind="retry", event=resp.event, schedule=sc, started=started, local=True)

    def await_retry(self, retry_id: str, timeout: float) -> pb.AwaitRetryResponse:
        self._jump_to_due(retry_id)
        started = self.d.start(retry_id)
        if started is not None:
            return pb.AwaitRetryResponse(started=started)
        st = self.d.state(retry_id)
        assert st is not None and st.HasField("cancelled")
        return pb.AwaitRetryResponse(cancelled=st.cancelled)

    def cancel_retry(self, retry_id: str, timeout: float) -> pb.CancelRetriesResponse:
        self.d.cancel(retry_id)
        st = self.d.state(retry_id)
        assert st is not None
        return pb.CancelRetriesResponse(retries=[st])

    def cancel_session(self, session_id: str, timeout: float) -> pb.CancelRetriesResponse:
        states = [self.d.state(i) for i in self.d.cancel_session(session_id)]
        return pb.CancelRetriesResponse(retries=[s for s in states if s is not None])

    def step_succeeded(self, req: pb.StepSucceededRequest, timeout: float) -> pb.StepSucceededResponse:
        return pb.StepSucceededResponse(closed=self.d.step_succeeded(req.session_id))


LOCAL = [v for v in VECTORS if needs_server(v) is None]


@pytest.mark.parametrize("vector", LOCAL, ids=[v["name"] for v in LOCAL])
def test_local_decider_plays_the_vector(vector: Dict[str, Any]) -> None:
    run_vector(LocalVectorClient(), vector)


def test_every_pure_policy_vector_is_played_locally() -> None:
    """A new server-only feature must not silently shrink the set."""
    played = {v["name"] for v in LOCAL}
    for name in (
        "always-downstream-handshake", "default-policies", "delegate-reasons", "normal-backoff-exhaustion",
        "normal-jitter-bounds", "provider-change", "retry-after-header", "retry-after-ms",
        "schedule-mode-bounded", "schedule-mode-tail",
    ):
        assert name in played, f"{name} was not played locally"


def _always(session: str, step: int, provider: str = "p") -> pb.FailedStepRequest:
    return pb.FailedStepRequest(
        session_id=session, turn=step, step=step, provider=provider, failure=events_pb2.Failure(code="SERVER"),
        policy=policy_pb2.RetryPolicy(mode=policy_pb2.MODE_ALWAYS, backoff=policy_pb2.Backoff(initial_delay_ms=10, jitter_ratio=0)),
        downstream=events_pb2.DOWNSTREAM_DECLINED,
    )


def test_the_local_cap_bounds_unlimited_modes_and_chains_are_bounded() -> None:
    now = [1_000_000.0]
    d = LocalDecider(now_ms=lambda: now[0], rand=lambda: 0, retry_budget=2, max_chains=3)
    seen: List[str] = []
    for i in (1, 2, 3):
        resp = d.failed_step(_always("s", i))
        if resp.decision.WhichOneof("outcome") == "schedule":
            sc = resp.decision.schedule
            seen.append(f"schedule {sc.retry_number} {sc.delay_ms}")
            now[0] += sc.delay_ms
            assert d.start(sc.retry_id) is not None
        else:
            dl = resp.decision.delegate
            seen.append(f"delegate {events_pb2.DelegateReason.Name(dl.reason)} {dl.detail}")
    assert seen == [
        "schedule 1 10",
        "schedule 2 20",
        "delegate DELEGATE_REASON_BUDGET_EXHAUSTED decided locally: 2 of 2 retries used: the local cap while no retryd replica answers",
    ]
    # The exhausted chain closed: the next failure starts at retry 1 again.
    assert d.failed_step(_always("s", 4)).decision.schedule.retry_number == 1
    # At most max_chains chains: the least recently used one goes first.
    for s in ("a", "b", "c"):
        d.failed_step(_always(s, 1))
    assert d.chain_count == 3
    now[0] += 1000
    assert d.failed_step(_always("s", 5)).decision.schedule.retry_number == 1
    # A bounded policy keeps its own budget unless max_retries is lower.
    tight = LocalDecider(now_ms=lambda: now[0], rand=lambda: 0, max_retries=1)

    def bounded(step: int) -> pb.FailedStepResponse:
        return tight.failed_step(
            pb.FailedStepRequest(
                session_id="b", turn=step, step=step, provider="p", failure=events_pb2.Failure(code="SERVER"),
                policy=policy_pb2.RetryPolicy(max_retries=5, backoff=policy_pb2.Backoff(initial_delay_ms=10, jitter_ratio=0)),
            )
        )

    assert bounded(1).decision.WhichOneof("outcome") == "schedule"
    second = bounded(2).decision
    assert second.WhichOneof("outcome") == "delegate" and second.delegate.reason == events_pb2.DELEGATE_REASON_BUDGET_EXHAUSTED


def test_local_refusals_read_like_the_servers() -> None:
    d = LocalDecider()
    bad = pb.FailedStepRequest(session_id="x", turn=1, step=1, provider="p", failure=events_pb2.Failure(code="SERVER"),
                               policy=policy_pb2.RetryPolicy(backoff=policy_pb2.Backoff(multiplier=0.5)))
    with pytest.raises(retryd.local.LocalRpcError) as err:
        d.failed_step(bad)
    assert retryd.field_violations(err.value) == {"policy.backoff.multiplier": "must be a finite number >= 1, got 0.5"}
    named = pb.FailedStepRequest(session_id="x", turn=1, step=1, provider="p", policy_name="fast",
                                 failure=events_pb2.Failure(code="SERVER"))
    with pytest.raises(retryd.local.LocalRpcError) as nerr:
        d.failed_step(named)
    assert set(retryd.field_violations(nerr.value) or {}) == {"policy_name"}
