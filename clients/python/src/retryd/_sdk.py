"""What retryd.openai and retryd.anthropic share: both SDKs (openai 3.x,
anthropic 2.x) send through an httpx2 client and take ``max_retries`` and
``http_client``, so handing their retries to retryd is the same keyword
arguments for either. Each module's Retrier adds only its provider's name
(and its documentation)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import httpx2

from ._middleware import Retrier, sdk_options


class SDKRetrier(Retrier):
    """A Retrier with the keyword arguments of an httpx2-based SDK's client
    (openai.OpenAI, anthropic.Anthropic and their async forms)."""

    def client_options(self, transport: Optional[httpx2.BaseTransport] = None, **http_kwargs: Any) -> Dict[str, Any]:
        """``max_retries=0`` and an ``http_client`` (httpx2.Client) sending
        through retryd's transport over transport (default
        httpx2.HTTPTransport()): the keyword arguments for the SDK's sync
        client (openai.OpenAI, anthropic.Anthropic). http_kwargs go to
        httpx2.Client (timeout=, headers=, ...)."""
        return sdk_options(self, httpx2, is_async=False, inner=transport, **http_kwargs)

    def async_client_options(self, transport: Optional[httpx2.AsyncBaseTransport] = None, **http_kwargs: Any) -> Dict[str, Any]:
        """client_options() for the SDK's async client (openai.AsyncOpenAI,
        anthropic.AsyncAnthropic), over the Retrier's async_client."""
        return sdk_options(self, httpx2, is_async=True, inner=transport, **http_kwargs)
