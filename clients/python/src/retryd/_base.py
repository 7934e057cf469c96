"""What Client and AsyncClient share: their arguments and the state
built from them. Only the channel differs (grpc or grpc.aio), and each
opens its own."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import grpc

from ._degraded import DEFAULT_DECISION_TIMEOUT, DegradedState
from ._exhausted import DEFAULT_EXHAUSTED_RETRIES
from ._transport import CallMetadata, TraceparentSource, TransportCredentials, channel_options
from .local import DEFAULT_LOCAL_MAX_CHAINS
from .outcome import DEFAULT_CANCEL_TIMEOUT, DEFAULT_REATTACH_INITIAL, DEFAULT_REATTACH_MAX, positive
from .v1 import policy_pb2, retry_service_pb2_grpc


class ClientBase:
    """The arguments of Client and AsyncClient (documented on Client)."""

    _channel: Any

    def __init__(
        self,
        target: str,
        *,
        credentials: TransportCredentials,
        bearer_token: Optional[str] = None,
        insecure_bearer_token: Optional[str] = None,
        traceparent: Optional[TraceparentSource] = None,
        reattach_initial: Optional[float] = None,
        reattach_max: Optional[float] = None,
        cancel_timeout: Optional[float] = None,
        options: Sequence[Tuple[str, Any]] = (),
        decision_timeout: Optional[float] = None,
        fail_closed: bool = False,
        local_policies: Optional[Mapping[str, policy_pb2.RetryPolicy]] = None,
        local_retry_budget: Optional[int] = None,
        local_chains: int = DEFAULT_LOCAL_MAX_CHAINS,
        exhausted_retries: int = DEFAULT_EXHAUSTED_RETRIES,
    ) -> None:
        self._md = CallMetadata(credentials, bearer_token, insecure_bearer_token, traceparent)
        self._fail_closed = fail_closed
        self._exhausted = max(0, exhausted_retries)
        self._degraded = DegradedState(
            decision_timeout=positive(decision_timeout, DEFAULT_DECISION_TIMEOUT),
            local_policies=local_policies or {},
            local_retry_budget=local_retry_budget,
            local_chains=local_chains,
        )
        self._channel = self._open_channel(target, credentials.channel_credentials, channel_options(options))
        self._stub: Any = retry_service_pb2_grpc.RetryServiceStub(self._channel)
        self._reattach_initial = positive(reattach_initial, DEFAULT_REATTACH_INITIAL)
        self._reattach_max = max(self._reattach_initial, positive(reattach_max, DEFAULT_REATTACH_MAX))
        self._cancel_timeout = positive(cancel_timeout, DEFAULT_CANCEL_TIMEOUT)

    def _open_channel(
        self,
        target: str,
        credentials: Optional[grpc.ChannelCredentials],
        options: Sequence[Tuple[str, Any]],
    ) -> Any:
        raise NotImplementedError

    def decisions(self) -> Dict[str, int]:
        """How many decisions recover() returned, by kind: "schedule" and
        "delegate" (retryd's), "schedule/local" and "delegate/local"
        (degraded mode), and "start/local" (a retry of retryd's the client
        started by itself)."""
        return self._degraded.counts()
