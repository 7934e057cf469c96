"""The engine of the SDK middleware (retryd.openai, retryd.anthropic,
retryd.litellm, retryd.httpx_transport): an HTTP transport for httpx and
httpx2 (the HTTP clients of the openai and anthropic SDKs) that lets retryd
decide the retries of every model request sent through it, as the Go
middleware (clients/go/openai) does with an http.RoundTripper.

Each attempt's failure (an HTTP error status, an error event inside a 200
stream, an empty completion, a transport error) is classified
(retryd.classify) and reported with recover():

- retry: the request is sent again once retryd confirms the start;
- delegate (or the retry cancelled): the provider's answer is handed back
  as it came (the SDK raises its own error), with the outcome attached
  (outcome_of) and the headers Retryd-Delegate-Reason / -Detail;
- success: StepSucceeded.

A stream is held back until its first event with content (text, a refusal,
a tool call): an error event, a broken stream or an empty stop before it is
replay-safe, and on retry the SDK reads the new stream as if it were the
first. After content was passed on, a failure is reported replay-unsafe
(retryd delegates) and the SDK gets the provider's error as sent.

Nothing here imports an SDK or an HTTP client: the transports are built for
the module (httpx or httpx2) they are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

import grpc

from .aio import AsyncClient
from .classify import CODE_UNKNOWN, Classification, ProviderFailure, classify, classify_exception, exception_chain
from .client import Client
from .errors import error_reason, is_limit_reached, retry_delay, status_code
from .outcome import Outcome
from .v1 import events_pb2, policy_pb2, retry_service_pb2 as pb

log = logging.getLogger("retryd.middleware")

#: Headers added to a provider response handed back after retryd delegated.
HEADER_DELEGATE_REASON = "Retryd-Delegate-Reason"
HEADER_DELEGATE_DETAIL = "Retryd-Delegate-Detail"
HEADER_LOCAL = "Retryd-Local"
#: Where the outcome is attached: a response's or request's extensions, an
#: exception's attribute.
OUTCOME_KEY = "retryd_outcome"

# How much of an error body or a non-streamed completion is read to
# classify it (as the Go middleware).
_MAX_BODY = 4 << 20


@dataclass(frozen=True)
class Turn:
    """Where a model call sits in the agent's history: its session, its turn
    and the step of its first attempt (each retry is the next step)."""

    session_id: str
    turn: int
    first_step: int = 1
    logical_turn_id: str = ""


#: The harness's own numbering: the Turn of a model call, from its request
#: (an httpx or httpx2 Request).
TurnFunc = Callable[[Any], Turn]

_session: "contextvars.ContextVar[Optional[str]]" = contextvars.ContextVar("retryd_session", default=None)


@contextlib.contextmanager
def session(session_id: str) -> Iterator[None]:
    """Names the agent session of the model calls made inside the block (in
    this thread or task), for the default numbering."""
    token = _session.set(session_id)
    try:
        yield
    finally:
        _session.reset(token)


class DecisionError(Exception):
    """retryd refused the report of a failed model request (it recorded
    nothing): ``reason`` is its google.rpc.ErrorInfo reason (for example
    LIMIT_REACHED), ``delay`` the google.rpc.RetryInfo delay it asked for
    (or None), ``code`` the gRPC status code. ``classification`` is what was
    reported, ``provider_error`` the attempt's own exception (if it raised
    one) and ``response`` the provider's response (if one came). The
    gRPC error is the ``__cause__``."""

    def __init__(
        self,
        err: BaseException,
        classification: Classification,
        response: Any = None,
        provider_error: Optional[BaseException] = None,
    ) -> None:
        self.reason: Optional[str] = error_reason(err)
        self.delay: Optional[timedelta] = retry_delay(err)
        self.code: Optional[grpc.StatusCode] = status_code(err)
        self.classification = classification
        self.response = response
        self.provider_error = provider_error
        code = self.code.name if self.code is not None else type(err).__name__
        detail = f"{code} {self.reason}" if self.reason else code
        if self.delay is not None:
            detail += f", retry after {self.delay.total_seconds():g}s"
        super().__init__(f"retryd refused the report of {classification.failure.code}: {detail}")


class LimitReachedError(DecisionError):
    """retryd's admission control refused the report (RESOURCE_EXHAUSTED,
    LIMIT_REACHED): ``bound`` is the full bound, ``delay`` when to report
    again."""

    def __init__(self, err: BaseException, classification: Classification, response: Any = None,
                 provider_error: Optional[BaseException] = None) -> None:
        super().__init__(err, classification, response, provider_error)
        self.bound: str = is_limit_reached(err) or ""


class DelegatedError(Exception):
    """A model request retryd did not retry whose provider answer cannot be
    handed to the SDK as it came: a stream retried after its 200 whose retry
    answered an error status (``response``), or a transport error raised by
    the attempt (``error``, also the ``__cause__``). ``outcome`` is
    retryd's answer."""

    def __init__(self, outcome: Outcome, response: Any = None, error: Optional[BaseException] = None) -> None:
        self.outcome = outcome
        self.response = response
        self.error = error
        what = f"HTTP {response.status_code}" if response is not None else repr(error)
        super().__init__(f"retryd did not retry the model request ({reason_of(outcome)}): {what}")


