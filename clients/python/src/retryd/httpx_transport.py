"""An httpx transport that lets retryd decide the retries of the model
requests sent through it, for any HTTP SDK built on httpx (the openai and
anthropic SDKs use httpx2 since their 3.x and 2.x releases: see
retryd.openai and retryd.anthropic, which use the same engine).

Each failed request (an HTTP error status, an error event inside a 200
stream, an empty completion, a transport error) is classified
(retryd.classify) and reported with recover(); on "retry" the request is
sent again, as the next step; on "delegate" (or a retry cancelled) the
provider's response is returned as it came, or its exception raised, with
the outcome attached (``outcome_of``). A stream is held back until its
first event with content, so a failure before it is retried unseen and one
after it is reported replay-unsafe. A success reports StepSucceeded.

Numbering: each request is the next turn of its session (``session_id``, a
string or a function of the request), its first attempt step 1 and each
retry the next step; ``turn`` (a function) supplies the harness's turn
number instead.

Requires httpx; the rest of the package does not.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Union

import httpx

from ._middleware import OUTCOME_KEY, Retrier, Turn, outcome_of
from .aio import AsyncClient
from .client import Client
from .v1 import policy_pb2

#: The key of the outcome in a returned response's extensions.
OUTCOME_EXTENSION = OUTCOME_KEY

SessionOf = Union[str, Callable[[httpx.Request], str]]


def _turns(session_id: SessionOf, turn: Optional[Callable[[], int]]) -> Callable[[httpx.Request], Turn]:
    lock = threading.Lock()
    counts: Dict[str, int] = {}

    def of(request: httpx.Request) -> Turn:
        sid = session_id if isinstance(session_id, str) else session_id(request)
        if turn is not None:
            return Turn(sid, turn())
        with lock:
            counts[sid] = counts.get(sid, 0) + 1
            return Turn(sid, counts[sid])

    return of


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
        r = Retrier(client, provider=provider, policy=policy, policy_name=policy_name, turns=_turns(session_id, turn))
        self._inner = transport or httpx.HTTPTransport()
        self._t: httpx.BaseTransport = r.transport(httpx, self._inner)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._t.handle_request(request)

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
        r = Retrier(async_client=client, provider=provider, policy=policy, policy_name=policy_name,
                    turns=_turns(session_id, turn))
        self._inner = transport or httpx.AsyncHTTPTransport()
        self._t: httpx.AsyncBaseTransport = r.async_transport(httpx, self._inner)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._t.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = ["AsyncRetrydTransport", "OUTCOME_EXTENSION", "RetrydTransport", "outcome_of"]
