"""retryd.litellm: litellm.completion and acompletion (PyPI) with their
retries off and an openai client carrying retryd's transport, against a
scripted provider on loopback and a real retryd."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, List

import litellm
import litellm.exceptions
import pytest

import retryd
import retryd.litellm as rlt
from fakeprovider import QUOTA, UNAVAILABLE, FakeProvider, complete, logged_decisions, rate_limited, stream_error
from helpers import backoff_policy, kinds, watch_session
from retrydtest import RetrydServer

MESSAGES: List[Any] = [{"role": "user", "content": "hi"}]


def session() -> str:
    return "py-litellm-" + uuid.uuid4().hex[:8]


def test_completion_is_retried_on_retryds_decisions(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(UNAVAILABLE, rate_limited(retry_after_ms="300"), complete("hi")) as p:
        r = rlt.Retrier(client, policy=backoff_policy(50, max_retries=3))
        with rlt.session(s):
            resp = litellm.completion(model="openai/m", messages=MESSAGES,
                                      **r.completion_kwargs(api_base=p.base_url + "/v1", api_key="t"))
        assert resp.choices[0].message.content == "hi"
        assert len(p.received) == 3
        at = [x.at for x in p.received]
    decided = logged_decisions(debug_server, s, 2)
    assert [(d.step, d.code, d.delay_ms) for d in decided] == [(1, "SERVER", 50), (2, "RATE_LIMIT", 300)]
    assert (at[2] - at[1]) * 1000 >= 300
    assert kinds(watch_session(client, s))[-1] == "closed"


def test_a_delegation_reaches_litellms_exception(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(QUOTA) as p:
        r = rlt.Retrier(client, policy=backoff_policy(50))
        with rlt.session(s), pytest.raises(litellm.exceptions.RateLimitError) as err:
            litellm.completion(model="openai/m", messages=MESSAGES, **r.completion_kwargs(api_base=p.base_url + "/v1", api_key="t"))
        assert len(p.received) == 1
    assert rlt.delegate_reason(err.value) == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    assert [d.code for d in logged_decisions(debug_server, s, 1)] == ["QUOTA"]


def test_an_async_stream_with_an_error_before_tokens(debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(stream_error((), {"message": "busy", "type": "server_error"}), complete("streamed")) as p:

        async def main() -> str:
            async with retryd.AsyncClient(debug_server.addr, credentials=retryd.insecure()) as ac:
                r = rlt.Retrier(async_client=ac, policy=backoff_policy(40))
                with rlt.session(s):
                    stream = await litellm.acompletion(model="openai/m", messages=MESSAGES, stream=True,
                                                       **r.acompletion_kwargs(api_base=p.base_url + "/v1", api_key="t"))
                    text = ""
                    async for chunk in stream:
                        text += chunk.choices[0].delta.content or ""
                    return text

        assert asyncio.run(main()) == "streamed"
        assert len(p.received) == 2
    assert [(d.code, d.delay_ms) for d in logged_decisions(debug_server, s, 1)] == [("SERVER", 40)]
