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

from typing import Any, Dict

import openai

from ._middleware import (
    DecisionError,
    decision_error,
    DelegatedError,
    LimitReachedError,
    delegate_reason,
    outcome_of,
    session,
)
from .openai import Retrier as _OpenAIRetrier


class Retrier(_OpenAIRetrier):
    """Hands the retries of LiteLLM's calls to an OpenAI-compatible provider
    to retryd (provider "openai" unless named): retryd.openai's Retrier,
    whose openai client LiteLLM is given."""

    def completion_kwargs(self, *, api_base: str, api_key: str, **openai_kwargs: Any) -> Dict[str, Any]:
        """The keyword arguments for ``litellm.completion``: ``client`` (an
        openai.OpenAI for api_base with retryd's transport, its retries
        off), ``num_retries=0`` and ``max_retries=0``."""
        return _retries_off(openai.OpenAI(base_url=api_base, api_key=api_key, **self.client_options(), **openai_kwargs))

    def acompletion_kwargs(self, *, api_base: str, api_key: str, **openai_kwargs: Any) -> Dict[str, Any]:
        """completion_kwargs() for ``litellm.acompletion`` (the Retrier's
        async_client)."""
        return _retries_off(
            openai.AsyncOpenAI(base_url=api_base, api_key=api_key, **self.async_client_options(), **openai_kwargs)
        )


def _retries_off(sdk: Any) -> Dict[str, Any]:
    """LiteLLM's keyword arguments for a call through sdk, LiteLLM's own
    retries off."""
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
