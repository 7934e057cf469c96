"""One model call through a retryd transport (sync and async): its
attempts, each failure classified and reported with recover() under the
call's turn, a retry sent again, a delegation handed back, and a stream
watched (retryd._middleware.sse) as the SDK reads it."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Callable, Dict, Iterator, List, Optional, Tuple

import grpc

from ..aio import AsyncClient
from ..classify import Classification, ProviderFailure, classify, classify_exception
from ..client import Client
from ..outcome import Outcome
from ..v1 import events_pb2
from .errors import DelegatedError, refused
from .numbering import Turn
from .outcome import OUTCOME_KEY, attach, outcome_of
from .spans import CallSpans
from .sse import SSE, empty_completion, is_sse

if TYPE_CHECKING:
    from .retrier import Retrier

log = logging.getLogger("retryd.middleware")

# How much of an error body or a non-streamed completion is read to
# classify it (as the Go middleware).
_MAX_BODY = 4 << 20


def _failure_of(response: Any, **kw: Any) -> ProviderFailure:
    """The failure of an attempt answered with response (its status and
    headers), as kw (body, error, empty_completion) adds."""
    return ProviderFailure(http_status=response.status_code, headers=dict(response.headers), **kw)


def _hand_back(out: Outcome, request: Any, response: Any, error: Optional[BaseException]) -> None:
    """Leaves retryd's answer (not a retry) where the caller finds it: on
    the exception the attempt raised and on the response handed back (and
    its request)."""
    if error is not None:
        setattr(error, OUTCOME_KEY, out)
    if response is not None:
        attach(response, request, out)


def _check_retried(retried: Any, out: Outcome) -> Any:
    """The response of a stream's retry, which replaces the stream: a
    retry that ended in an error status (delegated) cannot, and raises."""
    if not 200 <= retried.status_code <= 299:
        raise DelegatedError(outcome_of(retried) or out, response=retried)
    return retried


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


# Attempt results: (response, error, failure); failure None = success (or a
# watched stream, which reports as it is read).
_Attempt = Tuple[Any, Optional[BaseException], Optional[ProviderFailure]]


class SyncCall:
    """One model call through a sync transport: its attempts share a turn."""

    def __init__(self, r: "Retrier", hx: Any, inner: Any, request: Any) -> None:
        self.r, self.hx, self.inner, self.request = r, hx, inner, request
        assert r.client is not None
        self.client: Client = r.client
        request.read()  # a retry sends the body again
        self.turn = r.turn(request)
        self.spans = CallSpans(self.client._tracer, self.turn, r.provider)
        self.watching = False  # a watched stream ends the spans when it ends

    def run(self) -> Any:
        try:
            return self.attempts(self.turn.first_step, None)
        except BaseException as e:
            self.spans.fail(e)
            raise
        finally:
            if not self.watching:
                self.spans.end()

    def attempts(self, step: int, started: Optional[events_pb2.RetryStarted]) -> Any:
        while True:
            response, error, failure = self.attempt(step, started)
            if failure is None:
                if error is not None:
                    raise error
                return response
            out = self.decide(step, failure, response, error)
            if out.retry:
                if response is not None:
                    response.close()
                step += 1
                started = out.started
                continue
            _hand_back(out, self.request, response, error)
            if error is not None:
                raise error
            return response

    def decide(self, step: int, failure: ProviderFailure, response: Any, error: Optional[BaseException]) -> Outcome:
        c = _classification(failure)
        try:
            with self.spans.current():
                return self.client.recover(self.r.report(self.turn, step, c))
        except grpc.RpcError as err:
            raise refused(err, c, response, error) from err

    def succeeded(self, step: int) -> None:
        try:
            with self.spans.current():
                self.client.step_succeeded(self.r.succeeded_request(self.turn, step))
        except grpc.RpcError as err:
            # The success is the agent's; retryd's chain stays open until
            # the session's next failure.
            log.warning("retryd: StepSucceeded failed: %s", err)

    def attempt(self, step: int, started: Optional[events_pb2.RetryStarted]) -> _Attempt:
        self.spans.attempt(step, started)
        try:
            with self.spans.current():
                response = self.inner.handle_request(self.request)
        except Exception as err:  # noqa: BLE001: reported as what it is (UNKNOWN if unknown), then raised
            return None, err, _ExceptionFailure(err)
        if not 200 <= response.status_code <= 299:
            body = response.read()[:_MAX_BODY]
            return response, None, _failure_of(response, body=body)
        if is_sse(response):
            self.watch(response, step)
            return response, None, None
        try:
            body = response.read()
        except self.hx.TransportError as err:
            return None, err, _failure_of(response, error=err)
        if empty_completion(body):
            return response, None, _failure_of(response, empty_completion=True)
        self.succeeded(step)
        return response, None, None

    def watch(self, response: Any, step: int) -> None:
        inner_stream = response.stream
        sync_cls, _ = _streams(self.hx)
        state: List[Any] = [inner_stream]  # the stream being read (replaced on retry)
        self.watching = True

        def close() -> None:
            try:
                state[0].close()
            finally:
                self.spans.end()

        response.stream = sync_cls(self.relay(response, step, inner_stream, state), close)

    def relay(self, response: Any, step: int, stream: Any, state: List[Any]) -> Iterator[bytes]:
        """The watched stream the SDK reads; the call's spans end with it."""
        try:
            yield from self._relay(response, step, stream, state)
        except Exception as e:
            self.spans.fail(e)
            raise
        finally:
            self.spans.end()

    def _relay(self, response: Any, step: int, stream: Any, state: List[Any]) -> Iterator[bytes]:
        sse = SSE()
        headers = dict(response.headers)

        def failure(**kw: Any) -> ProviderFailure:
            return ProviderFailure(http_status=response.status_code, headers=headers, output_shown=sse.shown, **kw)

        def fail(f: ProviderFailure) -> Optional[Any]:
            """Reports a failure of the stream: the retried response, or None
            when retryd did not retry (the outcome is attached)."""
            out = self.decide(step, f, response, f.error)
            if out.retry:
                stream.close()
                return _check_retried(self.attempts(step + 1, out.started), out)
            _hand_back(out, self.request, response, f.error)
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


