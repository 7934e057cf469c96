"""retryd.AsyncClient (grpc.aio) against a live retryd: the RPCs, recover's
outcomes, re-attach, several awaiters, and cancelling a waiting recover()
by cancelling its task, by asyncio.timeout and by its own timeout."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, List, Sequence

import grpc
import pytest

import retryd
from helpers import backoff_policy, failed_step, kinds
from retrydtest import RetrydServer, TCPProxy
from retryd.v1 import events_pb2, retry_service_pb2 as pb


def run(server: RetrydServer, body: Callable[[retryd.AsyncClient], Awaitable[None]], addr: str = "") -> None:
    async def main() -> None:
        async with retryd.AsyncClient(
            addr or server.addr, credentials=retryd.insecure(), reattach_initial=0.02, reattach_max=0.1, decision_timeout=30
        ) as c:
            await body(c)

    asyncio.run(main())


async def events_of(c: retryd.AsyncClient, session: str) -> List[events_pb2.Event]:
    return [e async for e in c.watch_events(pb.WatchEventsRequest(session_id=session, stop_at_end=True), timeout=10)]


async def awaiting(c: retryd.AsyncClient, session: str) -> None:
    """Waits until recover() is attached to its pending retry."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            chains: Sequence[pb.Chain] = (await c.get_chains(session)).chains
        except grpc.RpcError:
            chains = []
        if chains and chains[0].latest.awaiters >= 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{session}: recover never waited")


async def assert_cancelled_on_server(c: retryd.AsyncClient, session: str) -> str:
    latest = (await c.get_chains(session)).chains[0].latest
    assert latest.status == pb.RETRY_STATUS_CANCELLED
    assert latest.cancelled.reason == events_pb2.CANCEL_REASON_REQUESTED
    return str(latest.retry_id)


def test_async_every_rpc(server: RetrydServer) -> None:
    async def body(c: retryd.AsyncClient) -> None:
        session = "py-async-rpc"
        sc = (await c.failed_step(failed_step(session, 1, 1, backoff_policy(30)))).decision.schedule
        assert sc.retry_number == 1
        assert [ch.retries for ch in (await c.get_chains(session)).chains] == [1]
        term = await c.await_retry(sc.retry_id, timeout=10)
        assert term.WhichOneof("message") == "started" and term.started.retry_id == sc.retry_id
        closed = await c.step_succeeded(pb.StepSucceededRequest(session_id=session, turn=2, step=2))
        assert [x.reason for x in closed.closed] == [events_pb2.CLOSE_REASON_SUCCEEDED]
        r2 = (await c.failed_step(failed_step(session, 3, 3, backoff_policy(5_000)))).decision.schedule
        assert [r.status for r in (await c.cancel_retry(r2.retry_id)).retries] == [pb.RETRY_STATUS_CANCELLED]
        r3 = (await c.failed_step(failed_step(session, 4, 4, backoff_policy(5_000)))).decision.schedule
        assert [r.retry_id for r in (await c.cancel_session(session)).retries] == [r3.retry_id]
        assert (await c.get_provider_state("py-fleet-circuit")).protected
        assert kinds(await events_of(c, session)) == [
            "scheduled", "started", "closed", "scheduled", "cancelled", "closed", "scheduled", "cancelled", "closed",
        ]
        with pytest.raises(grpc.RpcError) as err:
            await c.await_retry("no-such-retry", timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

    run(server, body)


def test_async_recover_outcomes(server: RetrydServer) -> None:
    async def body(c: retryd.AsyncClient) -> None:
        session = "py-async-recover"
        begin = time.monotonic()
        out = await c.recover(failed_step(session, 1, 1, backoff_policy(100)), timeout=10)
        assert out.kind == "retry" and time.monotonic() - begin >= 0.1
        assert out.started is not None and out.schedule is not None and out.started.retry_id == out.schedule.retry_id
        out = await c.recover(failed_step(session, 2, 2, backoff_policy(100), code="INVALID_REQUEST"), timeout=10)
        assert out.kind == "delegate" and out.delegate is not None
        assert out.delegate.reason == events_pb2.DELEGATE_REASON_CODE_NOT_RETRYABLE

    run(server, body)


def test_async_task_cancel_cancels_the_retry(server: RetrydServer) -> None:
    """task.cancel() while recover() waits: the retry is cancelled on the
    server and the task ends cancelled."""

    async def body(c: retryd.AsyncClient) -> None:
        session = "py-async-task-cancel"
        task = asyncio.create_task(c.recover(failed_step(session, 1, 1, backoff_policy(10_000))))
        await awaiting(c, session)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await assert_cancelled_on_server(c, session)

    run(server, body)


def test_async_timeout_context_cancels_the_retry(server: RetrydServer) -> None:
    """asyncio.timeout around recover(): TimeoutError as usual, and the
    retry is cancelled on the server."""

    async def body(c: retryd.AsyncClient) -> None:
        session = "py-async-timeout-ctx"
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.5):
                await c.recover(failed_step(session, 1, 1, backoff_policy(10_000)))
        await assert_cancelled_on_server(c, session)

    run(server, body)


def test_async_recover_timeout_cancels_the_retry(server: RetrydServer) -> None:
    async def body(c: retryd.AsyncClient) -> None:
        session = "py-async-timeout"
        with pytest.raises(retryd.RecoverAbortedError) as aborted:
            await c.recover(failed_step(session, 1, 1, backoff_policy(10_000)), timeout=1.5)
        err = aborted.value
        assert err.reason == "timeout" and err.cancel_error is None
        assert err.cancelled is not None and err.cancelled.reason == events_pb2.CANCEL_REASON_REQUESTED
        assert await assert_cancelled_on_server(c, session) == err.schedule.retry_id

    run(server, body)


def test_async_several_awaiters(server: RetrydServer) -> None:
    async def body(c: retryd.AsyncClient) -> None:
        session = "py-async-awaiters"
        sc = (await c.failed_step(failed_step(session, 1, 1, backoff_policy(300)))).decision.schedule
        terms = await asyncio.gather(*(c.await_retry(sc.retry_id, timeout=10) for _ in range(4)))
        assert {t.WhichOneof("message") for t in terms} == {"started"}
        assert len({t.started.started_at.ToNanoseconds() for t in terms}) == 1
        assert kinds(await events_of(c, session)) == ["scheduled", "started"]

    run(server, body)


def test_async_reattach_through_a_cut_connection(server: RetrydServer) -> None:
    proxy = TCPProxy(server.addr)

    async def body(c: retryd.AsyncClient) -> None:
        session = "py-async-reattach"
        task = asyncio.create_task(c.recover(failed_step(session, 1, 1, backoff_policy(1_500)), timeout=30))
        for n in (1, 2):
            deadline = time.monotonic() + 10
            while proxy.accepted < n and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert proxy.accepted >= n, f"recover did not connect again ({proxy.accepted} connections)"
            await asyncio.sleep(0.1)
            assert proxy.cut() >= 1
        out = await task
        assert out.kind == "retry" and out.started is not None
        assert proxy.accepted >= 3

    try:
        run(server, body, addr=proxy.addr)
    finally:
        proxy.close()
    with retryd.Client(server.addr, credentials=retryd.insecure()) as direct:
        events = list(direct.watch_events(pb.WatchEventsRequest(session_id="py-async-reattach", stop_at_end=True)))
        assert kinds(events) == ["scheduled", "started"]
