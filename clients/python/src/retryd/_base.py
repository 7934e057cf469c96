"""What Client and AsyncClient share: their arguments and the state
built from them. Only the channel differs (grpc or grpc.aio), and each
opens its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple

import grpc

from ._degraded import DEFAULT_DECISION_TIMEOUT, DegradedState
from ._exhausted import DEFAULT_EXHAUSTED_RETRIES
from ._transport import CallMetadata, TraceparentSource, TransportCredentials, channel_options
from .local import DEFAULT_LOCAL_MAX_CHAINS
from . import tracing
from ._log import log
from .errors import typed_error
from .outcome import DEFAULT_CANCEL_TIMEOUT, DEFAULT_REATTACH_INITIAL, DEFAULT_REATTACH_MAX, positive
from .request import FailureLike, PolicyLike, ReplayLike, failed_step_request
from .v1 import policy_pb2, retry_service_pb2, retry_service_pb2_grpc

if TYPE_CHECKING:
    from datetime import datetime

    from opentelemetry.trace import TracerProvider


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
        tracer_provider: Optional["TracerProvider"] = None,
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
        # Without a traceparent source of the caller's, each call carries
        # the current OpenTelemetry span's context (when opentelemetry-api
        # is installed), as Go's WithTracerProvider propagates it.
        source = traceparent if traceparent is not None else (tracing.current_traceparent if tracing.AVAILABLE else None)
        self._md = CallMetadata(credentials, bearer_token, insecure_bearer_token, source)
        self._tracer = tracing.get_tracer(tracer_provider)
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


def request_of(request: Optional[retry_service_pb2.FailedStepRequest], fields: Dict[str, Any]) -> retry_service_pb2.FailedStepRequest:
    """recover()'s request: the message it was given, or the one its
    keyword arguments make (never both)."""
    given = {k: v for k, v in fields.items() if v is not None and v is not False}
    if request is not None:
        if not isinstance(request, retry_service_pb2.FailedStepRequest):
            raise TypeError(
                f"retryd: recover() takes a FailedStepRequest or keyword arguments, not {type(request).__name__}"
            )
        if given:
            raise TypeError(f"retryd: recover() got a FailedStepRequest and keyword arguments ({', '.join(sorted(given))})")
        return request
    missing = [k for k in ("session_id", "turn", "step", "provider") if fields.get(k) is None]
    if missing:
        raise TypeError(f"retryd: recover() needs {', '.join(missing)} (or a FailedStepRequest)")
    return failed_step_request(**fields)


def refused(err: grpc.RpcError, what: str, request: Optional[retry_service_pb2.FailedStepRequest] = None) -> BaseException:
    """The exception to raise for a call's error: the typed form of one of
    retryd's refusals (logged), else err."""
    typed = typed_error(err)
    if typed is not err:
        where = f" (session {request.session_id} turn {request.turn} step {request.step})" if request is not None else ""
        log.warning("retryd refused %s%s: %s", what, where, typed)
    return typed

