"""The Retrier: what the SDK modules configure (the retryd clients, the
provider, the policy, the numbering) and the transports it builds for an
httpx-like module (httpx, httpx2). RetrierBase is the configuration and
the reports it makes, which retryd.langgraph's Retrier shares."""

from __future__ import annotations

import threading
import uuid
from typing import Any, ClassVar, Dict, Optional, Tuple

from ..aio import AsyncClient
from ..classify import Classification
from ..client import Client
from ..v1 import policy_pb2, retry_service_pb2 as pb
from .calls import AsyncCall, SyncCall
from .numbering import Turn, TurnFunc, _session


class RetrierBase:
    """What every integration's Retrier is configured with and reports:
    the retryd clients that decide (client for sync calls, async_client for
    async ones), the provider named in reports, the policy (inline, or
    policy_name configured on the server, else the server's default for
    the provider) and the session of calls no session() names. Subclasses
    add their numbering (turns); _serves names what each client serves in
    the error raised without either."""

    _serves: ClassVar[Tuple[str, str]] = ("sync SDK", "async SDK")

    def __init__(
        self,
        client: Optional[Client],
        async_client: Optional[AsyncClient],
        provider: str,
        policy: Optional[policy_pb2.RetryPolicy],
        policy_name: Optional[str],
        session_id: Optional[str],
    ) -> None:
        if client is None and async_client is None:
            raise ValueError(
                f"retryd: a Retrier needs a retryd Client ({self._serves[0]}) or AsyncClient ({self._serves[1]})"
            )
        if not provider:
            raise ValueError("retryd: a Retrier needs the provider's name, as retryd's policies name it")
        self.client = client
        self.async_client = async_client
        self.provider = provider
        self.policy = policy
        self.policy_name = policy_name
        self.session_id = session_id or "retryd-" + uuid.uuid4().hex
        self._lock = threading.Lock()

    def report(self, turn: Turn, step: int, c: Classification) -> pb.FailedStepRequest:
        """The FailedStep of attempt step of turn, failed as c says."""
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


class Retrier(RetrierBase):
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
        super().__init__(client, async_client, provider, policy, policy_name, session_id)
        self._turns = turns
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
                return SyncCall(r, hx, self.inner, request).run()

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
                return await AsyncCall(r, hx, self.inner, request).run()

            async def aclose(self) -> None:
                await self.inner.aclose()

        return AsyncRetrydTransport()


def sdk_options(retrier: Retrier, hx: Any, *, is_async: bool, inner: Any = None, **client_kwargs: Any) -> Dict[str, Any]:
    """The keyword arguments that hand an openai or anthropic SDK client's
    retries to retryd: max_retries=0 and an http_client of module hx with
    the Retrier's transport."""
    if is_async:
        http = hx.AsyncClient(transport=retrier.async_transport(hx, inner), **client_kwargs)
    else:
        http = hx.Client(transport=retrier.transport(hx, inner), **client_kwargs)
    return {"max_retries": 0, "http_client": http}
