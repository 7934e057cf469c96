"""Classifying provider errors: what a model request's failure looked like
(an HTTP status, headers, an error body, a client error, a dropped stream,
an empty completion) turned into retryd's Failure and Replay, by the rules
every retryd client shares (docs/clients.md, "Classifying provider
errors"; vectors in testdata/classify, run by tests/test_classify.py).

Nothing here depends on a provider's SDK: give classify() what the agent
saw, from any HTTP client. classify_exception() is the one classifier of an
exception a model call raised: recover(error=), Failure.from_exception and
the SDK middleware (retryd.openai, ...) all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import math
import re
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Mapping, Optional, Set, Union

from .v1 import events_pb2, retry_service_pb2

#: Replaces the code of a failure whose response carried x-should-retry: false.
CODE_PROVIDER_NO_RETRY = "PROVIDER_NO_RETRY"
#: A request the provider rejected as malformed (400, 404, 413, 422).
CODE_INVALID_REQUEST = "INVALID_REQUEST"
#: A prompt over the model's context window: compaction, not a retry, recovers it.
CODE_CONTEXT_WINDOW_EXCEEDED = "CONTEXT_WINDOW_EXCEEDED"

#: What went wrong when a request raised an error instead of, or while
#: reading, a response.
ErrorKind = Literal["connection_refused", "connection_reset", "dns", "tls", "timeout", "stream_truncated", "aborted"]

MAX_FAILURE_MESSAGE = 4096
_MAX_RETRY_AFTER = 256
_RETRY_AFTER_MS_OVER = 2**31
_RETRY_AFTER_MS_SYNTAX = re.compile(r"^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$")
_DEFAULT_RETRIED = frozenset({"EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT"})
_ERROR_TYPE_CODES = {
    "insufficient_quota": "QUOTA",
    "billing_error": "QUOTA",
    "rate_limit_error": "RATE_LIMIT",
    "rate_limit_exceeded": "RATE_LIMIT",
    "overloaded_error": "SERVER",
    "api_error": "SERVER",
    "server_error": "SERVER",
    "timeout_error": "TIMEOUT",
    "authentication_error": "AUTH",
    "permission_error": "AUTH",
    "invalid_api_key": "AUTH",
    "context_length_exceeded": CODE_CONTEXT_WINDOW_EXCEEDED,
    "invalid_request_error": CODE_INVALID_REQUEST,
    "not_found_error": CODE_INVALID_REQUEST,
    "request_too_large": CODE_INVALID_REQUEST,
}

# Exceptions of HTTP clients and SDKs recognised by class name, so that
# none of them is a dependency: httpx, the openai and anthropic SDKs,
# aiohttp, urllib3 and requests.
_TIMEOUT_NAMES = frozenset(
    {
        "TimeoutException", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout",
        "APITimeoutError", "ServerTimeoutError", "ReadTimeoutError", "ConnectTimeoutError", "Timeout",
    }
)
_TRUNCATED_NAMES = frozenset({"IncompleteRead", "RemoteProtocolError", "ProtocolError", "ChunkedEncodingError", "ClientPayloadError"})
_ABORTED_NAMES = frozenset({"APIUserAbortError"})


@dataclass
class ProviderFailure:
    """What an agent saw when one model request failed; set what applies."""

    http_status: int = 0
    """The response's HTTP status; 0 when no response arrived. An error
    inside a stream keeps the stream's status (200)."""
    headers: Optional[Mapping[str, Any]] = None
    """The response's headers (retry-after-ms, retry-after and
    x-should-retry are read, case-insensitively)."""
    body: Union[str, bytes, Mapping[str, Any], None] = None
    """The error body as it arrived, or a stream error event's data; a
    mapping stands for its JSON."""
    error_kind: Optional[ErrorKind] = None
    """The client error the request raised; when None and error is set,
    error_kind_of(error) decides."""
    error: Optional[BaseException] = None
    """The exception the HTTP client or SDK raised, if any."""
    output_shown: bool = False
    """Streamed output of this attempt was already shown to the user (a
    replay would show a second answer)."""
    empty_completion: bool = False
    """The response completed with nothing in it: a stop with no content
    and no tool calls."""


@dataclass(frozen=True)
class Classification:
    """The report classify() derived: FailedStepRequest.failure and .replay."""

    failure: events_pb2.Failure
    replay: "events_pb2.Replay"

    def apply(self, request: retry_service_pb2.FailedStepRequest) -> retry_service_pb2.FailedStepRequest:
        """Sets the failure and replay on request and returns it, for
        ``client.recover(c.apply(FailedStepRequest(session_id=…, …)))``."""
        request.failure.CopyFrom(self.failure)
        request.replay = self.replay
        return request