def decision_error(exc: BaseException) -> Optional[DecisionError]:
    """The DecisionError exc is or wraps (``__cause__``/``__context__``):
    some SDK releases wrap what their HTTP client raised in their own
    connection error."""
    for e in exception_chain(exc):
        if isinstance(e, DecisionError):
            return e
    return None


def reason_of(out: Outcome) -> str:
    """The delegate reason's name, or the cancel reason for a cancelled retry."""
    if out.delegate is not None:
        return str(events_pb2.DelegateReason.Name(out.delegate.reason))
    if out.cancelled is not None:
        return "retry " + str(events_pb2.CancelReason.Name(out.cancelled.reason))
    return "no retry"


def outcome_of(x: Any) -> Optional[Outcome]:
    """The retryd outcome attached to a response the middleware returned, to
    an exception it raised or passed on, or to an SDK exception made from
    either (its ``response`` or ``request``), following ``__cause__`` and
    ``__context__``; None when retryd was not asked or retried."""
    seen: Set[int] = set()
    todo: List[Any] = [x]
    while todo:
        o = todo.pop(0)
        if o is None or id(o) in seen or len(seen) > 16:
            continue
        seen.add(id(o))
        got = getattr(o, OUTCOME_KEY, None)
        if isinstance(got, Outcome):
            return got
        ext = getattr(o, "extensions", None)
        if isinstance(ext, dict) and isinstance(ext.get(OUTCOME_KEY), Outcome):
            found: Outcome = ext[OUTCOME_KEY]
            return found
        if isinstance(o, BaseException):
            todo += [getattr(o, "response", None), getattr(o, "request", None), o.__cause__, o.__context__]
    return None


def delegate_reason(x: Any) -> Optional[str]:
    """The reason retryd gave for not retrying (see outcome_of), e.g.
    DELEGATE_REASON_REPLAY_UNSAFE, or None."""
    out = outcome_of(x)
    return reason_of(out) if out is not None else None


def empty_completion(data: bytes) -> bool:
    """Whether a non-streamed completion has nothing in it: every
    OpenAI-compatible choice stopped with no content, refusal or tool call,
    or an Anthropic message ended its turn with no content."""
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    if doc.get("type") == "message":
        return doc.get("stop_reason") == "end_turn" and not doc.get("content")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for ch in choices:
        if not isinstance(ch, dict):
            return False
        m = ch.get("message") or {}
        if ch.get("finish_reason") != "stop" or m.get("content") or m.get("refusal") or m.get("tool_calls"):
            return False
    return True


