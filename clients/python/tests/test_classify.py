"""Every shared classification vector (testdata/classify/*.json, format in
its README.md) through retryd.classify, with each classified failure's
decision under the built-in default policy checked by the client's policy
port, as clients/go and clients/ts do with the same files; and
error_kind_of on exceptions Python's own clients really raise."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

import pytest
from google.protobuf import json_format

from retrydtest import ROOT
from retryd import policy as P
from retryd.classify import ProviderFailure, classify, error_kind_of
from retryd.v1 import events_pb2, retry_service_pb2 as pb

FILE_KEYS = {"description", "vectors"}
VECTOR_KEYS = {"name", "comment", "input", "expect"}
INPUT_KEYS = {"httpStatus", "headers", "body", "errorKind", "outputShown", "emptyCompletion"}
EXPECT_KEYS = {"failure", "replay", "defaultDecision"}
FAILURE_KEYS = {"code", "httpStatus", "providerRetryAfterMs", "retryAfter"}


def _known(where: str, obj: Dict[str, Any], keys: set) -> None:  # type: ignore[type-arg]
    for k in obj:
        assert k in keys, f"{where}: unknown key {k!r}"


def load() -> List[Dict[str, Any]]:
    out = []
    for f in sorted((ROOT / "testdata" / "classify").glob("*.json")):
        doc = json.loads(f.read_text())
        _known(f.name, doc, FILE_KEYS)
        for v in doc["vectors"]:
            _known(f"{f.name} {v['name']}", v, VECTOR_KEYS)
            _known(f"{f.name} {v['name']} input", v["input"], INPUT_KEYS)
            _known(f"{f.name} {v['name']} expect", v["expect"], EXPECT_KEYS)
            _known(f"{f.name} {v['name']} expect.failure", v["expect"]["failure"], FAILURE_KEYS)
            out.append(v)
    return out


VECTORS = load()
DEFAULT = P.resolve_policy(None)


def test_the_vectors_are_there() -> None:
    assert len(VECTORS) >= 30, f"only {len(VECTORS)} vectors"
    assert len({v["name"] for v in VECTORS}) == len(VECTORS), "vector names are unique"


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_classification_vector(v: Dict[str, Any]) -> None:
    i = v["input"]
    c = classify(
        ProviderFailure(
            http_status=i.get("httpStatus", 0),
            headers=i.get("headers"),
            body=i.get("body"),
            error_kind=i.get("errorKind"),
            output_shown=i.get("outputShown", False),
            empty_completion=i.get("emptyCompletion", False),
        )
    )
    got = json_format.MessageToDict(c.failure)
    got.pop("message", None)
    want = dict(v["expect"]["failure"])
    if want.get("httpStatus") == 0:
        del want["httpStatus"]
    if "providerRetryAfterMs" in want:
        want["providerRetryAfterMs"] = str(want["providerRetryAfterMs"])
    assert got == want, f"{v['name']}: failure"
    assert events_pb2.Replay.Name(c.replay) == v["expect"]["replay"]
    assert len(c.failure.message.encode()) <= 4096
    if "defaultDecision" in v["expect"]:
        now = time.time() * 1000
        d = P.decide(
            DEFAULT,
            P.Attempt(retries=0, code=c.failure.code, replay=c.replay, retry_after=P.failure_retry_after(c.failure, now)),
            now,
            lambda: 0,
        )
        name = "SCHEDULE" if d.schedule else events_pb2.DelegateReason.Name(d.reason)
        assert name == v["expect"]["defaultDecision"], f"{v['name']}: the default policy's decision"


def test_classification_applies_to_a_request() -> None:
    c = classify(ProviderFailure(http_status=429, headers={"Retry-After-Ms": "1500"}, output_shown=True))
    req = c.apply(pb.FailedStepRequest(session_id="s", turn=1, step=1, provider="openai"))
    assert req.failure.code == "RATE_LIMIT" and req.failure.provider_retry_after_ms == 1500
    assert req.replay == events_pb2.REPLAY_UNSAFE


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the exception is the result
        return e
    raise AssertionError("no exception")


def _server(handler: Any) -> int:
    """A loopback TCP server that runs handler on its one connection."""
    lst = socket.create_server(("127.0.0.1", 0))
    port: int = lst.getsockname()[1]

    def serve() -> None:
        conn, _ = lst.accept()
        try:
            handler(conn)
        finally:
            conn.close()
            lst.close()

    threading.Thread(target=serve, daemon=True).start()
    return port


def test_error_kind_of_reads_what_pythons_clients_raise() -> None:
    refused = _raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{_closed_port()}/", timeout=5))
    assert isinstance(refused, urllib.error.URLError)
    assert error_kind_of(refused) == "connection_refused"

    def reset(conn: socket.socket) -> None:
        conn.recv(1024)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    port = _server(reset)
    assert error_kind_of(_raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5))) == "connection_reset"

    def silent(conn: socket.socket) -> None:
        conn.recv(1024)
        time.sleep(1)

    port = _server(silent)
    assert error_kind_of(_raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=0.2))) == "timeout"

    def truncated(conn: socket.socket) -> None:
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")

    port = _server(truncated)

    def read_all() -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/")
        c.getresponse().read()

    assert error_kind_of(_raised(read_all)) == "stream_truncated"

    def not_tls(conn: socket.socket) -> None:
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    port = _server(not_tls)
    ctx = ssl.create_default_context()
    assert error_kind_of(_raised(lambda: ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="x").do_handshake())) == "tls"
    assert error_kind_of(socket.gaierror(-2, "Name or service not known")) == "dns"
    assert error_kind_of(asyncio.CancelledError()) == "aborted"
    assert error_kind_of(RuntimeError("anything else")) == "connection_reset"
    assert error_kind_of(None) is None


def test_an_exception_classifies_as_transport() -> None:
    err: Optional[BaseException] = _raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{_closed_port()}/", timeout=5))
    c = classify(ProviderFailure(error=err))
    assert (c.failure.code, c.failure.http_status) == ("TRANSPORT", 0)
    assert c.failure.message.startswith("connection_refused")