class AsyncCall:
    """SyncCall for async transports."""

    def __init__(self, r: "Retrier", hx: Any, inner: Any, request: Any) -> None:
        self.r, self.hx, self.inner, self.request = r, hx, inner, request
        assert r.async_client is not None
        self.client: AsyncClient = r.async_client
        self.turn: Optional[Turn] = None
        self.spans = CallSpans(None, Turn("", 0), r.provider)  # run() replaces it once the turn is known
        self.watching = False

    async def run(self) -> Any:
        await self.request.aread()
        self.turn = self.r.turn(self.request)
        self.spans = CallSpans(self.client._tracer, self.turn, self.r.provider)
        try:
            return await self.attempts(self.turn.first_step, None)
        except BaseException as e:
            self.spans.fail(e)
            raise
        finally:
            if not self.watching:
                self.spans.end()

    async def attempts(self, step: int, started: Optional[events_pb2.RetryStarted]) -> Any:
        while True:
            response, error, failure = await self.attempt(step, started)
            if failure is None:
                if error is not None:
                    raise error
                return response
            out = await self.decide(step, failure, response, error)
            if out.retry:
                if response is not None:
                    await response.aclose()
                step += 1
                started = out.started
                continue
            _hand_back(out, self.request, response, error)
            if error is not None:
                raise error
            return response

    async def decide(self, step: int, failure: ProviderFailure, response: Any, error: Optional[BaseException]) -> Outcome:
        assert self.turn is not None
        c = _classification(failure)
        try:
            with self.spans.current():
                return await self.client.recover(self.r.report(self.turn, step, c))
        except grpc.RpcError as err:
            raise refused(err, c, response, error) from err

    async def succeeded(self, step: int) -> None:
        assert self.turn is not None
        try:
            with self.spans.current():
                await self.client.step_succeeded(self.r.succeeded_request(self.turn, step))
        except grpc.RpcError as err:
            log.warning("retryd: StepSucceeded failed: %s", err)

    async def attempt(self, step: int, started: Optional[events_pb2.RetryStarted]) -> _Attempt:
        self.spans.attempt(step, started)
        try:
            with self.spans.current():
                response = await self.inner.handle_async_request(self.request)
        except Exception as err:  # noqa: BLE001: reported as what it is (UNKNOWN if unknown), then raised
            return None, err, _ExceptionFailure(err)
        if not 200 <= response.status_code <= 299:
            body = (await response.aread())[:_MAX_BODY]
            return response, None, _failure_of(response, body=body)
        if is_sse(response):
            self.watch(response, step)
            return response, None, None
        try:
            body = await response.aread()
        except self.hx.TransportError as err:
            return None, err, _failure_of(response, error=err)
        if empty_completion(body):
            return response, None, _failure_of(response, empty_completion=True)
        await self.succeeded(step)
        return response, None, None

    def watch(self, response: Any, step: int) -> None:
        inner_stream = response.stream
        _, async_cls = _streams(self.hx)
        state: List[Any] = [inner_stream]
        self.watching = True

        async def close() -> None:
            try:
                await state[0].aclose()
            finally:
                self.spans.end()

        response.stream = async_cls(self.relay(response, step, inner_stream, state), close)

    async def relay(self, response: Any, step: int, stream: Any, state: List[Any]) -> AsyncIterator[bytes]:
        """The watched stream the SDK reads; the call's spans end with it."""
        try:
            async with contextlib.aclosing(self._relay(response, step, stream, state)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except Exception as e:
            self.spans.fail(e)
            raise
        finally:
            self.spans.end()

    async def _relay(self, response: Any, step: int, stream: Any, state: List[Any]) -> AsyncGenerator[bytes, None]:
        sse = SSE()
        headers = dict(response.headers)

        def failure(**kw: Any) -> ProviderFailure:
            return ProviderFailure(http_status=response.status_code, headers=headers, output_shown=sse.shown, **kw)

        async def fail(f: ProviderFailure) -> Optional[Any]:
            out = await self.decide(step, f, response, f.error)
            if out.retry:
                await stream.aclose()
                return _check_retried(await self.attempts(step + 1, out.started), out)
            _hand_back(out, self.request, response, f.error)
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