class _SSE:
    """The state of a watched server-sent-event stream: the events held back
    until the first with content, and what the stream said so far."""

    def __init__(self) -> None:
        self.shown = False
        self.held: List[bytes] = []
        self.event = ""
        self.data: List[bytes] = []
        self.stopped = False  # a stop without content was seen
        self.done = False  # the terminal event ([DONE], message_stop) was seen
        self.partial = b""

    def lines(self, chunk: bytes) -> List[bytes]:
        buf = self.partial + chunk
        parts = buf.split(b"\n")
        self.partial = parts.pop()
        return [p + b"\n" for p in parts]

    def feed(self, line: bytes) -> Tuple[bytes, Optional[bytes]]:
        """Takes one line; returns the bytes the SDK may read now and, at the
        end of an error event, its data."""
        was_shown = self.shown
        if was_shown:
            out = line
        else:
            self.held.append(line)
            out = b""
        err = None
        s = line.rstrip(b"\r\n")
        if s == b"":
            err = self._dispatch()
        elif s.startswith(b"event:"):
            self.event = s[6:].strip().decode("utf-8", "replace")
        elif s.startswith(b"data:"):
            d = s[5:]
            self.data.append(d[1:] if d.startswith(b" ") else d)
        if not was_shown and self.shown:
            out = self.flush()
        return out, err

    def end(self) -> List[bytes]:
        """The lines that complete a stream that ended without its last
        line break or blank line."""
        out = []
        if self.partial:
            out.append(self.partial + b"\n")
            self.partial = b""
        if out or self.data:
            out.append(b"\n")
        return out

    def flush(self) -> bytes:
        out = b"".join(self.held)
        self.held = []
        return out

    def _dispatch(self) -> Optional[bytes]:
        event, data = self.event, b"\n".join(self.data)
        self.event, self.data = "", []
        if not data:
            return None
        if data.strip() == b"[DONE]" or event == "message_stop":
            self.done = True
            return None
        doc: Any = None
        try:
            doc = json.loads(data)
        except ValueError:
            pass
        if event == "error" or (isinstance(doc, dict) and isinstance(doc.get("error"), dict)):
            return data
        if not self.shown and isinstance(doc, dict):
            if _has_content(doc):
                self.shown = True
            elif _stops(doc):
                self.stopped = True
        return None


def _has_content(doc: Dict[str, Any]) -> bool:
    if doc.get("type") == "content_block_delta":
        return True
    for ch in doc.get("choices") or ():
        d = ch.get("delta") if isinstance(ch, dict) else None
        if isinstance(d, dict) and (d.get("content") or d.get("refusal") or d.get("tool_calls")):
            return True
    return False


def _stops(doc: Dict[str, Any]) -> bool:
    if doc.get("type") == "message_delta":
        delta = doc.get("delta")
        return isinstance(delta, dict) and delta.get("stop_reason") == "end_turn"
    return any(isinstance(ch, dict) and ch.get("finish_reason") == "stop" for ch in doc.get("choices") or ())


def _is_sse(response: Any) -> bool:
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower() == "text/event-stream"


def _failure_of(response: Any, body: bytes) -> ProviderFailure:
    return ProviderFailure(http_status=response.status_code, headers=dict(response.headers), body=body)


def _attach(response: Any, request: Any, out: Outcome) -> None:
    """Attaches out to the response handed back (extensions and headers) and
    to its request (an SDK error made from a stream has only the request)."""
    for o in (response, request):
        if o is None:
            continue
        ext = o.extensions
        if not isinstance(ext, dict):
            ext = dict(ext)
            o.extensions = ext
        ext[OUTCOME_KEY] = out
    if response is not None:
        response.headers[HEADER_DELEGATE_REASON] = reason_of(out)
        if out.delegate is not None and out.delegate.detail:
            response.headers[HEADER_DELEGATE_DETAIL] = out.delegate.detail.encode("ascii", "replace").decode()
        if out.local:
            response.headers[HEADER_LOCAL] = "true"


_stream_classes: Dict[int, Tuple[type, type]] = {}


