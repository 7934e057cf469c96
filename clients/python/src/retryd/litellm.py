"""retryd for LiteLLM: the completion calls LiteLLM makes to an
OpenAI-compatible provider, decided by retryd instead of LiteLLM's retries.

LiteLLM's own retry paths take no decision from outside: ``completion``'s
``num_retries`` re-runs the call through tenacity with a fixed strategy
(constant or exponential, a count), and the Router decides retries,
fallbacks and cooldowns in its Rust core from counts per exception type
(``RetryPolicy``); their callbacks observe failures but cannot answer
"retry after this delay". So the integration is one layer down, where
LiteLLM lets the caller supply the provider client: ``client=`` takes an
``openai.OpenAI`` (or ``AsyncOpenAI``) whose HTTP client carries retryd's
transport (retryd.openai), and LiteLLM's retries are off::

    r = retryd.litellm.Retrier(client, provider="openai")
    resp = litellm.completion(model="openai/gpt-4o", messages=messages,
                              **r.completion_kwargs(api_base=url, api_key=key))

Every attempt then reaches retryd (error statuses with their headers,
in-stream errors, empty completions, transport errors, streaming or not);
a delegation reaches LiteLLM as the provider's answer and LiteLLM raises its
mapped exception (``delegate_reason(err)`` reads retryd's reason from it).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import httpx2
import openai

from ._middleware import (
    DecisionError,
    decision_error,
    DelegatedError,
    LimitReachedError,
    Retrier as _Retrier,
    TurnFunc,
    delegate_reason,
    outcome_of,
    sdk_options,
    session,
)
from .aio import AsyncClient
from .client import Client
from .v1 import policy_pb2


class Retrier(_Retrier):
    """Hands the retries of LiteLLM's calls to an OpenAI-compatible provider
    to retryd (provider "openai" unless named)."""

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        async_client: Optional[AsyncClient] = None,
        provider: str = "openai",
        policy: Optional[policy_pb2.RetryPolicy] = None,
        policy_name: Optional[str] = None,
        session_id: Optional[str] = None,
        turns: Optional[TurnFunc] = None,
    ) -> None:
        super().__init__(client, async_client=async_client, provider=provider, policy=policy, policy_name=policy_name,
                         session_id=session_id, turns=turns)

    def completion_kwargs(self, *, api_base: str, api_key: str, **openai_kwargs: Any) -> Dict[str, Any]:
        """The keyword arguments for ``litellm.completion``: ``client`` (an
        openai.OpenAI for api_base with retryd's transport, its retries
        off), ``num_retries=0`` and ``max_retries=0``."""
        sdk = openai.OpenAI(base_url=api_base, api_key=api_key, **sdk_options(self, httpx2, is_async=False), **openai_kwargs)
        return {"client": sdk, "num_retries": 0, "max_retries": 0}

    def acompletion_kwargs(self, *, api_base: str, api_key: str, **openai_kwargs: Any) -> Dict[str, Any]:
        """completion_kwargs() for ``litellm.acompletion`` (the Retrier's
        async_client)."""
        sdk = openai.AsyncOpenAI(base_url=api_base, api_key=api_key, **sdk_options(self, httpx2, is_async=True),
                                 **openai_kwargs)
        return {"client": sdk, "num_retries": 0, "max_retries": 0}


__all__ = [
    "DecisionError",
    "decision_error",
    "DelegatedError",
    "LimitReachedError",
    "Retrier",
    "delegate_reason",
    "outcome_of",
    "session",
]
