"""recover() with plain keyword values, against a live retryd: Failure,
Policy and Backoff (dataclasses or dicts), code=, error= (an exception,
classified; one no rule knows is UNKNOWN), the message form still
working; bad input refused before anything is sent (TypeError,
ValueError); and retryd's refusals raised typed (LimitReachedError with
the delay retryd asked for, InvalidArgumentError, RetryPendingError),
each still a grpc.RpcError."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, Iterator

import grpc
import pytest

import retryd
from helpers import backoff_policy, failed_step, watch_session
from retrydtest import RetrydServer
from retryd.v1 import events_pb2, policy_pb2

POLICY = retryd.Policy(mode="normal", max_retries=2, backoff=retryd.Backoff(initial_delay_ms=20, jitter_ratio=0))


@pytest.fixture()
def client(server: RetrydServer) -> Iterator[retryd.Client]:
    with retryd.Client(server.addr, credentials=retryd.insecure()) as c:
        yield c


def scheduled(client: retryd.Client, session: str) -> events_pb2.RetryScheduled:
    evs = [e for e in watch_session(client, session) if e.WhichOneof("kind") == "scheduled"]
    assert evs, f"{session}: nothing scheduled"
    return evs[-1].scheduled


def test_keyword_recover_with_dataclasses(client: retryd.Client) -> None:
    session = "py-kw-dataclass"
    out = client.recover(
        session_id=session, turn=1, step=1, provider="anthropic",
        failure=retryd.Failure(code="RATE_LIMIT", http_status=429, message="slow down"),
        policy=POLICY, logical_turn_id="lt-kw-1", timeout=10,
    )
    assert out.retry and out.started is not None and not out.local
    s = scheduled(client, session)
    assert (s.turn, s.step, s.retry_number, s.max_retries, s.delay_ms) == (1, 1, 1, 2, 20)
    assert s.logical_turn_id == "lt-kw-1"
    assert s.failure.code == "RATE_LIMIT" and s.failure.http_status == 429 and s.failure.message == "slow down"
    assert s.policy.backoff.initial_delay_ms == 20


def test_keyword_recover_with_dicts_and_code(client: retryd.Client) -> None:
    session = "py-kw-dict"
    policy: Dict[str, Any] = {"mode": "normal", "max_retries": 1, "backoff": {"initial_delay_ms": 10, "jitter_ratio": 0}}
    first = client.recover(session_id=session, turn=1, step=1, provider="openai", code="SERVER", http_status=503,
                           policy=policy, timeout=10)
    assert first.retry and first.schedule is not None and first.schedule.max_retries == 1
    # The budget of one retry is spent: the next failure is delegated.
    second = client.recover(session_id=session, turn=1, step=2, provider="openai",
                            failure={"code": "SERVER", "http_status": 503}, policy=policy, timeout=10)
    assert second.kind == "delegate" and second.delegate is not None
    assert second.delegate.reason == events_pb2.DELEGATE_REASON_BUDGET_EXHAUSTED


def test_keyword_recover_classifies_an_exception(client: retryd.Client) -> None:
    """error= classifies what the model call raised: a transport failure
    by the shared rules (TRANSPORT, retried), an SDK-shaped status error
    by its status and body, and an exception no rule knows as UNKNOWN,
    which the default policy does not retry; none of them crashes."""

    class APIStatusError(Exception):
        def __init__(self) -> None:
            super().__init__("quota")
            self.status_code = 429
            self.body = {"error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "no credit"}}
            self.response = None

    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("a __str__ that raises")

    out = client.recover(session_id="py-kw-exc-1", turn=1, step=1, provider="openai",
                         error=ConnectionResetError("reset by peer"), policy=POLICY, timeout=10)
    assert out.retry
    assert scheduled(client, "py-kw-exc-1").failure.code == "TRANSPORT"
    assert retryd.Failure.from_exception(APIStatusError()).code == "QUOTA"
    for exc in (Weird(), KeyError("x"), ValueError("odd")):
        f = retryd.Failure.from_exception(exc)
        assert f.code == retryd.CODE_UNKNOWN, (exc, f)
    out = client.recover(session_id="py-kw-exc-2", turn=1, step=1, provider="openai", error=Weird(), timeout=10)
    assert out.kind == "delegate" and out.delegate is not None
    assert out.delegate.reason == events_pb2.DELEGATE_REASON_CODE_NOT_RETRYABLE


def test_message_form_still_works(client: retryd.Client) -> None:
    out = client.recover(failed_step("py-kw-message", 1, 1, backoff_policy(10)), timeout=10)
    assert out.retry


@pytest.mark.parametrize(
    "kw, exc, text",
    [
        (dict(turn=1, step=1, provider="p", code="X"), TypeError, "session_id"),
        (dict(session_id="s", turn="1", step=1, provider="p", code="X"), TypeError, "turn must be an int"),
        (dict(session_id="s", turn=-1, step=1, provider="p", code="X"), ValueError, "turn must be between"),
        (dict(session_id="", turn=1, step=1, provider="p", code="X"), ValueError, "session_id must not be empty"),
        (dict(session_id="s", turn=1, step=1, provider="p"), ValueError, "exactly one of failure, code and error"),
        (dict(session_id="s", turn=1, step=1, provider="p", code="X", error=OSError()), ValueError, "exactly one"),
        (dict(session_id="s", turn=1, step=1, provider="p", code="X", policy={"max_retry": 1}), ValueError, "unknown key"),
        (dict(session_id="s", turn=1, step=1, provider="p", code="X", policy={"mode": "sometimes"}), ValueError, "policy.mode"),
        (dict(session_id="s", turn=1, step=1, provider="p", code="X", policy=3), TypeError, "policy must be"),
        (dict(session_id="s", turn=1, step=1, provider="p", failure={"code": "X", "status": 1}), ValueError, "unknown key"),
        (dict(session_id="s", turn=1, step=1, provider="p", code="X", http_status=1000), ValueError, "http_status"),
        (dict(session_id="s", turn=1, step=1, provider="p", code="X", policy=POLICY, policy_name="n"), ValueError, "not both"),
    ],
)
def test_bad_input_is_refused_before_sending(client: retryd.Client, kw: Dict[str, Any], exc: type, text: str) -> None:
    with pytest.raises(exc, match=text):
        client.recover(**kw)


def test_message_and_keywords_together_is_a_type_error(client: retryd.Client) -> None:
    with pytest.raises(TypeError, match="keyword arguments"):
        client.recover(failed_step("py-kw-both", 1, 1, backoff_policy(10)), session_id="other")
    with pytest.raises(TypeError, match="FailedStepRequest"):
        client.recover("not a request")  # type: ignore[arg-type]


def test_invalid_argument_is_typed(client: retryd.Client) -> None:
    """What only the server judges comes back as InvalidArgumentError, a
    ValueError and a grpc.RpcError naming the bad field."""
    with pytest.raises(retryd.InvalidArgumentError) as err:
        client.recover(session_id="py-kw-invalid", turn=1, step=1, provider="openai", code="SERVER",
                       policy=retryd.Policy(mode="schedule", retryable_codes=["*"]), timeout=10)
    e = err.value
    assert isinstance(e, ValueError) and isinstance(e, grpc.RpcError)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "policy.retryable_codes[0]" in e.violations
    assert retryd.field_violations(e) == e.violations


def test_retry_pending_is_typed(client: retryd.Client) -> None:
    session = "py-kw-pending"
    first = client.failed_step(failed_step(session, 1, 1, backoff_policy(10_000)))
    rid = first.decision.schedule.retry_id
    try:
        with pytest.raises(retryd.RetryPendingError) as err:
            client.recover(session_id=session, turn=1, step=2, provider="anthropic", code="RATE_LIMIT", timeout=10)
        assert err.value.retry_id == rid == retryd.is_retry_pending(err.value)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        client.cancel_retry(rid)


def test_limit_reached_is_typed_with_its_delay(limited: RetrydServer, caplog: pytest.LogCaptureFixture) -> None:
    """A report refused by admission control, once the client has sent it
    again as often as it may, raises LimitReachedError with the bound and
    the delay retryd asked for (sync and async), and is logged."""
    caplog.set_level(logging.INFO, logger="retryd")
    with retryd.Client(limited.addr, credentials=retryd.insecure(), exhausted_retries=1) as c:
        first = c.failed_step(failed_step("py-kw-limit-1", 1, 1, backoff_policy(10_000))).decision.schedule
        try:
            with pytest.raises(retryd.LimitReachedError) as err:
                c.recover(session_id="py-kw-limit-2", turn=1, step=1, provider="openai", code="SERVER", timeout=10)
            e = err.value
            assert e.bound == "pending_retries" and e.reason == "LIMIT_REACHED"
            assert e.retry_after == 1.0 and e.delay is not None and e.delay.total_seconds() == 1.0
            assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert isinstance(e.__cause__, grpc.RpcError)
            msgs = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "retryd"]
            assert any(l == "INFO" and "sending it again in 1.000s" in m for l, m in msgs), msgs
            assert any(l == "WARNING" and "refused the report" in m and "LIMIT_REACHED" in m for l, m in msgs), msgs

            async def via_async() -> None:
                async with retryd.AsyncClient(limited.addr, credentials=retryd.insecure(), exhausted_retries=0) as ac:
                    with pytest.raises(retryd.LimitReachedError) as aerr:
                        await ac.recover(session_id="py-kw-limit-3", turn=1, step=1, provider="openai", code="SERVER")
                    assert aerr.value.retry_after == 1.0

            asyncio.run(via_async())
        finally:
            c.cancel_retry(first.retry_id)


def test_async_keyword_recover(server: RetrydServer) -> None:
    async def main() -> None:
        async with retryd.AsyncClient(server.addr, credentials=retryd.insecure()) as ac:
            out = await ac.recover(session_id="py-kw-async", turn=1, step=1, provider="openai",
                                   code="TIMEOUT", policy=POLICY, timeout=10)
            assert out.retry

    asyncio.run(main())


def test_policy_to_proto() -> None:
    p = retryd.Policy(mode="schedule", schedule=[100, 200], tail_delay_ms=500, retry_after_over_cap="honor",
                      backoff={"jitter": "full", "multiplier": 3}).to_proto()
    assert p.mode == policy_pb2.MODE_SCHEDULE and list(p.schedule) == [100, 200] and p.tail_delay_ms == 500
    assert p.retry_after_over_cap == policy_pb2.RETRY_AFTER_OVER_CAP_HONOR
    assert p.backoff.jitter == policy_pb2.JITTER_FULL and p.backoff.multiplier == 3
    assert not p.HasField("max_retries")
