"""Bearer tokens against a live retryd started with --auth-credentials (the
token hashes of two tenants), over plaintext (insecure_bearer_token) and
over TLS (bearer_token) with a certificate made by openssl for the test."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterator, List

import grpc
import pytest

import retryd
from helpers import backoff_policy, failed_step, kinds
from retrydtest import RetrydServer, temp_dir, verify_event_lines
from google.protobuf import json_format
from retryd.v1 import retry_service_pb2 as pb

# Tokens as `openssl rand -hex 32` makes them.
TOKEN_A = "2b7e151628aed2a6abf7158809cf4f3c762e7160f38b4da56a784d9045190cfe"
TOKEN_B = "f0e1d2c3b4a5968778695a4b3c2d1e0ff0e1d2c3b4a5968778695a4b3c2d1e0f"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AuthServer:
    def __init__(self, srv: RetrydServer, ca: bytes) -> None:
        self.srv = srv
        self.addr = srv.addr
        self.ca = ca


@pytest.fixture(scope="module")
def auth(retryd_bin: str) -> Iterator[AuthServer]:
    """retryd with two tenants, TLS on its gRPC port (a self-signed
    certificate for 127.0.0.1) and tracing to the console, so that its
    decision spans join a caller's trace."""
    d = Path(temp_dir())
    (d / "credentials.yaml").write_text(
        "tenants:\n"
        f"  - id: team-a\n    tokens:\n      - sha256: \"{sha256(TOKEN_A)}\"\n    providers: [deepseek, openai]\n"
        f"  - id: team-b\n    tokens:\n      - sha256: \"{sha256(TOKEN_B)}\"\n"
    )
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "1", "-subj", "/CN=retryd-test",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    srv = RetrydServer(
        retryd_bin,
        "--auth-credentials", str(d / "credentials.yaml"),
        "--tls-cert", str(d / "cert.pem"),
        "--tls-key", str(d / "key.pem"),
        env={"OTEL_TRACES_EXPORTER": "console"},
    )
    ca = (d / "cert.pem").read_bytes()
    try:
        yield AuthServer(srv, ca)
        # Each tenant's log, read with its token, passes the checker.
        for token in (TOKEN_A, TOKEN_B):
            with retryd.Client(srv.addr, credentials=retryd.tls(ca), bearer_token=token) as c:
                lines = [
                    json_format.MessageToJson(e, indent=None)
                    for e in c.watch_events(pb.WatchEventsRequest(stop_at_end=True), timeout=10)
                ]
            verify_event_lines(retryd_bin, lines)
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)


def tls_client(auth: AuthServer, token: str) -> retryd.Client:
    return retryd.Client(auth.addr, credentials=retryd.tls(auth.ca), bearer_token=token)


def test_bearer_token_over_tls_names_the_tenant(auth: AuthServer) -> None:
    session = "py-auth-tenant"
    with tls_client(auth, TOKEN_A) as a, tls_client(auth, TOKEN_B) as b:
        out = a.failed_step(failed_step(session, 1, 1, backoff_policy(10_000), provider="deepseek"))
        assert out.decision.WhichOneof("outcome") == "schedule"
        assert len(a.get_chains(session).chains) == 1
        # Team B's token reaches a tenant of its own: the session is not there.
        with pytest.raises(grpc.RpcError) as err:
            b.get_chains(session)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # Streams carry it too.
        events = list(a.watch_events(pb.WatchEventsRequest(session_id=session, stop_at_end=True), timeout=10))
        assert kinds(events) == ["scheduled"]
        a.cancel_session(session)


def test_async_bearer_token_over_tls(auth: AuthServer) -> None:
    async def main() -> None:
        async with retryd.AsyncClient(auth.addr, credentials=retryd.tls(auth.ca), bearer_token=TOKEN_A) as a:
            out = await a.recover(failed_step("py-auth-async", 1, 1, backoff_policy(20), provider="openai"), timeout=10)
            assert out.kind == "retry"

    asyncio.run(main())


def test_insecure_bearer_token_is_sent_over_a_plaintext_channel(auth: AuthServer) -> None:
    """insecure_bearer_token is sent whatever the transport: over TLS here
    (the server only speaks TLS), and the plaintext case is the
    constructor's (below)."""
    with retryd.Client(auth.addr, credentials=retryd.tls(auth.ca), insecure_bearer_token=TOKEN_B) as b:
        with pytest.raises(grpc.RpcError) as err:
            b.get_chains("py-auth-insecure")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND  # authenticated; unknown session