def error_kind_of(err: Optional[BaseException]) -> Optional[ErrorKind]:
    """The kind of an exception an HTTP client or a provider SDK raised,
    following ``__cause__`` and ``__context__``: ConnectionRefusedError;
    ConnectionResetError, BrokenPipeError, ConnectionAbortedError; a DNS
    failure (socket.gaierror); an ssl.SSLError; a cancellation (aborted);
    TimeoutError or an HTTP client's or SDK's timeout; a body that ended
    early (stream_truncated). Any other exception counts as
    connection_reset, a transport failure; None for no exception."""
    if err is None:
        return None
    timeout_seen = False
    seen: Set[int] = set()
    e: Optional[BaseException] = err
    while e is not None and id(e) not in seen and len(seen) < 8:
        seen.add(id(e))
        name = type(e).__name__
        if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt)) or name in _ABORTED_NAMES:
            return "aborted"
        if isinstance(e, ConnectionRefusedError):
            return "connection_refused"
        if isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return "connection_reset"
        if isinstance(e, socket.gaierror):
            return "dns"
        if isinstance(e, ssl.SSLError) or isinstance(e, ssl.CertificateError):
            return "tls"
        if isinstance(e, TimeoutError) or name in _TIMEOUT_NAMES:
            timeout_seen = True
        if isinstance(e, EOFError) or name in _TRUNCATED_NAMES:
            return "stream_truncated"
        if timeout_seen:
            return "timeout"
        e = e.__cause__ if e.__cause__ is not None else e.__context__
    return "connection_reset"


@dataclass(frozen=True)
class _ProviderError:
    err_type: str
    err_code: str
    message: str


def _parse_provider_error(body: Union[str, bytes, Mapping[str, Any], None]) -> Optional[_ProviderError]:
    doc: Any = body
    if isinstance(body, (str, bytes)):
        try:
            doc = json.loads(body)
        except ValueError:
            return None
    if not isinstance(doc, Mapping):
        return None
    e = doc.get("error")
    if not isinstance(e, Mapping):
        return None
    err: Mapping[str, Any] = e

    def text(k: str) -> str:
        v = err.get(k)
        return v if isinstance(v, str) else ""

    return _ProviderError(err_type=text("type"), err_code=text("code"), message=text("message"))


def _header(headers: Optional[Mapping[str, Any]], name: str) -> str:
    if headers is None:
        return ""
    for k, v in headers.items():
        if k.lower() == name:
            if isinstance(v, (list, tuple)):
                return str(v[0]) if v else ""
            return "" if v is None else str(v)
    return ""


def _status_code(status: int, perr: Optional[_ProviderError]) -> str:
    if status in (400, 404, 413, 422):
        return CODE_INVALID_REQUEST
    if status in (401, 403):
        return "AUTH"
    if status == 402:
        return "QUOTA"
    if status == 408:
        return "TIMEOUT"
    if status == 429:
        quota = perr is not None and "insufficient_quota" in (perr.err_code, perr.err_type)
        return "QUOTA" if quota else "RATE_LIMIT"
    if 500 <= status <= 599:
        return "SERVER"
    return f"HTTP_{status}"


def _error_type_code(perr: _ProviderError) -> str:
    return _ERROR_TYPE_CODES.get(perr.err_code) or _ERROR_TYPE_CODES.get(perr.err_type) or "SERVER"


def _context_overflow(perr: Optional[_ProviderError]) -> bool:
    if perr is None:
        return False
    if perr.err_code == "context_length_exceeded":
        return True
    msg = perr.message.lower()
    return "maximum context length" in msg or "prompt is too long" in msg


def _failure_message(label: str, detail: str) -> str:
    """Bounds Failure.message to the server's 4 KiB of UTF-8."""
    msg = label if detail == "" else f"{label}: {detail}"
    raw = msg.encode("utf-8", "replace")
    if len(raw) <= MAX_FAILURE_MESSAGE:
        return raw.decode("utf-8")
    cut = MAX_FAILURE_MESSAGE
    while cut > 0 and (raw[cut] & 0xC0) == 0x80:
        cut -= 1
    return raw[:cut].decode("utf-8")


