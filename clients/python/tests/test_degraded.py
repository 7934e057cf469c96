"""Degraded mode against a real retryd behind a loopback proxy that can cut
the client off, and a retryd that is SIGKILLed and restarted under a load of
agent loops: local decisions with the server's semantics, marked local,
within the local cap; a retry whose await cannot re-attach; the
RETRY_PENDING such retries leave behind once retryd is back; and
fail-closed."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import grpc
import pytest

import retryd
from helpers import backoff_policy, failed_step, kinds, wait_awaiters
from retrydtest import RetrydServer, TCPProxy, temp_dir
from retryd.v1 import events_pb2, policy_pb2, retry_service_pb2 as pb

TIMEOUT = 0.5  # the decision timeout of these clients


class Degraded:
    def __init__(self, server: RetrydServer, **kw: object) -> None:
        self.server = server
        self.proxy = TCPProxy(server.addr)
        self.client = retryd.Client(
            self.proxy.addr, credentials=retryd.insecure(), decision_timeout=TIMEOUT,
            reattach_initial=0.02, reattach_max=0.1, **kw,  # type: ignore[arg-type]
        )
        self.direct = retryd.Client(server.addr, credentials=retryd.insecure())

    def cut(self) -> None:
        self.proxy.refuse = True
        self.proxy.cut()

    def restore(self) -> None:
        self.proxy.refuse = False

    def wait_reachable(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.get_chains("degraded-probe", timeout=1)
                return
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return
            assert time.monotonic() < deadline, "retryd still unreachable through the proxy after 30 s"
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()
        self.direct.close()
        self.proxy.close()


@pytest.fixture()
def degraded(server: RetrydServer) -> Iterator[Degraded]:
    d = Degraded(server)
    try:
        yield d
    finally:
        d.close()


def test_local_decisions_while_unreachable(degraded: Degraded) -> None:
    """Cut off, recover() decides locally with the request's policy (exact
    delays, its budget, then a local budget_exhausted), marks every outcome
    and record local and counts it; the first answered call is the
    server's again."""
    d = degraded
    session = "py-degraded-local"
    d.client.step_succeeded(pb.StepSucceededRequest(session_id=session, turn=1, step=0))  # connected once
    d.cut()
    p = backoff_policy(50)
    got: List[Tuple[str, int, int]] = []
    for step in (1, 2, 3):
        begin = time.monotonic()
        out = d.client.recover(failed_step(session, 1, step, p), timeout=10)
        assert out.local and retryd.is_local(out.event)
        assert out.unreachable is not None and retryd.status_code(out.unreachable) in (
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        assert out.event.sequence == 0
        if out.kind == "retry":
            assert out.schedule is not None and out.started is not None
            assert out.schedule.retry_id.startswith("local-") and out.started.retry_id == out.schedule.retry_id
            assert out.schedule.detail.startswith("decided locally")
            assert time.monotonic() - begin >= out.schedule.delay_ms / 1000
            got.append(("retry", out.schedule.retry_number, out.schedule.delay_ms))
            assert retryd.render_retry(out.event) == f"Retrying model request ({out.schedule.retry_number}/2). 0.1s"
        else:
            assert out.delegate is not None and out.delegate.detail.startswith("decided locally")
            got.append(("delegate", out.delegate.reason, 0))
    assert got == [("retry", 1, 50), ("retry", 2, 100), ("delegate", events_pb2.DELEGATE_REASON_BUDGET_EXHAUSTED, 0)]
    assert d.client.decisions() == {"schedule/local": 2, "delegate/local": 1}

    d.restore()
    d.wait_reachable()
    out = d.client.recover(failed_step(session, 2, 4, p), timeout=10)
    assert not out.local and out.event.sequence > 0 and out.kind == "retry"
    assert d.client.decisions()["schedule"] == 1


def test_the_local_cap_of_an_unlimited_policy(server: RetrydServer) -> None:
    d = Degraded(server, local_retry_budget=2)
    try:
        d.cut()
        always = policy_pb2.RetryPolicy(mode=policy_pb2.MODE_ALWAYS, backoff=policy_pb2.Backoff(initial_delay_ms=10, jitter_ratio=0))
        outs = []
        for step in (1, 2, 3):
            req = failed_step("py-degraded-cap", 1, step, always, code="SERVER")
            req.downstream = events_pb2.DOWNSTREAM_DECLINED
            outs.append(d.client.recover(req, timeout=10))
        assert [o.kind for o in outs] == ["retry", "retry", "delegate"]
        assert all(o.local for o in outs)
        last = outs[2].delegate
        assert last is not None and last.reason == events_pb2.DELEGATE_REASON_BUDGET_EXHAUSTED
        assert "the local cap" in last.detail
    finally:
        d.close()


def test_fail_closed(server: RetrydServer) -> None:
    d = Degraded(server, fail_closed=True)
    try:
        d.cut()
        with pytest.raises(grpc.RpcError) as err:
            d.client.recover(failed_step("py-degraded-closed", 1, 1, backoff_policy(20)), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert d.client.decisions() == {}
    finally:
        d.close()


def test_await_that_cannot_reattach_starts_locally(degraded: Degraded) -> None:
    """retryd scheduled the retry, then became unreachable while recover()
    awaited it: the client starts the retry itself after its due time plus
    the decision timeout; once retryd is back, the session's next report
    meets RETRY_PENDING for that retry, awaits it (retryd records the start)
    and reports again, so retryd's chain counts the retry the agent made."""
    d = degraded
    session = "py-degraded-reattach"
    result: List[retryd.Outcome] = []
    begin = time.monotonic()
    t = threading.Thread(target=lambda: result.append(d.client.recover(failed_step(session, 1, 1, backoff_policy(300)), timeout=20)))
    t.start()
    wait_awaiters(d.direct, session, 1)
    d.cut()
    t.join(20)
    out = result[0]
    assert out.local and out.kind == "retry" and out.schedule is not None and out.started is not None
    assert out.started.retry_id == out.schedule.retry_id and not out.schedule.retry_id.startswith("local-")
    assert time.monotonic() - begin >= 0.3 + TIMEOUT
    assert d.client.decisions() == {"schedule": 1, "start/local": 1}

    d.restore()
    d.wait_reachable()
    nxt = d.client.recover(failed_step(session, 1, 2, backoff_policy(300)), timeout=20)
    assert not nxt.local and nxt.schedule is not None and nxt.schedule.retry_number == 2
    assert kinds(list(d.direct.watch_events(pb.WatchEventsRequest(session_id=session, stop_at_end=True)))) == [
        "scheduled", "started", "scheduled", "started",
    ]


def test_a_lost_answer(degraded: Degraded) -> None:
    """retryd scheduled a report whose answer never reached the client,
    which decided locally; when retryd is back the next report meets
    RETRY_PENDING for that unknown retry, awaits it and reports again."""
    d = degraded
    session = "py-degraded-lost"
    d.cut()
    req = failed_step(session, 1, 1, backoff_policy(20))
    out = d.client.recover(req, timeout=10)
    assert out.local and out.kind == "retry"
    d.direct.failed_step(req)  # what the lost report did on the server
    d.restore()
    d.wait_reachable()
    nxt = d.client.recover(failed_step(session, 1, 2, backoff_policy(20)), timeout=10)
    assert not nxt.local and nxt.kind == "retry" and nxt.schedule is not None and nxt.schedule.retry_number == 2


def test_local_chains_are_bounded(server: RetrydServer) -> None:
    d = Degraded(server, local_chains=2)
    try:
        d.cut()

        def recover(session: str, step: int) -> int:
            out = d.client.recover(failed_step(session, 1, step, backoff_policy(5, max_retries=5)), timeout=10)
            assert out.local and out.schedule is not None
            return out.schedule.retry_number

        recover("py-bounded-a", 1)
        assert recover("py-bounded-a", 2) == 2
        recover("py-bounded-b", 1)
        recover("py-bounded-c", 1)  # the third chain pushes out a's
        assert recover("py-bounded-a", 3) == 1
    finally:
        d.close()


def test_async_local_decisions_and_cancellation(degraded: Degraded) -> None:
    """AsyncClient: the same local decisions; cancelling the task of a
    local wait cancels the local retry (nothing to cancel on a server)."""
    d = degraded

    async def main() -> None:
        async with retryd.AsyncClient(d.proxy.addr, credentials=retryd.insecure(), decision_timeout=TIMEOUT) as c:
            await c.step_succeeded(pb.StepSucceededRequest(session_id="py-degraded-async", turn=1, step=0))
            d.cut()
            out = await c.recover(failed_step("py-degraded-async", 1, 1, backoff_policy(50)), timeout=10)
            assert out.local and out.kind == "retry" and retryd.is_local(out.event)
            task = asyncio.create_task(c.recover(failed_step("py-degraded-async", 1, 2, backoff_policy(5_000))))
            deadline = time.monotonic() + 20
            while c.decisions().get("schedule/local", 0) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # until the local retry backs off
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(retryd.RecoverAbortedError) as aborted:
                await c.recover(failed_step("py-degraded-async", 1, 3, backoff_policy(5_000)), timeout=TIMEOUT + 1.5)
            assert aborted.value.cancelled is not None
            assert aborted.value.cancelled.reason == events_pb2.CANCEL_REASON_REQUESTED
            assert c.decisions() == {"schedule/local": 3}

    asyncio.run(main())


def test_a_load_of_agents_through_a_crash_and_restart(retryd_bin: str) -> None:
    """Eight agent loops report failures continuously; retryd (file store)
    is SIGKILLed mid-run and restarted 2 s later. While it is down the
    agents keep retrying on local decisions; no agent call fails for want
    of a decision; after the restart decisions come from retryd again."""
    state = Path(temp_dir())
    srv = RetrydServer(retryd_bin, "--store", f"file:{state}")
    proxy = TCPProxy(srv.addr)
    stop = threading.Event()
    phase = {"now": "before"}
    tallies: Dict[str, Dict[str, int]] = {p: {"server": 0, "local": 0} for p in ("before", "outage", "after")}
    lock = threading.Lock()
    errors: List[BaseException] = []
    client = retryd.Client(proxy.addr, credentials=retryd.insecure(), decision_timeout=TIMEOUT, reattach_initial=0.02, reattach_max=0.1)

    def agent(n: int) -> None:
        session = f"py-load-{n}"
        turn, step = 1, 0
        try:
            while not stop.is_set():
                # The model request of this step failed; a delegation (the
                # budget is used) ends the turn and the agent goes on.
                step += 1
                out = client.recover(failed_step(session, turn, step, backoff_policy(20, max_retries=4)), timeout=30)
                with lock:
                    tallies[phase["now"]]["local" if out.local else "server"] += 1
                if out.kind != "retry":
                    turn += 1
        except BaseException as e:  # noqa: BLE001 - collected and reported
            errors.append(e)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.5)
        phase["now"] = "outage"
        srv.kill()
        proxy.cut()
        time.sleep(2.0)
        srv = RetrydServer(retryd_bin, "--store", f"file:{state}")
        proxy.retarget(srv.addr)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if tallies["outage"]["server"] + tallies["after"]["server"] >= 16:
                    break
            time.sleep(0.05)
        phase["now"] = "after"
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(60)
        assert errors == [], f"agent calls failed: {errors[:3]}"
        print(f"decisions by phase (8 agents, retryd SIGKILLed and restarted): {tallies}; client counters {client.decisions()}")
        assert tallies["before"]["server"] > 0 and tallies["before"]["local"] == 0
        assert tallies["outage"]["local"] > 0, "no local decision while retryd was down"
        assert tallies["after"]["server"] > 0 and tallies["after"]["local"] == 0, "decisions did not come from retryd after the restart"
        srv.verify()
    finally:
        stop.set()
        client.close()
        proxy.close()
        srv.stop()
        shutil.rmtree(state, ignore_errors=True)
