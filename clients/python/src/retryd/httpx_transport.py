"""An httpx transport that lets retryd decide the retries of the model
requests sent through it: for any HTTP SDK built on httpx (the openai and
anthropic SDKs take an httpx client; turn their own retries off, e.g.
``max_retries=0``).

Each failed request (an HTTP error status, or a transport error) is
classified (retryd.classify) and reported with recover(); on "retry" the
request is sent again, as the next step; on "delegate" (or a retry
cancelled) the provider's response is returned as it came, or its exception
raised, for the SDK and the agent to handle, with the outcome attached as
``response.extensions["retryd_outcome"]`` (on an exception, its
``retryd_outcome`` attribute). A success reports StepSucceeded.

Numbering: every attempt is a step of one session's turn. By default the
transport numbers steps 1, 2, 3, ... itself and reports turn 1; pass
``turn`` to supply the harness's turn, and ``session_id`` as a function of
the request to map requests to sessions. A failure inside a response that
already streamed output to the user is not seen here (the response was
returned): report it with replay unsafe (classify's output_shown).

Requires httpx (Debian's python3-httpx); the rest of the package does not.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Optional, Set, Union

import httpx

from .aio import AsyncClient
from .classify import Classification, ProviderFailure, classify
from .client import Client
from .outcome import Outcome
from .v1 import policy_pb2, retry_service_pb2 as pb

#: The key of the outcome in a returned response's extensions.
OUTCOME_EXTENSION = "retryd_outcome"

SessionOf = Union[str, Callable[[httpx.Request], str]]


class _Numbering:
    """The session, turn and steps of the requests of one transport."""

    def __init__(self, session_id: SessionOf, turn: Optional[Callable[[], int]]) -> None:
        self._session = session_id
        self._turn = turn or (lambda: 1)
        self._steps = itertools.count(1)
        self._lock = threading.Lock()

    def session(self, request: httpx.Request) -> str:
        return self._session if isinstance(self._session, str) else self._session(request)

    def turn(self) -> int:
        return self._turn()

    def next_step(self) -> int:
        with self._lock:
            return next(self._steps)


class _Reporting:
    """What both transports share: building reports from failures."""

    def __init__(
        self,
        session_id: SessionOf,
        provider: str,
        policy: Optional[policy_pb2.RetryPolicy],
        policy_name: Optional[str],
        turn: Optional[Callable[[], int]],
    ) -> None:
        if not provider:
            raise ValueError("retryd: the transport needs the provider's name (as the adapter reports it)")
        self.numbering = _Numbering(session_id, turn)
        self.provider = provider
        self.policy = policy
        self.policy_name = policy_name

    def report(self, session: str, turn: int, step: int, c: Classification) -> pb.FailedStepRequest:
        req = pb.FailedStepRequest(session_id=session, turn=turn, step=step, provider=self.provider)
        if self.policy is not None:
            req.policy.CopyFrom(self.policy)
        elif self.policy_name is not None:
            req.policy_name = self.policy_name
        return c.apply(req)

    @staticmethod
    def response_failure(response: httpx.Response) -> ProviderFailure:
        return ProviderFailure(http_status=response.status_code, headers=dict(response.headers), body=response.content)


class RetrydTransport(httpx.BaseTransport):
    """Wraps transport (default httpx.HTTPTransport()) for a synchronous
    httpx.Client; see the module's documentation."""

    def __init__(
        self,
        client: Client,
        *,
        session_id: SessionOf,
        provider: str,
        policy: Optional[policy_pb2.RetryPolicy] = None,
        policy_name: Optional[str] = None,
        turn: Optional[Callable[[], int]] = None,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._client = client
        self._r = _Reporting(session_id, provider, policy, policy_name, turn)
        self._inner = transport or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # a retry sends the body again
        session = self._r.numbering.session(request)
        while True:
            step = self._r.numbering.next_step()
            turn = self._r.numbering.turn()
            try:
                response = self._inner.handle_request(request)
            except httpx.TransportError as err:
                out = self._client.recover(self._r.report(session, turn, step, classify(ProviderFailure(error=err))))
                if out.retry:
                    continue
                setattr(err, OUTCOME_EXTENSION, out)
                raise
            if response.status_code < 400:
                self._client.step_succeeded(pb.StepSucceededRequest(session_id=session, turn=turn, step=step, provider=self._r.provider))
                return response
            response.read()
            out = self._client.recover(self._r.report(session, turn, step, classify(self._r.response_failure(response))))
            if out.retry:
                response.close()
                continue
            return _with_outcome(response, out)

    def close(self) -> None:
        self._inner.close()


class AsyncRetrydTransport(httpx.AsyncBaseTransport):
    """RetrydTransport for an httpx.AsyncClient, over a retryd.AsyncClient."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        session_id: SessionOf,
        provider: str,
        policy: Optional[policy_pb2.RetryPolicy] = None,
        policy_name: Optional[str] = None,
        turn: Optional[Callable[[], int]] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._client = client
        self._r = _Reporting(session_id, provider, policy, policy_name, turn)
        self._inner = transport or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        session = self._r.numbering.session(request)
        while True:
            step = self._r.numbering.next_step()
            turn = self._r.numbering.turn()
            try:
                response = await self._inner.handle_async_request(request)
            except httpx.TransportError as err:
                out = await self._client.recover(self._r.report(session, turn, step, classify(ProviderFailure(error=err))))
                if out.retry:
                    continue
                setattr(err, OUTCOME_EXTENSION, out)
                raise
            if response.status_code < 400:
                await self._client.step_succeeded(
                    pb.StepSucceededRequest(session_id=session, turn=turn, step=step, provider=self._r.provider)
                )
                return response
            await response.aread()
            out = await self._client.recover(self._r.report(session, turn, step, classify(self._r.response_failure(response))))
            if out.retry:
                await response.aclose()
                continue
            return _with_outcome(response, out)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _with_outcome(response: httpx.Response, out: Outcome) -> httpx.Response:
    # httpx types extensions as a Mapping; the transports make it a dict.
    extensions = response.extensions
    if not isinstance(extensions, dict):
        extensions = dict(extensions)
        response.extensions = extensions
    extensions[OUTCOME_EXTENSION] = out
    return response


def outcome_of(x: Union[httpx.Response, BaseException]) -> Optional[Outcome]:
    """The retryd outcome a transport attached to a response it returned or
    an exception it raised (following __cause__ and __context__, as an SDK
    wraps httpx's errors), or None."""
    if isinstance(x, httpx.Response):
        o = x.extensions.get(OUTCOME_EXTENSION)
        return o if isinstance(o, Outcome) else None
    seen: Set[int] = set()
    e: Optional[BaseException] = x
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        o = getattr(e, OUTCOME_EXTENSION, None)
        if isinstance(o, Outcome):
            return o
        e = e.__cause__ if e.__cause__ is not None else e.__context__
    return None
