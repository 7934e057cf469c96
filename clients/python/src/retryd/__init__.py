"""retryd: the Python client of retryd, the retry-decision service for
fleets of LLM agent loops.

Client (synchronous) and AsyncClient (asyncio, grpc.aio) wrap the
RetryService with recover(), the agent loop's one call for a failed model
request; the error helpers read retryd's google.rpc details; render_retry is
the status-line renderer; classify turns a provider's error into the
Failure to report; retryd.policy is the server's policy engine, ported. recover()
takes plain keyword values (Failure, Policy) or the generated messages,
which are in retryd.v1 (events_pb2, policy_pb2, retry_service_pb2);
retryd's refusals are typed exceptions (LimitReachedError, ...);
retryd.tracing is its OpenTelemetry side and logging.getLogger("retryd")
its log.
"""

from . import local, policy, tracing
from ._transport import TransportCredentials, insecure, tls, tls_credentials
from ._version import __version__
from ._degraded import DEFAULT_DECISION_TIMEOUT
from .aio import AsyncClient
from .classify import CODE_UNKNOWN, Classification, ErrorKind, ProviderFailure, classify, classify_exception, error_kind_of
from .client import Client
from .errors import (
    ERROR_DOMAIN,
    InvalidArgumentError,
    LimitReachedError,
    NotAllowedError,
    Reason,
    RetrydError,
    RetryPendingError,
    error_info,
    error_reason,
    field_violations,
    is_limit_reached,
    is_policy_not_allowed,
    is_provider_not_allowed,
    is_retry_pending,
    retry_delay,
    retry_info,
    status_code,
)
from .local import LocalDecider, is_local
from .outcome import (
    DEFAULT_CANCEL_TIMEOUT,
    DEFAULT_REATTACH_INITIAL,
    DEFAULT_REATTACH_MAX,
    Cancellation,
    NoDecisionError,
    OperationCancelled,
    Outcome,
    RecoverAbortedError,
    StreamEndedError,
)
from .render import format_delay, render_retry, retry_denominator
from .request import Backoff, Failure, Policy

__all__ = [
    "AsyncClient",
    "Backoff",
    "CODE_UNKNOWN",
    "Failure",
    "InvalidArgumentError",
    "LimitReachedError",
    "NotAllowedError",
    "Policy",
    "RetryPendingError",
    "RetrydError",
    "classify_exception",
    "tracing",
    "Cancellation",
    "Classification",
    "LocalDecider",
    "Client",
    "ErrorKind",
    "ProviderFailure",
    "DEFAULT_CANCEL_TIMEOUT",
    "DEFAULT_DECISION_TIMEOUT",
    "DEFAULT_REATTACH_INITIAL",
    "DEFAULT_REATTACH_MAX",
    "ERROR_DOMAIN",
    "NoDecisionError",
    "OperationCancelled",
    "Outcome",
    "Reason",
    "RecoverAbortedError",
    "StreamEndedError",
    "TransportCredentials",
    "__version__",
    "classify",
    "error_kind_of",
    "is_local",
    "local",
    "policy",
    "error_info",
    "error_reason",
    "field_violations",
    "format_delay",
    "insecure",
    "is_limit_reached",
    "is_policy_not_allowed",
    "is_provider_not_allowed",
    "is_retry_pending",
    "render_retry",
    "retry_delay",
    "retry_denominator",
    "retry_info",
    "status_code",
    "tls",
    "tls_credentials",
]
