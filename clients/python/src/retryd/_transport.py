"""Transport security, bearer tokens and per-call metadata.

A client states its transport explicitly: ``tls()`` (or ``tls_credentials()``
with ``grpc.ChannelCredentials`` of your own) or ``insecure()`` by name;
there is no default. A bearer token goes only over TLS unless it is given as
an insecure one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

import grpc

#: Metadata pairs of one call.
Metadata = Tuple[Tuple[str, str], ...]

#: Supplies the caller's current W3C trace context (a ``traceparent``
#: header value) for each call, or None when there is none.
TraceparentSource = Callable[[], Optional[str]]

_SERVICE = "retryd.v1.RetryService"

# The service config of the Go client (retryd.ServiceConfig): the
# idempotent RPCs are retried by the channel on UNAVAILABLE (a replica
# going away, a refused connection), up to 4 attempts 50 ms to 1 s apart,
# and a dns:/// target with several addresses is balanced round robin. AwaitRetry and WatchEvents are not in
# the list: AwaitRetry re-attaches itself, and a watcher resumes from the
# last sequence it saw.
SERVICE_CONFIG = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [
            {
                "name": [
                    {"service": _SERVICE, "method": m}
                    for m in ("FailedStep", "GetChains", "CancelRetries", "StepSucceeded")
                ],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    },
    separators=(",", ":"),
)


@dataclass(frozen=True)
class TransportCredentials:
    """How a client secures its connection: make it with ``tls()``,
    ``tls_credentials()`` or ``insecure()``."""

    channel_credentials: Optional[Any]
    """The grpc.ChannelCredentials of a TLS connection; None: plaintext."""

    @property
    def secure(self) -> bool:
        """Whether the connection has transport security."""
        return self.channel_credentials is not None


def tls(
    root_certificates: Optional[bytes] = None,
    private_key: Optional[bytes] = None,
    certificate_chain: Optional[bytes] = None,
) -> TransportCredentials:
    """TLS: the server's certificate is checked against root_certificates
    (PEM; None: the system's roots); private_key and certificate_chain (PEM)
    are the client's certificate for a retryd that asks for one."""
    return TransportCredentials(grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain))


def tls_credentials(credentials: Any) -> TransportCredentials:
    """TLS with grpc.ChannelCredentials you built yourself (for example
    grpc.ssl_channel_credentials with your own CA)."""
    if credentials is None:
        raise ValueError("retryd: tls_credentials needs grpc.ChannelCredentials; use insecure() for plaintext")
    return TransportCredentials(credentials)


def insecure() -> TransportCredentials:
    """Plaintext: for a retryd on loopback, a sidecar, or a service mesh
    that encrypts the hop. Anyone on the path can read the calls."""
    return TransportCredentials(None)


def check_token(token: str) -> None:
    """Raises ValueError for a token retryd could never match: empty, or
    with a space, control or non-ASCII character. The message names the
    offset, never the token."""
    if token == "":
        raise ValueError("retryd: the bearer token is empty")
    for i, ch in enumerate(token):
        if ch <= " " or ch > "~":
            raise ValueError(
                f"retryd: the bearer token has a space, control or non-ASCII character at offset {i} of "
                f"{len(token)} (a trailing newline from a file?): a token is one line of visible ASCII"
            )


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def check_traceparent(value: str) -> None:
    """Raises ValueError unless value has the form of a W3C traceparent
    (version-traceid-parentid-flags in lower-case hex)."""
    if not _TRACEPARENT.match(value):
        raise ValueError(f"retryd: {value!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")


class CallMetadata:
    """The metadata every call of one client carries: the bearer token and
    the caller's trace context."""

    def __init__(
        self,
        credentials: TransportCredentials,
        bearer_token: Optional[str],
        insecure_bearer_token: Optional[str],
        traceparent: Optional[TraceparentSource],
    ) -> None:
        if not isinstance(credentials, TransportCredentials):
            raise TypeError("retryd: credentials must be retryd.tls(), retryd.tls_credentials(...) or retryd.insecure()")
        if bearer_token is not None and insecure_bearer_token is not None:
            raise ValueError("retryd: give bearer_token or insecure_bearer_token, not both")
        token = bearer_token if bearer_token is not None else insecure_bearer_token
        if token is not None:
            check_token(token)
        if bearer_token is not None and not credentials.secure:
            raise ValueError(
                "retryd: bearer_token is sent only over TLS: use retryd.tls(), or insecure_bearer_token "
                "where plaintext is safe (loopback, a sidecar that encrypts the hop, tests)"
            )
        self._base: Metadata = (("authorization", "Bearer " + token),) if token is not None else ()
        self._traceparent = traceparent

    def for_call(self, traceparent: Optional[str] = None, extra: Sequence[Tuple[str, str]] = ()) -> Metadata:
        """The metadata of one call: the token, the traceparent given for
        this call (else the client's source's), then extra."""
        tp = traceparent
        if tp is None and self._traceparent is not None:
            tp = self._traceparent()
        out = self._base
        if tp is not None:
            check_traceparent(tp)
            out = out + (("traceparent", tp),)
        return out + tuple(extra)


KEEPALIVE_TIME_MS = 20_000
"""The default interval of keepalive pings on a connection without traffic."""
KEEPALIVE_TIMEOUT_MS = 10_000
"""How long a ping may go unanswered before the connection is closed."""


def channel_options(options: Sequence[Tuple[str, Any]]) -> Tuple[Tuple[str, Any], ...]:
    """The client's channel options: its service config, then the caller's
    (which win)."""
    return (
        ("grpc.service_config", SERVICE_CONFIG),
        ("grpc.enable_retries", 1),
        # Reconnect within a couple of seconds of a replica's return, so
        # that the first call after an outage reaches it.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
        # A replica whose path went silent answers no ping within 10 s:
        # the connection closes and calls and await streams end
        # UNAVAILABLE and re-attach through another replica, instead of
        # waiting for their deadline. 20 s stays above the server's
        # default --keepalive-min-time (10 s).
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        # grpcio's HTTP/2 transport bounds an unanswered ping by its ping
        # timeout (a minute by default), not by keepalive_timeout_ms: the
        # same bound for both, so a silent path is found within
        # KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS on every grpcio of the
        # supported range.
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # Older releases also stop pinging after two pings without data,
        # and a silent connection carries none: no limit.
        ("grpc.http2.max_pings_without_data", 0),
    ) + tuple(options)