def _streams(hx: Any) -> Tuple[type, type]:
    """The watched-stream classes for an httpx-like module (its Response
    wants streams of its own base classes)."""
    got = _stream_classes.get(id(hx))
    if got is not None:
        return got

    class SyncWatched(hx.SyncByteStream):  # type: ignore[misc]
        def __init__(self, it: Iterator[bytes], close: Callable[[], None]) -> None:
            self._it, self._close = it, close

        def __iter__(self) -> Iterator[bytes]:
            return self._it

        def close(self) -> None:
            self._close()

    class AsyncWatched(hx.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, it: AsyncIterator[bytes], close: Callable[[], Any]) -> None:
            self._it, self._close = it, close

        def __aiter__(self) -> AsyncIterator[bytes]:
            return self._it

        async def aclose(self) -> None:
            await self._close()

    _stream_classes[id(hx)] = (SyncWatched, AsyncWatched)
    return SyncWatched, AsyncWatched


class Retrier:
    """Drives the model calls sent through its transports through retryd.
    Safe for concurrent use; the calls of one session must be sequential
    (one agent loop), as retryd's numbering requires.

    client (sync transports) and async_client (async transports) are the
    retryd clients that decide. provider names the provider in reports;
    policy (inline) or policy_name (configured on the server) selects the
    policy, else the server's default for the provider.

    Numbering: the session is the one session() names for the call, else
    session_id, else one made up per Retrier; each model call (one SDK
    call) is the session's next turn, counted from 1 in this process; its
    first attempt is step 1 and each retry the next step. turns= replaces
    it with the harness's own (a function of the request returning a Turn).
    """

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        async_client: Optional[AsyncClient] = None,
        provider: str,
        policy: Optional[policy_pb2.RetryPolicy] = None,
        policy_name: Optional[str] = None,
        session_id: Optional[str] = None,
        turns: Optional[TurnFunc] = None,
    ) -> None:
        if client is None and async_client is None:
            raise ValueError("retryd: a Retrier needs a retryd Client (sync SDK) or AsyncClient (async SDK)")
        if not provider:
            raise ValueError("retryd: a Retrier needs the provider's name, as retryd's policies name it")
        self.client = client
        self.async_client = async_client
        self.provider = provider
        self.policy = policy
        self.policy_name = policy_name
        self.session_id = session_id or "retryd-" + uuid.uuid4().hex
        self._turns = turns
        self._lock = threading.Lock()
        self._next: Dict[str, int] = {}

    def turn(self, request: Any) -> Turn:
        if self._turns is not None:
            t = self._turns(request)
            return t if t.first_step > 0 else Turn(t.session_id, t.turn, 1, t.logical_turn_id)
        sid = _session.get() or self.session_id
        with self._lock:
            n = self._next.get(sid, 0) + 1
            self._next[sid] = n
        return Turn(sid, n)

    def report(self, turn: Turn, step: int, c: Classification) -> pb.FailedStepRequest:
        req = pb.FailedStepRequest(
            session_id=turn.session_id, turn=turn.turn, step=step, provider=self.provider,
            logical_turn_id=turn.logical_turn_id,
        )
        if self.policy is not None:
            req.policy.CopyFrom(self.policy)
        elif self.policy_name:
            req.policy_name = self.policy_name
        return c.apply(req)

    def succeeded_request(self, turn: Turn, step: int) -> pb.StepSucceededRequest:
        return pb.StepSucceededRequest(session_id=turn.session_id, turn=turn.turn, step=step, provider=self.provider)

    # Transports -----------------------------------------------------------

    def transport(self, hx: Any, inner: Any = None) -> Any:
        """A transport of module hx (httpx or httpx2) sending through inner
        (default hx.HTTPTransport()) under retryd's decisions."""
        if self.client is None:
            raise ValueError("retryd: a sync transport needs the Retrier's client= (a retryd.Client)")
        r = self

        class RetrydTransport(hx.BaseTransport):  # type: ignore[misc]
            def __init__(self) -> None:
                self.inner = inner if inner is not None else hx.HTTPTransport()

            def handle_request(self, request: Any) -> Any:
                return _SyncCall(r, hx, self.inner, request).run()

            def close(self) -> None:
                self.inner.close()

        return RetrydTransport()

    def async_transport(self, hx: Any, inner: Any = None) -> Any:
        """transport() for async clients (the Retrier's async_client)."""
        if self.async_client is None:
            raise ValueError("retryd: an async transport needs the Retrier's async_client= (a retryd.AsyncClient)")
        r = self

        class AsyncRetrydTransport(hx.AsyncBaseTransport):  # type: ignore[misc]
            def __init__(self) -> None:
                self.inner = inner if inner is not None else hx.AsyncHTTPTransport()

            async def handle_async_request(self, request: Any) -> Any:
                return await _AsyncCall(r, hx, self.inner, request).run()

            async def aclose(self) -> None:
                await self.inner.aclose()

        return AsyncRetrydTransport()


