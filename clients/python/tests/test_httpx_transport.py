"""The httpx transport against a scripted fake provider on loopback and a
real retryd: the provider attempts, the delays retryd decided (from its
event log), a delegation returned to the caller, and a transport error."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Tuple

import httpx
import pytest

import retryd
from helpers import backoff_policy, kinds, watch_session
from retrydtest import RetrydServer
from retryd.httpx_transport import AsyncRetrydTransport, RetrydTransport, outcome_of
from retryd.v1 import events_pb2

Reply = Tuple[int, Dict[str, str], Any]


class FakeProvider:
    """Answers each request with the next scripted reply and records what
    it received."""

    def __init__(self, script: List[Reply]) -> None:
        self.script = list(script)
        self.received: List[bytes] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                provider.received.append(body)
                status, headers, payload = provider.script.pop(0)
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/chat/completions"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def client(server: RetrydServer) -> Iterator[retryd.Client]:
    with retryd.Client(server.addr, credentials=retryd.insecure()) as c:
        yield c


REQUEST = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


def test_retries_until_the_provider_answers(client: retryd.Client) -> None:
    session = "py-httpx-success"
    provider = FakeProvider([
        (503, {}, {"error": {"type": "server_error", "message": "busy"}}),
        (429, {"retry-after-ms": "150"}, {"error": {"type": "rate_limit_error", "message": "slow down"}}),
        (200, {}, {"choices": [{"message": {"content": "hello"}}]}),
    ])
    try:
        transport = RetrydTransport(client, session_id=session, provider="openai", policy=backoff_policy(50, max_retries=3))
        begin = time.monotonic()
        with httpx.Client(transport=transport) as http:
            resp = http.post(provider.url, json=REQUEST)
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "hello"
        assert time.monotonic() - begin >= 0.2
        assert [json.loads(b) for b in provider.received] == [REQUEST] * 3
    finally:
        provider.close()
    events = watch_session(client, session)
    assert kinds(events) == ["scheduled", "started", "scheduled", "started", "closed"]
    first, second = events[0].scheduled, events[2].scheduled
    assert (first.failure.code, first.failure.http_status, first.delay_ms, first.delay_source) == (
        "SERVER", 503, 50, events_pb2.DELAY_SOURCE_BACKOFF)
    assert (second.failure.code, second.delay_ms, second.delay_source) == (
        "RATE_LIMIT", 150, events_pb2.DELAY_SOURCE_PROVIDER_RETRY_AFTER)
    assert [(first.step, second.step)] == [(1, 2)]
    assert events[4].closed.reason == events_pb2.CLOSE_REASON_SUCCEEDED


def test_a_delegation_returns_the_providers_response(client: retryd.Client) -> None:
    provider = FakeProvider([(429, {}, {"error": {"type": "insufficient_quota", "code": "insufficient_quota"}})])
    try:
        transport = RetrydTransport(client, session_id="py-httpx-quota", provider="openai", policy=backoff_policy(50))
        with httpx.Client(transport=transport) as http:
            resp = http.post(provider.url, json=REQUEST)
        assert resp.status_code == 429 and resp.json()["error"]["code"] == "insufficient_quota"
        out = outcome_of(resp)
        assert out is not None and out.kind == "delegate" and out.delegate is not None
        assert out.delegate.reason == events_pb2.DELEGATE_REASON_CODE_NOT_RETRYABLE
        assert out.event.delegated.failure.code == "QUOTA"
        assert len(provider.received) == 1
    finally:
        provider.close()


def test_a_transport_error_is_retried_then_raised(client: retryd.Client) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    transport = RetrydTransport(client, session_id="py-httpx-refused", provider="openai", policy=backoff_policy(20, max_retries=1))
    with httpx.Client(transport=transport) as http:
        with pytest.raises(httpx.ConnectError) as err:
            http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=REQUEST)
    out = outcome_of(err.value)
    assert out is not None and out.delegate is not None
    assert out.delegate.reason == events_pb2.DELEGATE_REASON_BUDGET_EXHAUSTED
    events = watch_session(client, "py-httpx-refused")
    assert kinds(events) == ["scheduled", "started", "delegated", "closed"]
    assert events[0].scheduled.failure.code == "TRANSPORT"


def test_the_async_transport(server: RetrydServer) -> None:
    provider = FakeProvider([
        (529, {}, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        (200, {}, {"content": [{"type": "text", "text": "hi"}]}),
    ])

    async def main() -> None:
        async with retryd.AsyncClient(server.addr, credentials=retryd.insecure()) as c:
            transport = AsyncRetrydTransport(c, session_id="py-httpx-async", provider="anthropic", policy=backoff_policy(30))
            async with httpx.AsyncClient(transport=transport) as http:
                resp = await http.post(provider.url, json=REQUEST)
            assert resp.status_code == 200

    try:
        asyncio.run(main())
        assert len(provider.received) == 2
    finally:
        provider.close()
    with retryd.Client(server.addr, credentials=retryd.insecure()) as direct:
        events = watch_session(direct, "py-httpx-async")
    assert kinds(events) == ["scheduled", "started", "closed"]
    assert events[0].scheduled.failure.code == "SERVER" and events[0].scheduled.failure.http_status == 529
