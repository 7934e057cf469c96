"""retryd for LangGraph (1.x): a node that calls a model gets retryd's
decisions through LangGraph's own retry path, its ``RetryPolicy``.

LangGraph retries a node when a policy's ``retry_on`` returns True for the
exception the node raised, after a wait it computes from the policy's
interval. ``Retrier.retry_policy()`` is a RetryPolicy whose ``retry_on``
answers retryd's decision and whose interval is zero, and
``Retrier.node(fn)`` wraps the node so that a failed attempt is reported
(``recover()``, in the node's own thread or task, waiting for retryd's
Started there: LangGraph calls ``retry_on`` synchronously, also on the
event loop of an async graph, so the wait cannot happen inside it)::

    r = retryd.langgraph.Retrier(client, provider="openai")
    builder.add_node("model", r.node(call_model), retry_policy=r.retry_policy())

LangGraph then re-runs the node, or raises its exception when retryd
delegated (``delegate_reason(err)``). The exception is classified with
``classify_exception``: an SDK's status error with its headers, a transport
failure, and UNKNOWN (not retried by default) for anything else. The node's
own SDK must not retry (``max_retries=0``).

Numbering: the session is the one ``session()`` names, else the run's
``thread_id``, else ``session_id``; each LangGraph task of a wrapped node is
the session's next turn, its first attempt step 1 and each re-run the next
step. Success reports StepSucceeded.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple, TypeVar, cast

import grpc
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp
from langgraph.types import RetryPolicy

from ._middleware import (
    OUTCOME_KEY,
    DecisionError,
    decision_error,
    LimitReachedError,
    RetrierBase,
    Turn,
    _refused,
    _session,
    delegate_reason,
    outcome_of,
    session,
)
from .aio import AsyncClient
from .classify import CODE_UNKNOWN, Classification, classify_exception
from .client import Client
from .outcome import Outcome
from .v1 import policy_pb2, retry_service_pb2 as pb

F = TypeVar("F", bound=Callable[..., Any])

_TASK_ID = "__pregel_task_id"


class Retrier(RetrierBase):
    """Hands the retries of wrapped LangGraph nodes to retryd: client for
    sync nodes, async_client for async ones; provider, policy and
    policy_name as in every report."""

    _serves = ("sync nodes", "async nodes")

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        async_client: Optional[AsyncClient] = None,
        provider: str,
        policy: Optional[policy_pb2.RetryPolicy] = None,
        policy_name: Optional[str] = None,
        session_id: Optional[str] = None,
        classify: Callable[[BaseException], Classification] = classify_exception,
    ) -> None:
        super().__init__(client, async_client, provider, policy, policy_name, session_id)
        self.classify = classify
        self._turns: Dict[str, int] = {}
        self._tasks: Dict[str, Tuple[Turn, int]] = {}

    def retry_policy(self) -> RetryPolicy:
        """A RetryPolicy that retries exactly when retryd said retry, with no
        wait of LangGraph's own (retryd's wait happened in the node) and no
        attempt limit of its own (the policy's budget is retryd's)."""
        return RetryPolicy(initial_interval=0.0, backoff_factor=1.0, max_interval=0.0, max_attempts=2**31 - 1,
                           jitter=False, retry_on=self.retry_on)

    def retry_on(self, exc: Exception) -> bool:
        """LangGraph's retry_on: True when retryd decided to retry the failed
        attempt that raised exc (and its Started came)."""
        out = getattr(exc, OUTCOME_KEY, None)
        return isinstance(out, Outcome) and out.retry

    def node(self, fn: F) -> F:
        """Wraps a node function (sync or async; its signature, which
        LangGraph reads, is kept) so that its failures are reported to
        retryd and its successes recorded."""
        if inspect.iscoroutinefunction(fn):
            afn = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def anode(*args: Any, **kwargs: Any) -> Any:
                if self.async_client is None:
                    raise ValueError("retryd: an async node needs the Retrier's async_client")
                turn, step = self._attempt()
                try:
                    result = await afn(*args, **kwargs)
                except GraphBubbleUp:
                    raise
                except Exception as exc:
                    c = self.classify(exc)
                    try:
                        out = await self.async_client.recover(self.report(turn, step, c))
                    except grpc.RpcError as err:
                        raise _refused(err, c, None, exc) from err
                    self._decided(exc, out)
                    raise
                try:
                    await self.async_client.step_succeeded(self._succeeded(turn, step))
                except grpc.RpcError:
                    pass  # retryd's chain stays open until the session's next failure
                return result

            return cast(F, anode)

        @functools.wraps(fn)
        def snode(*args: Any, **kwargs: Any) -> Any:
            if self.client is None:
                raise ValueError("retryd: a sync node needs the Retrier's client")
            turn, step = self._attempt()
            try:
                result = fn(*args, **kwargs)
            except GraphBubbleUp:
                raise
            except Exception as exc:
                c = self.classify(exc)
                try:
                    out = self.client.recover(self.report(turn, step, c))
                except grpc.RpcError as err:
                    raise _refused(err, c, None, exc) from err
                self._decided(exc, out)
                raise
            try:
                self.client.step_succeeded(self._succeeded(turn, step))
            except grpc.RpcError:
                pass
            return result

        return cast(F, snode)

    def _attempt(self) -> Tuple[Turn, int]:
        """The turn and step of this attempt: a new task is the session's
        next turn, a re-run of a task its next step."""
        try:
            configurable: Dict[str, Any] = dict(get_config().get("configurable") or {})
        except RuntimeError:  # called outside a graph run
            configurable = {}
        task = str(configurable.get(_TASK_ID) or uuid.uuid4().hex)
        sid = _session.get() or str(configurable.get("thread_id") or "") or self.session_id
        with self._lock:
            known = self._tasks.get(task)
            if known is None:
                n = self._turns.get(sid, 0) + 1
                self._turns[sid] = n
                known = (Turn(sid, n), 0)
            turn, step = known[0], known[1] + 1
            self._tasks[task] = (turn, step)
            if len(self._tasks) > 10_000:  # tasks that ended without a decision (interrupts)
                self._tasks.pop(next(iter(self._tasks)))
        return turn, step

    def _decided(self, exc: Exception, out: Outcome) -> None:
        setattr(exc, OUTCOME_KEY, out)
        if not out.retry:
            self._forget(out.event.session_id)

    def _forget(self, session_id: str) -> None:
        with self._lock:
            for k in [k for k, (t, _) in self._tasks.items() if t.session_id == session_id]:
                del self._tasks[k]

    def _succeeded(self, turn: Turn, step: int) -> pb.StepSucceededRequest:
        self._forget(turn.session_id)
        return self.succeeded_request(turn, step)


__all__ = [
    "CODE_UNKNOWN",
    "DecisionError",
    "LimitReachedError",
    "Retrier",
    "classify_exception",
    "decision_error",
    "delegate_reason",
    "outcome_of",
    "session",
]