class _ExceptionFailure(ProviderFailure):
    """An attempt that raised instead of answering: its exception is
    classified by classify_exception, the classifier recover(error=) and
    Failure.from_exception use (a transport error by the shared rules, an
    SDK's status error by its status, anything else UNKNOWN)."""

    def __init__(self, err: BaseException) -> None:
        super().__init__(error=err)


def _classification(f: ProviderFailure) -> Classification:
    if isinstance(f, _ExceptionFailure) and f.error is not None:
        return classify_exception(f.error, output_shown=f.output_shown)
    return classify(f)


def _refused(err: grpc.RpcError, c: Classification, response: Any, provider_error: Optional[BaseException]) -> DecisionError:
    if is_limit_reached(err) is not None:
        return LimitReachedError(err, c, response, provider_error)
    return DecisionError(err, c, response, provider_error)


# Attempt results: (response, error, failure); failure None = success (or a
# watched stream, which reports as it is read).
_Attempt = Tuple[Any, Optional[BaseException], Optional[ProviderFailure]]


class _SyncCall:
    """One model call through a sync transport: its attempts share a turn."""

    def __init__(self, r: Retrier, hx: Any, inner: Any, request: Any) -> None:
        self.r, self.hx, self.inner, self.request = r, hx, inner, request
        assert r.client is not None
        self.client: Client = r.client
        request.read()  # a retry sends the body again
        self.turn = r.turn(request)

    def run(self) -> Any:
        return self.attempts(self.turn.first_step)

    def attempts(self, step: int) -> Any:
        while True:
            response, error, failure = self.attempt(step)
            if failure is None:
                if error is not None:
                    raise error
                return response
            out = self.decide(step, failure, response, error)
            if out.retry:
                if response is not None:
                    response.close()
                step += 1
                continue
            if error is not None:
                setattr(error, OUTCOME_KEY, out)
                raise error
            _attach(response, self.request, out)
            return response

    def decide(self, step: int, failure: ProviderFailure, response: Any, error: Optional[BaseException]) -> Outcome:
        c = _classification(failure)
        try:
            return self.client.recover(self.r.report(self.turn, step, c))
        except grpc.RpcError as err:
            raise _refused(err, c, response, error) from err

    def succeeded(self, step: int) -> None:
        try:
            self.client.step_succeeded(self.r.succeeded_request(self.turn, step))
        except grpc.RpcError as err:
            # The success is the agent's; retryd's chain stays open until
            # the session's next failure.
            log.warning("retryd: StepSucceeded failed: %s", err)

    def attempt(self, step: int) -> _Attempt:
        try:
            response = self.inner.handle_request(self.request)
        except Exception as err:  # noqa: BLE001: reported as what it is (UNKNOWN if unknown), then raised
            return None, err, _ExceptionFailure(err)
        if not 200 <= response.status_code <= 299:
            body = response.read()[:_MAX_BODY]
            return response, None, _failure_of(response, body)
        if _is_sse(response):
            self.watch(response, step)
            return response, None, None
        try:
            body = response.read()
        except self.hx.TransportError as err:
            return None, err, ProviderFailure(http_status=response.status_code, headers=dict(response.headers), error=err)
        if empty_completion(body):
            return response, None, ProviderFailure(http_status=response.status_code, headers=dict(response.headers), empty_completion=True)
        self.succeeded(step)
        return response, None, None

    def watch(self, response: Any, step: int) -> None:
        inner_stream = response.stream
        sync_cls, _ = _streams(self.hx)
        state: List[Any] = [inner_stream]  # the stream being read (replaced on retry)

        def close() -> None:
            state[0].close()

        response.stream = sync_cls(self.relay(response, step, inner_stream, state), close)

    def relay(self, response: Any, step: int, stream: Any, state: List[Any]) -> Iterator[bytes]:
        sse = _SSE()
        headers = dict(response.headers)

        def failure(**kw: Any) -> ProviderFailure:
            return ProviderFailure(http_status=response.status_code, headers=headers, output_shown=sse.shown, **kw)

        def fail(f: ProviderFailure) -> Optional[Any]:
            """Reports a failure of the stream: the retried response, or None
            when retryd did not retry (the outcome is attached)."""
            out = self.decide(step, f, response, f.error)
            if out.retry:
                stream.close()
                retried = self.attempts(step + 1)
                if not 200 <= retried.status_code <= 299:
                    raise DelegatedError(outcome_of(retried) or out, response=retried)
                return retried
            if f.error is not None:
                setattr(f.error, OUTCOME_KEY, out)
            _attach(response, self.request, out)
            return None

        def lines() -> Iterator[bytes]:
            for chunk in stream:
                yield from sse.lines(chunk)
            yield from sse.end()

        retried: Optional[Any] = None
        finished = False
        try:
            for line in lines():
                out, err = sse.feed(line)
                if err is not None:
                    retried = fail(failure(body=err))
                    if retried is not None:
                        break
                    out += sse.flush()
                if sse.done and not finished:
                    # The SDK may stop reading at the terminal event: decide
                    # before it gets there.
                    finished = True
                    if not sse.shown and sse.stopped and outcome_of(response) is None:
                        retried = fail(failure(empty_completion=True))
                        if retried is not None:
                            break
                    elif outcome_of(response) is None:
                        self.succeeded(step)
                    out += sse.flush()
                if out:
                    yield out
        except self.hx.TransportError as e:
            retried = fail(failure(error=e))
            if retried is None:
                rest = sse.flush()
                if rest:
                    yield rest
                raise
        if retried is None and not finished and not sse.shown and sse.stopped and outcome_of(response) is None:
            retried = fail(failure(empty_completion=True))
        if retried is not None:
            state[0] = retried.stream
            yield from retried.stream
            return
        rest = sse.flush()
        if rest:
            yield rest
        if not finished and outcome_of(response) is None:
            self.succeeded(step)


