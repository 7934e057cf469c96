"""retryd.openai: the openai SDK from PyPI, its retries off and retryd's
transport in its HTTP client, against a scripted provider on loopback and a
real retryd: the attempts that reached the provider, the delays retryd
logged (the provider's headers when it sent them), the delegate reasons,
and retryd verify afterwards."""

from __future__ import annotations

import asyncio
import uuid
from typing import List

import grpc
import openai
import pytest

import retryd
import retryd.openai as ro
from fakeprovider import (
    EMPTY,
    OVERLOADED,
    QUOTA,
    UNAVAILABLE,
    FakeProvider,
    complete,
    error,
    logged_decisions,
    rate_limited,
    stream_cut,
    stream_error,
)
from helpers import backoff_policy, failed_step, kinds, watch_session
from retrydtest import RetrydServer

MESSAGES: List[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def sdk(r: ro.Retrier, provider: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=provider.base_url + "/v1", api_key="test", **r.client_options())


def session() -> str:
    return "py-openai-" + uuid.uuid4().hex[:8]


def gaps_ms(provider: FakeProvider) -> List[float]:
    at = [r.at for r in provider.received]
    return [(b - a) * 1000 for a, b in zip(at, at[1:])]


def test_status_errors_and_an_empty_completion_are_retried_with_the_providers_delays(
        client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(UNAVAILABLE, rate_limited(retry_after_ms="300", retry_after="7"), rate_limited(retry_after="1"),
                      EMPTY, complete("hello")) as p:
        r = ro.Retrier(client, policy=backoff_policy(50, max_retries=5))
        with ro.session(s):
            out = sdk(r, p).chat.completions.create(model="gpt-test", messages=MESSAGES)
        assert out.choices[0].message.content == "hello"
        assert len(p.received) == 5
        gaps = gaps_ms(p)
    decided = logged_decisions(debug_server, s, 4)
    assert [(d.step, d.code, d.delay_ms) for d in decided] == [
        (1, "SERVER", 50), (2, "RATE_LIMIT", 300), (3, "RATE_LIMIT", 1000), (4, "EMPTY_RESPONSE", 400)]
    for gap, d in zip(gaps, decided):
        assert d.delay_ms is not None and gap >= d.delay_ms, (gaps, decided)
    assert kinds(watch_session(client, s))[-1] == "closed"


def test_insufficient_quota_is_delegated_to_the_sdks_error(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(QUOTA) as p:
        with ro.session(s), pytest.raises(openai.RateLimitError) as err:
            sdk(ro.Retrier(client, policy=backoff_policy(50)), p).chat.completions.create(model="m", messages=MESSAGES)
        assert len(p.received) == 1
    assert ro.delegate_reason(err.value) == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    assert err.value.response.headers[ro.HEADER_DELEGATE_REASON] == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    out = ro.outcome_of(err.value)
    assert out is not None and out.event.delegated.failure.code == "QUOTA"
    assert [(d.code, d.reason) for d in logged_decisions(debug_server, s, 1)] == [
        ("QUOTA", "DELEGATE_REASON_CODE_NOT_RETRYABLE")]


def test_x_should_retry_false_is_not_retried(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(error(503, {"error": {"message": "down", "type": "server_error"}}, x_should_retry="false")) as p:
        with ro.session(s), pytest.raises(openai.InternalServerError) as err:
            sdk(ro.Retrier(client, policy=backoff_policy(50)), p).chat.completions.create(model="m", messages=MESSAGES)
        assert len(p.received) == 1
    assert ro.delegate_reason(err.value) == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    assert [d.code for d in logged_decisions(debug_server, s, 1)] == ["PROVIDER_NO_RETRY"]


def test_a_stream_error_before_any_token_is_retried_unseen(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    overloaded = {"message": "Overloaded", "type": "overloaded_error", "code": "overloaded_error"}
    with FakeProvider(stream_error((), overloaded), stream_cut(()), complete("hello")) as p:
        r = ro.Retrier(client, policy=backoff_policy(40, max_retries=3))
        with ro.session(s):
            stream = sdk(r, p).chat.completions.create(model="m", messages=MESSAGES, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "hello"
        assert len(p.received) == 3 and all(x.stream for x in p.received)
    assert [(d.code, d.delay_ms) for d in logged_decisions(debug_server, s, 2)] == [("SERVER", 40), ("TRANSPORT", 80)]
    assert kinds(watch_session(client, s))[-1] == "closed"


def test_a_stream_error_after_tokens_is_delegated_replay_unsafe(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(stream_error(("Hel", "lo"), {"message": "Overloaded", "type": "overloaded_error"})) as p:
        seen: List[str] = []
        with ro.session(s), pytest.raises(openai.APIError) as err:
            for c in sdk(ro.Retrier(client, policy=backoff_policy(40)), p).chat.completions.create(
                    model="m", messages=MESSAGES, stream=True):
                seen.append(c.choices[0].delta.content or "")
        assert "".join(seen) == "Hello"
        assert len(p.received) == 1
    assert ro.delegate_reason(err.value) == "DELEGATE_REASON_REPLAY_UNSAFE"
    assert [(d.code, d.reason) for d in logged_decisions(debug_server, s, 1)] == [("SERVER", "DELEGATE_REASON_REPLAY_UNSAFE")]


def test_an_empty_stream_is_retried(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(EMPTY, complete("hi")) as p:
        with ro.session(s):
            stream = sdk(ro.Retrier(client, policy=backoff_policy(30)), p).chat.completions.create(
                model="m", messages=MESSAGES, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hi"
        assert len(p.received) == 2
    assert [(d.code, d.delay_ms) for d in logged_decisions(debug_server, s, 1)] == [("EMPTY_RESPONSE", 30)]


def test_the_async_sdk_streaming_and_not(debug_server: RetrydServer) -> None:
    s1, s2 = session(), session()
    with FakeProvider(OVERLOADED, complete("one"), stream_cut(()), stream_error(("x",), {"type": "server_error"})) as p:

        async def main() -> None:
            async with retryd.AsyncClient(debug_server.addr, credentials=retryd.insecure()) as ac:
                r = ro.Retrier(async_client=ac, policy=backoff_policy(20, max_retries=3))
                sdk = openai.AsyncOpenAI(base_url=p.base_url + "/v1", api_key="t", **r.async_client_options())
                with ro.session(s1):
                    out = await sdk.chat.completions.create(model="m", messages=MESSAGES)
                    assert out.choices[0].message.content == "one"
                with ro.session(s2):
                    seen = []
                    with pytest.raises(openai.APIError) as err:
                        async for c in await sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                            seen.append(c.choices[0].delta.content or "")
                    assert "".join(seen) == "x"
                    assert ro.delegate_reason(err.value) == "DELEGATE_REASON_REPLAY_UNSAFE"

        asyncio.run(main())
        assert len(p.received) == 4
    assert [(d.code, d.delay_ms) for d in logged_decisions(debug_server, s1, 1)] == [("SERVER", 20)]
    assert [(d.code, d.delay_ms, d.reason) for d in logged_decisions(debug_server, s2, 2)] == [
        ("TRANSPORT", 20, None), ("SERVER", None, "DELEGATE_REASON_REPLAY_UNSAFE")]


class Exploding:
    """An inner transport that raises what no classifier knows."""

    def handle_request(self, request: object) -> object:
        raise LookupError("a bug in a custom transport")

    def close(self) -> None:
        pass


def test_an_unknown_exception_is_reported_unknown_and_raised(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    import httpx2

    r = ro.Retrier(client, policy=backoff_policy(20))
    http = httpx2.Client(transport=r.transport(httpx2, Exploding()))
    # openai 3.0 wraps what its HTTP client raised in APIConnectionError.
    with ro.session(s), pytest.raises((LookupError, openai.APIConnectionError)) as err:
        openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="t", max_retries=0, http_client=http).chat.completions.create(
            model="m", messages=MESSAGES)
    assert isinstance(err.value, LookupError) or isinstance(err.value.__cause__, LookupError)
    assert ro.delegate_reason(err.value) == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    assert [d.code for d in logged_decisions(debug_server, s, 1)] == ["UNKNOWN"]


def test_a_retryd_refusal_raises_with_the_delay_it_asked_for(limited: RetrydServer) -> None:
    with retryd.Client(limited.addr, credentials=retryd.insecure(), exhausted_retries=0) as c:
        held = c.failed_step(failed_step("py-openai-hold", 1, 1, backoff_policy(10_000))).decision.schedule
        try:
            with FakeProvider(UNAVAILABLE) as p:
                with ro.session("py-openai-refused"), pytest.raises((ro.LimitReachedError, openai.APIConnectionError)) as err:
                    sdk(ro.Retrier(c, policy=backoff_policy(50)), p).chat.completions.create(model="m", messages=MESSAGES)
                assert len(p.received) == 1
        finally:
            c.cancel_retry(held.retry_id)
    e = ro.decision_error(err.value)
    assert isinstance(e, ro.LimitReachedError)
    # The same refusal type recover() raises, and the gRPC error it was.
    assert isinstance(e, retryd.LimitReachedError) and isinstance(e, grpc.RpcError)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.retry_after == 1.0
    assert e.reason == "LIMIT_REACHED" and e.bound == "pending_retries"
    assert e.delay is not None and e.delay.total_seconds() == 1.0
    assert e.classification.failure.code == "SERVER" and e.response is not None and e.response.status_code == 503
