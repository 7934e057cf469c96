"""Reading retryd's google.rpc error details from a gRPC error.

retryd attaches google.rpc.ErrorInfo (domain "retryd.dev") to its
FAILED_PRECONDITION, PERMISSION_DENIED and admission RESOURCE_EXHAUSTED
errors, google.rpc.BadRequest to INVALID_ARGUMENT, and google.rpc.RetryInfo
to admission refusals. gRPC carries them as a google.rpc.Status in the
``grpc-status-details-bin`` trailer; these helpers decode it. Each helper
takes any exception and looks through ``__cause__`` and ``__context__``
for the grpc.RpcError (sync or grpc.aio), so a wrapped error works too.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import grpc

from google.rpc import error_details_pb2, status_pb2

ErrorInfo = error_details_pb2.ErrorInfo
RetryInfo = error_details_pb2.RetryInfo
BadRequest = error_details_pb2.BadRequest

#: The google.rpc.ErrorInfo domain of retryd's errors.
ERROR_DOMAIN = "retryd.dev"


class Reason:
    """The google.rpc.ErrorInfo reasons of retryd's errors."""

    RETRY_PENDING = "RETRY_PENDING"
    """FAILED_PRECONDITION: the session has a scheduled retry that has not
    started; await or cancel it first. Metadata retry_id names it."""
    STALE_STEP = "STALE_STEP"
    """FAILED_PRECONDITION: the report names a turn and step older than the
    session's latest."""
    STEP_RECORD_CONFLICT = "STEP_RECORD_CONFLICT"
    """FAILED_PRECONDITION: the same step was already reported with
    different content."""
    DELEGATION_CANCELLED = "DELEGATION_CANCELLED"
    """FAILED_PRECONDITION: the step's open always-mode delegation was
    cancelled."""
    PROVIDER_NOT_ALLOWED = "PROVIDER_NOT_ALLOWED"
    """PERMISSION_DENIED: the caller's tenant may not use the provider;
    metadata provider names it."""
    POLICY_NOT_ALLOWED = "POLICY_NOT_ALLOWED"
    """PERMISSION_DENIED: the tenant may not select the policy_name;
    metadata policy_name names it."""
    LIMIT_REACHED = "LIMIT_REACHED"
    """RESOURCE_EXHAUSTED: an admission bound is full; metadata bound and
    limit name it, and RetryInfo says when to try again."""


#: The FAILED_PRECONDITION reasons (every client's conformance suite
#: checks that the vectors cover each of them).
PRECONDITION_REASONS = (
    Reason.RETRY_PENDING,
    Reason.STALE_STEP,
    Reason.STEP_RECORD_CONFLICT,
    Reason.DELEGATION_CANCELLED,
)