class _AsyncCall:
    """_SyncCall for async transports."""

    def __init__(self, r: Retrier, hx: Any, inner: Any, request: Any) -> None:
        self.r, self.hx, self.inner, self.request = r, hx, inner, request
        assert r.async_client is not None
        self.client: AsyncClient = r.async_client
        self.turn: Optional[Turn] = None

    async def run(self) -> Any:
        await self.request.aread()
        self.turn = self.r.turn(self.request)
        return await self.attempts(self.turn.first_step)

    async def attempts(self, step: int) -> Any:
        while True:
            response, error, failure = await self.attempt(step)
            if failure is None:
                if error is not None:
                    raise error
                return response
            out = await self.decide(step, failure, response, error)
            if out.retry:
                if response is not None:
                    await response.aclose()
                step += 1
                continue
            if error is not None:
                setattr(error, OUTCOME_KEY, out)
                raise error
            _attach(response, self.request, out)
            return response

    async def decide(self, step: int, failure: ProviderFailure, response: Any, error: Optional[BaseException]) -> Outcome:
        assert self.turn is not None
        c = _classification(failure)
        try:
            return await self.client.recover(self.r.report(self.turn, step, c))
        except grpc.RpcError as err:
            raise _refused(err, c, response, error) from err

    async def succeeded(self, step: int) -> None:
        assert self.turn is not None
        try:
            await self.client.step_succeeded(self.r.succeeded_request(self.turn, step))
        except grpc.RpcError as err:
            log.warning("retryd: StepSucceeded failed: %s", err)

    async def attempt(self, step: int) -> _Attempt:
        try:
            response = await self.inner.handle_async_request(self.request)
        except Exception as err:  # noqa: BLE001: reported as what it is (UNKNOWN if unknown), then raised
            return None, err, _ExceptionFailure(err)
        if not 200 <= response.status_code <= 299:
            body = (await response.aread())[:_MAX_BODY]
            return response, None, _failure_of(response, body)
        if _is_sse(response):
            self.watch(response, step)
            return response, None, None
        try:
            body = await response.aread()
        except self.hx.TransportError as err:
            return None, err, ProviderFailure(http_status=response.status_code, headers=dict(response.headers), error=err)
        if empty_completion(body):
            return response, None, ProviderFailure(http_status=response.status_code, headers=dict(response.headers), empty_completion=True)
        await self.succeeded(step)
        return response, None, None

    def watch(self, response: Any, step: int) -> None:
        inner_stream = response.stream
        _, async_cls = _streams(self.hx)
        state: List[Any] = [inner_stream]

        async def close() -> None:
            await state[0].aclose()

        response.stream = async_cls(self.relay(response, step, inner_stream, state), close)

    async def relay(self, response: Any, step: int, stream: Any, state: List[Any]) -> AsyncIterator[bytes]:
        sse = _SSE()
        headers = dict(response.headers)

        def failure(**kw: Any) -> ProviderFailure:
            return ProviderFailure(http_status=response.status_code, headers=headers, output_shown=sse.shown, **kw)

        async def fail(f: ProviderFailure) -> Optional[Any]:
            out = await self.decide(step, f, response, f.error)
            if out.retry:
                await stream.aclose()
                retried = await self.attempts(step + 1)
                if not 200 <= retried.status_code <= 299:
                    raise DelegatedError(outcome_of(retried) or out, response=retried)
                return retried
            if f.error is not None:
                setattr(f.error, OUTCOME_KEY, out)
            _attach(response, self.request, out)
            return None

        async def lines() -> AsyncIterator[bytes]:
            async for chunk in stream:
                for line in sse.lines(chunk):
                    yield line
            for line in sse.end():
                yield line

        retried: Optional[Any] = None
        finished = False
        try:
            async for line in lines():
                out, err = sse.feed(line)
                if err is not None:
                    retried = await fail(failure(body=err))
                    if retried is not None:
                        break
                    out += sse.flush()
                if sse.done and not finished:
                    # The SDK may stop reading at the terminal event: decide
                    # before it gets there.
                    finished = True
                    if not sse.shown and sse.stopped and outcome_of(response) is None:
                        retried = await fail(failure(empty_completion=True))
                        if retried is not None:
                            break
                    elif outcome_of(response) is None:
                        await self.succeeded(step)
                    out += sse.flush()
                if out:
                    yield out
        except self.hx.TransportError as e:
            retried = await fail(failure(error=e))
            if retried is None:
                rest = sse.flush()
                if rest:
                    yield rest
                raise
        if retried is None and not finished and not sse.shown and sse.stopped and outcome_of(response) is None:
            retried = await fail(failure(empty_completion=True))
        if retried is not None:
            state[0] = retried.stream
            async for chunk in retried.stream:
                yield chunk
            return
        rest = sse.flush()
        if rest:
            yield rest
        if not finished and outcome_of(response) is None:
            await self.succeeded(step)


def sdk_options(retrier: Retrier, hx: Any, *, is_async: bool, inner: Any = None, **client_kwargs: Any) -> Dict[str, Any]:
    """The keyword arguments that hand an openai or anthropic SDK client's
    retries to retryd: max_retries=0 and an http_client of module hx with
    the Retrier's transport."""
    if is_async:
        http = hx.AsyncClient(transport=retrier.async_transport(hx, inner), **client_kwargs)
    else:
        http = hx.Client(transport=retrier.transport(hx, inner), **client_kwargs)
    return {"max_retries": 0, "http_client": http}

