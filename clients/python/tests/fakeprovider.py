"""A scripted model provider on loopback for the middleware tests: POST
/v1/chat/completions (OpenAI-compatible) and /v1/messages (Anthropic)
answer the next scripted reply, as JSON or as server-sent events when the
request asks for a stream, and record what arrived. Also the retryd side of
the checks: the decisions a retryd logged for a session."""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from retrydtest import RetrydServer


@dataclass
class Reply:
    """One scripted answer. kind: "error" (status, headers, body), "complete"
    (text), "empty", "stream-error" (tokens, then an error event with body
    as its error object), "stream-cut" (tokens, then the connection is
    reset mid-stream)."""

    kind: str
    status: int = 200
    headers: Dict[str, str] = field(default_factory=dict)
    body: Any = None
    text: str = ""
    tokens: Tuple[str, ...] = ()


def error(status: int, body: Any, **headers: str) -> Reply:
    return Reply("error", status=status, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()})


def complete(text: str) -> Reply:
    return Reply("complete", text=text)


EMPTY = Reply("empty")


def stream_error(tokens: Tuple[str, ...], err: Dict[str, Any]) -> Reply:
    return Reply("stream-error", tokens=tokens, body=err)


def stream_cut(tokens: Tuple[str, ...]) -> Reply:
    return Reply("stream-cut", tokens=tokens)


# Provider answers the tests share.
UNAVAILABLE = error(503, {"error": {"message": "The server is temporarily unavailable.", "type": "server_error", "code": None}})
QUOTA = error(429, {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                              "type": "insufficient_quota", "code": "insufficient_quota"}})
OVERLOADED = error(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})


def rate_limited(**headers: str) -> Reply:
    return error(429, {"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}},
                 **headers)


@dataclass
class Received:
    at: float
    path: str
    stream: bool
    answered: str


class FakeProvider:
    """Answers each request with the next scripted reply (HTTP 500 once the
    script is used up) and records every request."""

    def __init__(self, *script: Reply) -> None:
        self.script: List[Reply] = list(script)
        self.received: List[Received] = []
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                provider._answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    @property
    def left(self) -> int:
        return len(self.script)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "FakeProvider":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers.get("content-length", "0")))
        try:
            req = json.loads(raw or b"{}")
        except ValueError:
            req = {}
        stream = req.get("stream") is True
        anthropic = h.path.rstrip("/").endswith("/messages")
        model = str(req.get("model", "fake-model"))
        with self._lock:
            reply = self.script.pop(0) if self.script else None
            self.received.append(Received(time.monotonic(), h.path, stream, reply.kind if reply else "unscripted"))
        if reply is None:
            reply = error(500, {"error": {"message": "no scripted answer left", "type": "server_error"}})
        if reply.kind == "error":
            _send(h, reply.status, json.dumps(reply.body).encode(), "application/json", reply.headers)
            return
        if reply.kind in ("complete", "empty"):
            text = reply.text if reply.kind == "complete" else ""
            if not stream:
                doc = _message(model, text) if anthropic else _completion(model, text)
                _send(h, 200, json.dumps(doc).encode(), "application/json", {})
                return
            events = _anthropic_events(model, [text] if text else [], "end_turn") if anthropic else \
                _openai_events(model, [text] if text else [], "stop")
            _send(h, 200, b"".join(events), "text/event-stream", {})
            return
        tokens = list(reply.tokens)
        if anthropic:
            events = _anthropic_events(model, tokens, None)
            if reply.kind == "stream-error":
                events.append(_sse({"type": "error", "error": reply.body}, "error"))
        else:
            events = _openai_events(model, tokens, None)
            if reply.kind == "stream-error":
                events.append(_sse({"error": reply.body}))
        if reply.kind == "stream-error":
            _send(h, 200, b"".join(events), "text/event-stream", {})
            return
        # stream-cut: chunked, then a reset before the terminating chunk.
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        for e in events:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(e), e))
        h.wfile.flush()
        time.sleep(0.2)  # the events reach the client before the reset (which drops unread data)
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.close_connection = True
        h.connection.close()


def _send(h: BaseHTTPRequestHandler, status: int, data: bytes, ctype: str, headers: Dict[str, str]) -> None:
    h.send_response(status)
    h.send_header("content-type", ctype)
    for k, v in headers.items():
        h.send_header(k, v)
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _sse(doc: Any, event: Optional[str] = None) -> bytes:
    data = doc if isinstance(doc, str) else json.dumps(doc)
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


def _completion(model: str, content: str) -> Dict[str, Any]:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1 if content else 0, "total_tokens": 4 if content else 3},
    }


def _chunk(model: str, delta: Dict[str, Any], finish: Optional[str]) -> Dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def _openai_events(model: str, tokens: List[str], finish: Optional[str]) -> List[bytes]:
    out = [_sse(_chunk(model, {"role": "assistant", "content": ""}, None))]
    out += [_sse(_chunk(model, {"content": t}, None)) for t in tokens]
    if finish is not None:
        out += [_sse(_chunk(model, {}, finish)), _sse("[DONE]")]
    return out


def _message(model: str, text: str) -> Dict[str, Any]:
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}] if text else [], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 1 if text else 0}}


def _anthropic_events(model: str, tokens: List[str], stop: Optional[str]) -> List[bytes]:
    start = _message(model, "")
    start["stop_reason"] = None
    out = [_sse({"type": "message_start", "message": start}, "message_start")]
    if tokens:
        out.append(_sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                        "content_block_start"))
        out += [_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}},
                     "content_block_delta") for t in tokens]
        if stop is not None:
            out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    if stop is not None:
        out.append(_sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                         "usage": {"output_tokens": len(tokens)}}, "message_delta"))
        out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


_DELAY = re.compile(r"delay_ms:\s*(\d+)")
_REASON = re.compile(r"reason:\s*(DELEGATE_REASON_[A-Z_]+)")


@dataclass
class Decision:
    step: int
    code: str
    delay_ms: Optional[int]  # a schedule's delay; None for a delegation
    reason: Optional[str]  # a delegation's reason


def logged_decisions(server: RetrydServer, session: str, want: int, timeout: float = 5.0) -> List[Decision]:
    """The decisions retryd logged (--log-level debug, "failed step decided")
    for the session's reports, in order, once want of them are there (or
    after timeout)."""
    deadline = time.monotonic() + timeout
    out: List[Decision] = []
    while True:
        out = []
        for line in server.logs().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") != "failed step decided" or rec.get("session") != session:
                continue
            d = str(rec.get("decision", ""))
            delay = _DELAY.search(d)
            reason = _REASON.search(d)
            out.append(Decision(int(rec.get("step", 0)), str(rec.get("code", "")),
                                int(delay.group(1)) if delay and "schedule" in d else None,
                                reason.group(1) if reason else None))
        if len(out) >= want or time.monotonic() > deadline:
            return out
        time.sleep(0.05)