def rpc_error(err: Optional[BaseException]) -> Optional[grpc.RpcError]:
    """The grpc.RpcError err is, or wraps (``__cause__``/``__context__``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
            return err
        seen.add(id(err))
        err = err.__cause__ if err.__cause__ is not None else err.__context__
    return None


def status_code(err: Optional[BaseException]) -> Optional[grpc.StatusCode]:
    """The gRPC status code of err, or None when err is no gRPC error."""
    rpc = rpc_error(err)
    if rpc is None:
        return None
    code: grpc.StatusCode = rpc.code()
    return code


def rpc_status(err: Optional[BaseException]) -> Optional[status_pb2.Status]:
    """The google.rpc.Status of err's ``grpc-status-details-bin`` trailer,
    or None when it has none (or one for another code)."""
    rpc = rpc_error(err)
    if rpc is None:
        return None
    trailers = cast(Sequence[Tuple[str, Any]], rpc.trailing_metadata() or ())
    for key, value in trailers:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            st: status_pb2.Status = status_pb2.Status.FromString(value)
            if st.code != rpc.code().value[0]:
                return None
            return st
    return None


def _details(err: Optional[BaseException], message: type) -> Iterator[object]:
    st = rpc_status(err)
    if st is None:
        return
    for any_detail in st.details:
        out = message()
        if any_detail.Unpack(out):
            yield out


def error_info(err: Optional[BaseException]) -> Optional[ErrorInfo]:
    """The retryd google.rpc.ErrorInfo (domain retryd.dev) of err, or None."""
    for info in _details(err, ErrorInfo):
        assert isinstance(info, ErrorInfo)
        if info.domain == ERROR_DOMAIN:
            return info
    return None


def error_reason(err: Optional[BaseException]) -> Optional[str]:
    """The ErrorInfo reason of a retryd error (one of Reason), or None when
    err carries none."""
    info = error_info(err)
    return info.reason if info is not None else None


def _error_with(err: Optional[BaseException], code: grpc.StatusCode, reason: str) -> Optional[ErrorInfo]:
    if status_code(err) != code:
        return None
    info = error_info(err)
    if info is None or info.reason != reason:
        return None
    return info


def is_retry_pending(err: Optional[BaseException]) -> Optional[str]:
    """When err is retryd's refusal of a report because the session already
    has a pending retry (FAILED_PRECONDITION, reason RETRY_PENDING), the id
    of that retry, which the agent can await or cancel; otherwise None."""
    info = _error_with(err, grpc.StatusCode.FAILED_PRECONDITION, Reason.RETRY_PENDING)
    return info.metadata.get("retry_id", "") if info is not None else None


def is_provider_not_allowed(err: Optional[BaseException]) -> Optional[str]:
    """When err is the refusal of a provider the caller's tenant may not use
    (PERMISSION_DENIED, reason PROVIDER_NOT_ALLOWED), that provider; nothing
    was recorded, so hand the failure to the next recovery policy.
    Otherwise None."""
    info = _error_with(err, grpc.StatusCode.PERMISSION_DENIED, Reason.PROVIDER_NOT_ALLOWED)
    return info.metadata.get("provider", "") if info is not None else None


def is_policy_not_allowed(err: Optional[BaseException]) -> Optional[str]:
    """When err is the refusal of a policy_name the caller's tenant may not
    select (PERMISSION_DENIED, reason POLICY_NOT_ALLOWED), that name;
    otherwise None."""
    info = _error_with(err, grpc.StatusCode.PERMISSION_DENIED, Reason.POLICY_NOT_ALLOWED)
    return info.metadata.get("policy_name", "") if info is not None else None


def is_limit_reached(err: Optional[BaseException]) -> Optional[str]:
    """When err is retryd's admission control refusing work it cannot hold
    (RESOURCE_EXHAUSTED, reason LIMIT_REACHED), the bound that is full (for
    example "pending_retries_per_tenant"); nothing was recorded, so send the
    request again after retry_delay(err). Otherwise None."""
    info = _error_with(err, grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.LIMIT_REACHED)
    return info.metadata.get("bound", "") if info is not None else None


def retry_info(err: Optional[BaseException]) -> Optional[RetryInfo]:
    """The google.rpc.RetryInfo of err, or None."""
    for ri in _details(err, RetryInfo):
        assert isinstance(ri, RetryInfo)
        return ri
    return None


def retry_delay(err: Optional[BaseException]) -> Optional[timedelta]:
    """How long the server asks the caller to wait before sending the
    request again (google.rpc.RetryInfo), or None when err carries no valid
    RetryInfo (absent, or negative)."""
    ri = retry_info(err)
    if ri is None or not ri.HasField("retry_delay"):
        return None
    d = ri.retry_delay
    if d.seconds < 0 or d.nanos < 0 or d.nanos >= 1_000_000_000:
        return None
    delay: timedelta = d.ToTimedelta()
    return delay


def field_violations(err: Optional[BaseException]) -> Optional[Dict[str, str]]:
    """The google.rpc.BadRequest details of a retryd INVALID_ARGUMENT error
    as a map from field path (for example "failure.code" or
    "policy.backoff.initial_delay_ms") to its description, or None when
    err carries none. Two violations of one field are joined with "; "."""
    out: Optional[Dict[str, str]] = None
    for br in _details(err, BadRequest):
        assert isinstance(br, BadRequest)
        for fv in br.field_violations:
            if out is None:
                out = {}
            prev = out.get(fv.field)
            out[fv.field] = fv.description if prev is None else prev + "; " + fv.description
    return out


__all__: List[str] = [
    "BadRequest",
    "ERROR_DOMAIN",
    "ErrorInfo",
    "PRECONDITION_REASONS",
    "Reason",
    "RetryInfo",
    "error_info",
    "error_reason",
    "field_violations",
    "is_limit_reached",
    "is_policy_not_allowed",
    "is_provider_not_allowed",
    "is_retry_pending",
    "retry_delay",
    "retry_info",
    "rpc_error",
    "rpc_status",
    "status_code",
]


class RetrydError(grpc.RpcError):
    """A call that retryd answered with an error it explains (an ErrorInfo
    reason, field violations): the typed form of the grpc.RpcError, which
    it stays (``code()``, ``details()`` and ``trailing_metadata()`` are the
    call's, and the original error is ``rpc_error`` and ``__cause__``), so
    code that catches grpc.RpcError and the helpers above work unchanged.

    recover() and failed_step() raise one of its subclasses for retryd's
    refusals: LimitReachedError, RetryPendingError, InvalidArgumentError,
    NotAllowedError."""

    def __init__(self, err: grpc.RpcError) -> None:
        self.rpc_error = err
        self.reason: Optional[str] = error_reason(err)
        code = status_code(err)
        self._code = code if code is not None else grpc.StatusCode.UNKNOWN
        text = self.details() or ""
        super().__init__(f"retryd: {self._code.name}" + (f" {self.reason}" if self.reason else "") + (f": {text}" if text else ""))

    def code(self) -> grpc.StatusCode:
        """The call's gRPC status code."""
        return self._code

    def details(self) -> Optional[str]:
        """The call's status message."""
        fn = getattr(self.rpc_error, "details", None)
        return str(fn()) if callable(fn) else None

    def trailing_metadata(self) -> Any:
        """The call's trailing metadata (with retryd's google.rpc.Status)."""
        fn = getattr(self.rpc_error, "trailing_metadata", None)
        return fn() if callable(fn) else ()


class LimitReachedError(RetrydError):
    """retryd's admission control refused the call (RESOURCE_EXHAUSTED,
    reason LIMIT_REACHED) and recorded nothing: ``bound`` names the full
    bound (for example "pending_retries_per_tenant"), ``delay`` (a
    timedelta, or None) is how long retryd asked the caller to wait before
    sending it again (google.rpc.RetryInfo), ``retry_after`` the same in
    seconds. The client has already sent it again as often as its
    ``exhausted_retries`` allowed."""

    def __init__(self, err: grpc.RpcError) -> None:
        super().__init__(err)
        self.bound: str = is_limit_reached(err) or ""
        self.delay: Optional[timedelta] = retry_delay(err)
        self.retry_after: Optional[float] = None if self.delay is None else self.delay.total_seconds()


class RetryPendingError(RetrydError):
    """retryd refused a report because the session has a scheduled retry
    that has not started (FAILED_PRECONDITION, RETRY_PENDING):
    ``retry_id`` names it; await or cancel it first."""

    def __init__(self, err: grpc.RpcError) -> None:
        super().__init__(err)
        self.retry_id: str = is_retry_pending(err) or ""


class InvalidArgumentError(RetrydError, ValueError):
    """retryd refused a request as malformed (INVALID_ARGUMENT) and changed
    nothing: ``violations`` maps each bad field's path (for example
    "failure.code") to what is wrong with it. Also a ValueError."""

    def __init__(self, err: grpc.RpcError) -> None:
        super().__init__(err)
        self.violations: Dict[str, str] = field_violations(err) or {}


class NotAllowedError(RetrydError):
    """The caller's tenant may not use the provider (``provider``) or
    select the policy (``policy_name``) it named (PERMISSION_DENIED);
    nothing was recorded: hand the failure to the next recovery policy."""

    def __init__(self, err: grpc.RpcError) -> None:
        super().__init__(err)
        self.provider: Optional[str] = is_provider_not_allowed(err)
        self.policy_name: Optional[str] = is_policy_not_allowed(err)


def typed_error(err: BaseException) -> BaseException:
    """The RetrydError subclass for one of retryd's refusals (err itself
    when it is none of them, or already typed)."""
    if isinstance(err, RetrydError) or not isinstance(err, grpc.RpcError) or not hasattr(err, "code"):
        return err
    code = status_code(err)
    if code == grpc.StatusCode.INVALID_ARGUMENT and field_violations(err) is not None:
        return InvalidArgumentError(err)
    if is_limit_reached(err) is not None:
        return LimitReachedError(err)
    if is_retry_pending(err) is not None:
        return RetryPendingError(err)
    if is_provider_not_allowed(err) is not None or is_policy_not_allowed(err) is not None:
        return NotAllowedError(err)
    return err


__all__ += [
    "InvalidArgumentError",
    "LimitReachedError",
    "NotAllowedError",
    "RetryPendingError",
    "RetrydError",
    "typed_error",
]
