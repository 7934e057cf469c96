"""The error helpers decode retryd's google.rpc details from real server
errors (grpc-status-details-bin)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Iterator, List

import grpc
import pytest

import retryd
from helpers import backoff_policy, failed_step
from retrydtest import RetrydServer
from retryd.v1 import retry_service_pb2 as pb


@pytest.fixture()
def client(server: RetrydServer) -> Iterator[retryd.Client]:
    with retryd.Client(server.addr, credentials=retryd.insecure()) as c:
        yield c


def test_retry_pending_names_the_retry(client: retryd.Client) -> None:
    session = "py-err-pending"
    sc = client.failed_step(failed_step(session, 1, 1, backoff_policy(10_000))).decision.schedule
    with pytest.raises(grpc.RpcError) as err:
        client.recover(failed_step(session, 2, 2, backoff_policy(10_000)), timeout=5)
    e = err.value
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert retryd.is_retry_pending(e) == sc.retry_id
    assert retryd.error_reason(e) == retryd.Reason.RETRY_PENDING
    info = retryd.error_info(e)
    assert info is not None and info.domain == retryd.ERROR_DOMAIN and info.metadata["retry_id"] == sc.retry_id
    assert retryd.field_violations(e) is None and retryd.retry_delay(e) is None
    assert retryd.is_limit_reached(e) is None and retryd.is_provider_not_allowed(e) is None

    # Seen through wrapping, as an agent framework re-raises it.
    try:
        try:
            raise e
        except grpc.RpcError as inner:
            raise RuntimeError("model call failed") from inner
    except RuntimeError as wrapped:
        assert retryd.is_retry_pending(wrapped) == sc.retry_id

    # STALE_STEP: an older report.
    with pytest.raises(grpc.RpcError) as stale:
        client.failed_step(failed_step(session, 0, 9, backoff_policy(10_000)))
    assert retryd.error_reason(stale.value) == retryd.Reason.STALE_STEP
    assert retryd.is_retry_pending(stale.value) is None
    client.cancel_retry(sc.retry_id)


def test_field_violations(client: retryd.Client) -> None:
    bad = pb.FailedStepRequest(session_id="py-err-invalid", turn=1, step=1, provider="anthropic")
    bad.failure.code = ""
    bad.policy.backoff.initial_delay_ms = 0
    bad.policy.backoff.multiplier = 0.5
    with pytest.raises(grpc.RpcError) as err:
        client.failed_step(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    fv = retryd.field_violations(err.value)
    assert fv is not None
    assert {"failure.code", "policy.backoff.multiplier"} <= set(fv), fv
    assert all(fv.values())
    assert retryd.error_reason(err.value) is None


def test_errors_that_are_not_grpc() -> None:
    for e in (None, ValueError("x"), TimeoutError()):
        assert retryd.is_retry_pending(e) is None
        assert retryd.error_reason(e) is None
        assert retryd.field_violations(e) is None
        assert retryd.retry_delay(e) is None
        assert retryd.status_code(e) is None


@pytest.fixture(scope="module")
def limited(retryd_bin: str) -> Iterator[RetrydServer]:
    """A retryd that holds one pending retry at most, with one awaiter each."""
    srv = RetrydServer(retryd_bin, "--max-pending-retries", "1", "--max-awaiters-per-retry", "1")
    try:
        yield srv
    finally:
        srv.stop()


def test_limit_reached_with_retry_info(limited: RetrydServer) -> None:
    """Admission control: RESOURCE_EXHAUSTED, LIMIT_REACHED naming the full
    bound, and RetryInfo's delay; the same through the AsyncClient. (These
    clients return the first refusal: exhausted_retries=0.)"""
    with retryd.Client(limited.addr, credentials=retryd.insecure(), exhausted_retries=0) as c:
        first = c.failed_step(failed_step("py-limit-1", 1, 1, backoff_policy(10_000))).decision.schedule
        with pytest.raises(grpc.RpcError) as err:
            c.failed_step(failed_step("py-limit-2", 1, 1, backoff_policy(10_000)))
        e = err.value
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert retryd.is_limit_reached(e) == "pending_retries"
        delay = retryd.retry_delay(e)
        assert delay is not None and delay.total_seconds() == 1.0
        ri = retryd.retry_info(e)
        assert ri is not None and ri.retry_delay.seconds == 1

        async def via_async() -> None:
            async with retryd.AsyncClient(limited.addr, credentials=retryd.insecure(), exhausted_retries=0) as ac:
                with pytest.raises(grpc.RpcError) as aerr:
                    await ac.failed_step(failed_step("py-limit-3", 1, 1, backoff_policy(10_000)))
                assert retryd.is_limit_reached(aerr.value) == "pending_retries"
                assert retryd.retry_delay(aerr.value) == delay

        asyncio.run(via_async())
        c.cancel_retry(first.retry_id)


def test_a_refusal_is_sent_again_after_its_retry_info(limited: RetrydServer) -> None:
    """By default a FailedStep refused by admission control is sent again
    after the RetryInfo delay (1 s), and succeeds once the bound has room;
    with no room within the call's timeout the refusal is returned."""
    with retryd.Client(limited.addr, credentials=retryd.insecure()) as c:
        first = c.failed_step(failed_step("py-again-1", 1, 1, backoff_policy(10_000))).decision.schedule
        with pytest.raises(grpc.RpcError) as err:
            c.failed_step(failed_step("py-again-2", 1, 1, backoff_policy(10_000)), timeout=0.5)
        assert retryd.is_limit_reached(err.value) == "pending_retries"
        threading.Timer(0.3, lambda: c.cancel_retry(first.retry_id)).start()
        begin = time.monotonic()
        second = c.failed_step(failed_step("py-again-2", 1, 1, backoff_policy(10_000)), timeout=10)
        assert second.decision.WhichOneof("outcome") == "schedule"
        assert time.monotonic() - begin >= 1.0, "sent again before the RetryInfo delay"
        c.cancel_retry(second.decision.schedule.retry_id)


def test_await_waits_out_a_full_awaiter_bound(limited: RetrydServer) -> None:
    """One awaiter per retry: a second await_retry is refused with
    RESOURCE_EXHAUSTED and RetryInfo, waits that long, attaches again and
    gets the same start."""
    with retryd.Client(limited.addr, credentials=retryd.insecure()) as c:
        sc = c.failed_step(failed_step("py-awaiters-1", 1, 1, backoff_policy(300))).decision.schedule
        terms: List[pb.AwaitRetryResponse] = []
        threads = [threading.Thread(target=lambda: terms.append(c.await_retry(sc.retry_id, timeout=10))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert [t.WhichOneof("message") for t in terms] == ["started", "started"]
        assert terms[0].started.started_at == terms[1].started.started_at
