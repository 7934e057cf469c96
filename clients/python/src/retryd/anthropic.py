"""retryd for the anthropic SDK (2.x): retryd decides the retries of the model
calls an agent makes through ``anthropic.Anthropic`` and ``anthropic.AsyncAnthropic``.

The SDK's own retries are turned off (``max_retries=0``) and its HTTP client
(httpx2, the SDK's own) gets retryd's transport, the one place that sees
every attempt's status, headers and body, streams included::

    r = retryd.anthropic.Retrier(client)
    sdk = anthropic.Anthropic(api_key=key, **r.client_options())
    with retryd.anthropic.session(session_id):
        message = sdk.messages.create(model=..., max_tokens=..., messages=...)

Each failed attempt (an error status, an error event inside a 200 stream, an
empty completion, a transport error) is classified and reported with
recover(): on retry the request is sent again after retryd's Started; on a
delegation the SDK raises its own error for the provider's answer, and
``delegate_reason(err)`` / ``outcome_of(err)`` read retryd's answer from it.
Anthropic's ``529 overloaded_error`` is SERVER, an ``event: error`` inside a
stream is classified by its error type. A retryd refusal raises
``DecisionError``, as the subclass that is also recover()'s typed refusal
(``LimitReachedError``, a ``retryd.LimitReachedError``, with the delay
retryd asked for). See retryd._middleware for streams and numbering.
"""

from __future__ import annotations

from typing import Optional

from ._middleware import (
    HEADER_DELEGATE_DETAIL,
    HEADER_DELEGATE_REASON,
    HEADER_LOCAL,
    DecisionError,
    decision_error,
    DelegatedError,
    LimitReachedError,
    Turn,
    TurnFunc,
    delegate_reason,
    outcome_of,
    session,
)
from ._sdk import SDKRetrier
from .aio import AsyncClient
from .client import Client
from .v1 import policy_pb2


class Retrier(SDKRetrier):
    """Drives the anthropic SDK's model calls through retryd (provider
    "anthropic" unless named).

    The SDK's own middleware (``middleware=``) runs per attempt above the
    HTTP client and hands a stream to the caller unread; the transport
    reads the stream's events as they arrive, so an ``event: error`` before
    any text is retried unseen."""

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        async_client: Optional[AsyncClient] = None,
        provider: str = "anthropic",
        policy: Optional[policy_pb2.RetryPolicy] = None,
        policy_name: Optional[str] = None,
        session_id: Optional[str] = None,
        turns: Optional[TurnFunc] = None,
    ) -> None:
        super().__init__(client, async_client=async_client, provider=provider, policy=policy, policy_name=policy_name,
                         session_id=session_id, turns=turns)


__all__ = [
    "DecisionError",
    "decision_error",
    "DelegatedError",
    "HEADER_DELEGATE_DETAIL",
    "HEADER_DELEGATE_REASON",
    "HEADER_LOCAL",
    "LimitReachedError",
    "Retrier",
    "Turn",
    "TurnFunc",
    "delegate_reason",
    "outcome_of",
    "session",
]
