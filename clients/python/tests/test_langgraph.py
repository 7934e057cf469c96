"""retryd.langgraph: a LangGraph (PyPI) graph whose node calls the openai
SDK (its retries off) against a scripted provider on loopback, retried by
LangGraph's own RetryPolicy on retryd's decisions: the attempts, the delays
retryd logged, delegations, an exception no classifier knows, async
graphs, and retryd verify afterwards."""

from __future__ import annotations

import asyncio
import uuid
from typing import List, TypedDict, cast

import openai
import pytest
from langgraph.graph import END, START, StateGraph

import retryd
import retryd.langgraph as rl
from fakeprovider import QUOTA, UNAVAILABLE, FakeProvider, complete, logged_decisions, rate_limited
from helpers import backoff_policy, kinds, watch_session
from retrydtest import RetrydServer


class State(TypedDict, total=False):
    question: str
    answer: str


def session() -> str:
    return "py-langgraph-" + uuid.uuid4().hex[:8]


def graph(r: rl.Retrier, p: FakeProvider, calls: List[int]) -> "StateGraph[State]":
    sdk = openai.OpenAI(base_url=p.base_url + "/v1", api_key="t", max_retries=0)

    def call_model(state: State) -> State:
        calls.append(1)
        out = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": state["question"]}])
        return {"answer": out.choices[0].message.content or ""}

    b: StateGraph[State] = StateGraph(State)
    b.add_node("model", r.node(call_model), retry_policy=r.retry_policy())
    b.add_edge(START, "model")
    b.add_edge("model", END)
    return b


def test_a_node_is_retried_by_langgraph_on_retryds_decisions(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    calls: List[int] = []
    with FakeProvider(UNAVAILABLE, rate_limited(retry_after_ms="300"), complete("hi")) as p:
        r = rl.Retrier(client, provider="openai", policy=backoff_policy(50, max_retries=3))
        out = graph(r, p, calls).compile().invoke({"question": "q"}, {"configurable": {"thread_id": s}})
        assert out["answer"] == "hi"
        assert len(p.received) == 3 and len(calls) == 3
        at = [x.at for x in p.received]
    decided = logged_decisions(debug_server, s, 2)
    assert [(d.step, d.code, d.delay_ms) for d in decided] == [(1, "SERVER", 50), (2, "RATE_LIMIT", 300)]
    assert (at[1] - at[0]) * 1000 >= 50 and (at[2] - at[1]) * 1000 >= 300
    assert kinds(watch_session(client, s))[-1] == "closed"


def test_a_delegation_raises_the_nodes_exception(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    calls: List[int] = []
    with FakeProvider(QUOTA) as p:
        r = rl.Retrier(client, provider="openai", policy=backoff_policy(50))
        with pytest.raises(openai.RateLimitError) as err:
            graph(r, p, calls).compile().invoke({"question": "q"}, {"configurable": {"thread_id": s}})
        assert len(p.received) == 1 and len(calls) == 1
    assert rl.delegate_reason(err.value) == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    assert [d.code for d in logged_decisions(debug_server, s, 1)] == ["QUOTA"]


def test_an_unknown_exception_is_unknown_and_not_retried(client: retryd.Client, debug_server: RetrydServer) -> None:
    s = session()
    calls: List[int] = []
    r = rl.Retrier(client, provider="openai", policy=backoff_policy(20))

    def broken(state: State) -> State:
        calls.append(1)
        raise KeyError("no such tool")

    b: StateGraph[State] = StateGraph(State)
    b.add_node("model", r.node(broken), retry_policy=r.retry_policy())
    b.add_edge(START, "model")
    with pytest.raises(KeyError):
        b.compile().invoke({"question": "q"}, {"configurable": {"thread_id": s}})
    assert len(calls) == 1
    assert [(d.code, d.reason) for d in logged_decisions(debug_server, s, 1)] == [("UNKNOWN", "DELEGATE_REASON_CODE_NOT_RETRYABLE")]


def test_an_async_graph(debug_server: RetrydServer) -> None:
    s = session()
    with FakeProvider(UNAVAILABLE, rate_limited(retry_after="1"), complete("async")) as p:

        async def main() -> State:
            async with retryd.AsyncClient(debug_server.addr, credentials=retryd.insecure()) as ac:
                r = rl.Retrier(async_client=ac, provider="openai", policy=backoff_policy(30, max_retries=3))
                sdk = openai.AsyncOpenAI(base_url=p.base_url + "/v1", api_key="t", max_retries=0)

                async def call_model(state: State) -> State:
                    out = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
                    return {"answer": out.choices[0].message.content or ""}

                b: StateGraph[State] = StateGraph(State)
                b.add_node("model", r.node(call_model), retry_policy=r.retry_policy())
                b.add_edge(START, "model")
                result = await b.compile().ainvoke({"question": "q"}, {"configurable": {"thread_id": s}})
                return cast(State, result)

        assert asyncio.run(main())["answer"] == "async"
        assert len(p.received) == 3
    assert [(d.code, d.delay_ms) for d in logged_decisions(debug_server, s, 2)] == [("SERVER", 30), ("RATE_LIMIT", 1000)]