def test_without_or_with_a_wrong_token_calls_are_unauthenticated(auth: AuthServer) -> None:
    for c in (
        retryd.Client(auth.addr, credentials=retryd.tls(auth.ca)),
        retryd.Client(auth.addr, credentials=retryd.tls(auth.ca), bearer_token="0" * 64),
    ):
        with c:
            with pytest.raises(grpc.RpcError) as err:
                c.get_chains("py-auth-anonymous")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as werr:
                list(c.watch_events(pb.WatchEventsRequest(stop_at_end=True), timeout=10))
            assert werr.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_to_a_tls_server_fails(auth: AuthServer) -> None:
    with retryd.Client(auth.addr, credentials=retryd.insecure(), insecure_bearer_token=TOKEN_A) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.get_chains("py-auth-plain", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_bearer_token_is_refused_without_tls() -> None:
    with pytest.raises(ValueError, match="only over TLS"):
        retryd.Client("127.0.0.1:1", credentials=retryd.insecure(), bearer_token=TOKEN_A)
    with pytest.raises(ValueError, match="not both"):
        retryd.Client("127.0.0.1:1", credentials=retryd.tls(), bearer_token=TOKEN_A, insecure_bearer_token=TOKEN_A)
    with pytest.raises(TypeError):
        retryd.Client("127.0.0.1:1", credentials=None)  # type: ignore[arg-type]
    # insecure_bearer_token over plaintext is accepted (it connects lazily).
    retryd.Client("127.0.0.1:1", credentials=retryd.insecure(), insecure_bearer_token=TOKEN_A).close()


@pytest.mark.parametrize("token, offset", [("", None), (TOKEN_A + "\n", 64), ("secret token", 6), ("sécret", 1)])
def test_a_malformed_token_is_refused_naming_the_offset(token: str, offset: object) -> None:
    for kw in ({"bearer_token": token}, {"insecure_bearer_token": token}):
        with pytest.raises(ValueError) as err:
            retryd.Client("127.0.0.1:1", credentials=retryd.tls(), **kw)  # type: ignore[arg-type]
        msg = str(err.value)
        assert ("empty" in msg) if offset is None else (f"offset {offset} " in msg)
        assert token == "" or token.strip() not in msg, "the message quotes the token"


def test_provider_not_allowed(auth: AuthServer) -> None:
    with tls_client(auth, TOKEN_A) as a:
        calls: List[Callable[[], object]] = [
            lambda: a.failed_step(failed_step("py-auth-denied", 1, 1, backoff_policy(20), provider="anthropic")),
            lambda: a.get_provider_state("anthropic"),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert retryd.is_provider_not_allowed(err.value) == "anthropic"
            info = retryd.error_info(err.value)
            assert info is not None and dict(info.metadata) == {"tenant": "team-a", "provider": "anthropic"}
        with pytest.raises(grpc.RpcError) as nf:
            a.get_chains("py-auth-denied")
        assert nf.value.code() == grpc.StatusCode.NOT_FOUND  # nothing recorded


def test_traceparent_joins_the_callers_trace(auth: AuthServer) -> None:
    """The traceparent the caller gives (per call, or from the client's
    source) is propagated: retryd's backoff span, whose context the
    scheduled record carries, is in the caller's trace."""
    trace_id = TRACEPARENT.split("-")[1]
    with tls_client(auth, TOKEN_A) as a:
        out = a.failed_step(failed_step("py-trace-1", 1, 1, backoff_policy(10_000), provider="openai"), traceparent=TRACEPARENT)
        tp = out.event.scheduled.traceparent
        assert tp.split("-")[1] == trace_id, tp
        a.cancel_session("py-trace-1")
    seen: List[str] = []

    def source() -> str:
        seen.append("called")
        return "00-11111111111111111111111111111111-2222222222222222-01"

    with retryd.Client(auth.addr, credentials=retryd.tls(auth.ca), bearer_token=TOKEN_A, traceparent=source) as s:
        out = s.failed_step(failed_step("py-trace-2", 1, 1, backoff_policy(10_000), provider="openai"))
        assert out.event.scheduled.traceparent.split("-")[1] == "1" * 32
        assert seen == ["called"]
        s.cancel_session("py-trace-2")
    with pytest.raises(ValueError, match="traceparent"):
        with tls_client(auth, TOKEN_A) as bad:
            bad.get_chains("x", traceparent="not-a-traceparent")
