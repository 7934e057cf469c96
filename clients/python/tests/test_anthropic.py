"""retryd.anthropic: the anthropic SDK from PyPI, its retries off and
retryd's transport in its HTTP client, against a scripted provider on
loopback and a real retryd: 529 overloaded_error, rate limits with the
provider's delays, an ``event: error`` inside a stream before and after
text, the async SDK, and retryd verify afterwards."""

from __future__ import annotations

import asyncio
import uuid
from typing import List

import anthropic
import httpx2
import pytest

import retryd
import retryd.anthropic as ra
from fakeprovider import OVERLOADED, FakeProvider, Reply, complete, error, logged_decisions, stream_cut, stream_error
from helpers import backoff_policy, kinds, watch_session
from retrydtest import RetrydServer

MESSAGES: List[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
OVERLOADED_EVENT = {"type": "overloaded_error", "message": "Overloaded"}


def rate_limited(**headers: str) -> Reply:
    return error(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"}},
                 **headers)


def sdk(r: ra.Retrier, p: FakeProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=p.base_url, api_key="test", **r.client_options())


def session() -> str:
    return "py-anthropic-" + uuid.uuid4().hex[:8]


def text_of(m: anthropic.types.Message) -> str:
    return "".join(b.text for b in m.content if b.type == "text")


def test_overloaded_and_rate_limits_are_retried_with_the_providers_delays(
        client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(OVERLOADED, rate_limited(retry_after_ms="250"), rate_limited(retry_after="1"), complete("hello")) as p:
        with ra.session(s):
            m = sdk(ra.Retrier(client, policy=backoff_policy(60, max_retries=3)), p).messages.create(
                model="claude-test", max_tokens=16, messages=MESSAGES)
        assert text_of(m) == "hello"
        assert len(p.received) == 4 and all(x.path == "/v1/messages" for x in p.received)
        at = [x.at for x in p.received]
    decided = logged_decisions(debug_server, s, 3)
    assert [(d.step, d.code, d.delay_ms) for d in decided] == [(1, "SERVER", 60), (2, "RATE_LIMIT", 250), (3, "RATE_LIMIT", 1000)]
    for (a, b), d in zip(zip(at, at[1:]), decided):
        assert d.delay_ms is not None and (b - a) * 1000 >= d.delay_ms
    assert kinds(watch_session(client, s))[-1] == "closed"


def test_an_error_event_before_text_is_retried_unseen(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(stream_error((), OVERLOADED_EVENT), complete("hello")) as p:
        with ra.session(s):
            with sdk(ra.Retrier(client, policy=backoff_policy(30)), p).messages.stream(
                    model="m", max_tokens=16, messages=MESSAGES) as stream:
                text = "".join(stream.text_stream)
        assert text == "hello" and len(p.received) == 2
    assert [(d.code, d.delay_ms) for d in logged_decisions(debug_server, s, 1)] == [("SERVER", 30)]
    assert kinds(watch_session(client, s))[-1] == "closed"


def test_an_error_event_after_text_is_delegated_replay_unsafe(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(stream_error(("Hel", "lo"), OVERLOADED_EVENT)) as p:
        seen: List[str] = []
        with ra.session(s), pytest.raises(anthropic.APIStatusError) as err:
            with sdk(ra.Retrier(client, policy=backoff_policy(30)), p).messages.stream(
                    model="m", max_tokens=16, messages=MESSAGES) as stream:
                for t in stream.text_stream:
                    seen.append(t)
        assert "".join(seen) == "Hello" and len(p.received) == 1
    assert ra.delegate_reason(err.value) == "DELEGATE_REASON_REPLAY_UNSAFE"
    assert [(d.code, d.reason) for d in logged_decisions(debug_server, s, 1)] == [("SERVER", "DELEGATE_REASON_REPLAY_UNSAFE")]


def test_a_billing_error_is_delegated(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(error(402, {"type": "error", "error": {"type": "billing_error", "message": "no credit"}})) as p:
        with ra.session(s), pytest.raises(anthropic.APIStatusError) as err:
            sdk(ra.Retrier(client, policy=backoff_policy(30)), p).messages.create(model="m", max_tokens=16, messages=MESSAGES)
        assert len(p.received) == 1
    assert err.value.status_code == 402
    assert ra.delegate_reason(err.value) == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    assert [d.code for d in logged_decisions(debug_server, s, 1)] == ["QUOTA"]


def test_the_async_sdk(debug_server: RetrydServer) -> None:
    s1, s2 = session(), session()
    with FakeProvider(OVERLOADED, complete("one"), stream_cut(("a",)), ) as p:

        async def main() -> None:
            async with retryd.AsyncClient(debug_server.addr, credentials=retryd.insecure()) as ac:
                r = ra.Retrier(async_client=ac, policy=backoff_policy(20))
                sdk = anthropic.AsyncAnthropic(base_url=p.base_url, api_key="t", **r.async_client_options())
                with ra.session(s1):
                    m = await sdk.messages.create(model="m", max_tokens=16, messages=MESSAGES)
                    assert text_of(m) == "one"
                with ra.session(s2):
                    # anthropic 2.0 passes the HTTP client's read error on as it is.
                    with pytest.raises((anthropic.APIConnectionError, httpx2.ReadError)) as err:
                        async with sdk.messages.stream(model="m", max_tokens=16, messages=MESSAGES) as stream:
                            async for _ in stream.text_stream:
                                pass
                    assert ra.delegate_reason(err.value) == "DELEGATE_REASON_REPLAY_UNSAFE"

        asyncio.run(main())
        assert len(p.received) == 3
    assert [(d.code, d.delay_ms) for d in logged_decisions(debug_server, s1, 1)] == [("SERVER", 20)]
    assert [(d.code, d.reason) for d in logged_decisions(debug_server, s2, 1)] == [("TRANSPORT", "DELEGATE_REASON_REPLAY_UNSAFE")]