def classify(f: ProviderFailure) -> Classification:
    """Turns a provider failure into retryd's Failure and Replay by the
    shared rules: the HTTP status first (429 → RATE_LIMIT, but
    insufficient_quota → QUOTA; 5xx and 529 → SERVER; 408 → TIMEOUT;
    401/403 → AUTH; 400, 404, 413, 422 → INVALID_REQUEST or
    CONTEXT_WINDOW_EXCEEDED), then the error of an accepted stream, an empty
    completion; x-should-retry overrides; retry-after-ms becomes
    provider_retry_after_ms and retry-after is passed raw; output already
    shown makes the replay unsafe."""
    replay = events_pb2.REPLAY_UNSAFE if f.output_shown else events_pb2.REPLAY_SAFE
    status = min(max(int(f.http_status), 0), 999)
    failure = events_pb2.Failure(http_status=status)
    kind = f.error_kind if f.error_kind is not None else error_kind_of(f.error)
    if kind is not None:
        failure.code = "ABORTED" if kind == "aborted" else "TIMEOUT" if kind == "timeout" else "TRANSPORT"
        failure.message = _failure_message(kind, "" if f.error is None else str(f.error))
        return Classification(failure, replay)
    perr = _parse_provider_error(f.body)
    if status != 0 and not 200 <= status <= 299:
        failure.code = _status_code(status, perr)
    elif perr is not None:
        failure.code = _error_type_code(perr)
    elif f.empty_completion:
        failure.code = "EMPTY_RESPONSE"
    else:
        failure.code = "MALFORMED_RESPONSE"
    if failure.code == CODE_INVALID_REQUEST and _context_overflow(perr):
        failure.code = CODE_CONTEXT_WINDOW_EXCEEDED
    original = failure.code
    should_retry = _header(f.headers, "x-should-retry")
    if should_retry == "false":
        failure.code = CODE_PROVIDER_NO_RETRY
    elif should_retry == "true" and failure.code not in _DEFAULT_RETRIED:
        failure.code = "RATE_LIMIT" if status == 429 else "SERVER"
    ms = _header(f.headers, "retry-after-ms")
    if _RETRY_AFTER_MS_SYNTAX.match(ms):
        v = float(ms)
        if math.isfinite(v):  # Go's ParseFloat refuses an overflow (1e999)
            failure.provider_retry_after_ms = min(math.ceil(v), _RETRY_AFTER_MS_OVER)
    ra = _header(f.headers, "retry-after")
    if ra != "" and len(ra.encode("utf-8", "replace")) <= _MAX_RETRY_AFTER:
        failure.retry_after = ra
    detail = perr.message if perr is not None else ""
    if perr is None and status >= 300:
        try:
            detail = http.HTTPStatus(status).phrase
        except ValueError:
            detail = ""
    label = original
    if original != failure.code:
        label = f"{original} (x-should-retry: {should_retry})"
    if status != 0:
        label = f"HTTP {status} {label}"
    failure.message = _failure_message(label, detail)
    return Classification(failure, replay)


#: The code of a failure whose exception the classifier does not know:
#: no default policy retries it.
CODE_UNKNOWN = "UNKNOWN"

# Exceptions of HTTP clients and SDKs that are transport failures, by class
# name (none of them is a dependency).
_TRANSPORT_NAMES = frozenset({
    "TransportError", "NetworkError", "ConnectError", "ReadError", "WriteError", "CloseError", "ProtocolError",
    "RemoteProtocolError", "LocalProtocolError", "TimeoutException", "ConnectTimeout", "ReadTimeout", "WriteTimeout",
    "PoolTimeout", "ProxyError", "APIConnectionError", "APITimeoutError", "APIUserAbortError", "Timeout",
    "ServerDisconnectedError", "ClientConnectionError", "ClientPayloadError", "ChunkedEncodingError", "IncompleteRead",
})


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """exc, then what it wraps (``__cause__``, else ``__context__``), at
    most 8 deep and without cycles."""
    seen: Set[int] = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen and len(seen) < 8:
        seen.add(id(e))
        yield e
        e = e.__cause__ if e.__cause__ is not None else e.__context__


def classify_exception(exc: BaseException, *, output_shown: bool = False) -> Classification:
    """The Failure and Replay to report for an exception a model call
    raised: an SDK's status error (``status_code``, the response's headers,
    the error body: openai, anthropic, litellm), an SDK's stream error event
    (no status: the stream's 200), a transport failure (refused, reset,
    DNS, TLS, timeouts, a broken stream, a cancellation: the shared rules
    of retryd.classify), and for any other exception code UNKNOWN, which no
    default policy retries. It never raises."""
    try:
        return _classify_exception(exc, output_shown)
    except Exception:  # noqa: BLE001: a classification must never fail the agent
        return _unknown(exc, output_shown)


def _unknown(exc: BaseException, output_shown: bool) -> Classification:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001: a __str__ that raises
        text = type(exc).__name__
    failure = events_pb2.Failure(code=CODE_UNKNOWN, message=text.encode("utf-8", "replace")[:4000].decode("utf-8", "ignore"))
    return Classification(failure, events_pb2.REPLAY_UNSAFE if output_shown else events_pb2.REPLAY_SAFE)


def _classify_exception(exc: BaseException, shown: bool) -> Classification:
    for e in exception_chain(exc):
        status = getattr(e, "status_code", None)
        body = getattr(e, "body", None)
        if isinstance(body, dict) and "error" not in body:
            body = {"error": body}
        if isinstance(status, int) and not isinstance(status, bool) and status > 0:
            response = getattr(e, "response", None)
            headers = getattr(response, "headers", None)
            if body is None and response is not None:
                with contextlib.suppress(Exception):
                    body = response.text
            return classify(ProviderFailure(http_status=status, headers=headers, body=body, output_shown=shown))
        if isinstance(body, dict) and type(e).__name__ == "APIError":  # an error event inside a 200 stream
            return classify(ProviderFailure(http_status=200, body=body, output_shown=shown))
    for e in exception_chain(exc):
        if isinstance(e, (OSError, EOFError, TimeoutError, asyncio.CancelledError, KeyboardInterrupt)) or \
                type(e).__name__ in _TRANSPORT_NAMES:
            return classify(ProviderFailure(error=exc, output_shown=shown))
    return _unknown(exc, shown)
