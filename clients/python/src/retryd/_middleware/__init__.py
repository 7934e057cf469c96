"""The engine of the SDK middleware (retryd.openai, retryd.anthropic,
retryd.litellm, retryd.httpx_transport): an HTTP transport for httpx and
httpx2 (the HTTP clients of the openai and anthropic SDKs) that lets retryd
decide the retries of every model request sent through it, as the Go
middleware (clients/go/openai) does with an http.RoundTripper.

Each attempt's failure (an HTTP error status, an error event inside a 200
stream, an empty completion, a transport error) is classified
(retryd.classify) and reported with recover():

- retry: the request is sent again once retryd confirms the start;
- delegate (or the retry cancelled): the provider's answer is handed back
  as it came (the SDK raises its own error), with the outcome attached
  (outcome_of) and the headers Retryd-Delegate-Reason / -Detail;
- success: StepSucceeded.

A stream is held back until its first event with content (text, a refusal,
a tool call): an error event, a broken stream or an empty stop before it is
replay-safe, and on retry the SDK reads the new stream as if it were the
first. After content was passed on, a failure is reported replay-unsafe
(retryd delegates) and the SDK gets the provider's error as sent.

Nothing here imports an SDK or an HTTP client: the transports are built for
the module (httpx or httpx2) they are given.

Its parts, one job each: numbering (Turn, session()), sse (what a 200 can
hide: an empty completion, a stream's events), calls (one model call's
attempts and decisions), retrier (the Retrier and its transports, on
RetrierBase, the configuration and reports retryd.langgraph shares), errors
(the middleware's exceptions) and outcome (where retryd's answer is
attached for the caller).
"""

from .errors import (
    DecisionError,
    DelegatedError,
    InvalidArgumentError,
    LimitReachedError,
    NotAllowedError,
    RetryPendingError,
    decision_error,
    refused as _refused,
)
from .numbering import Turn, TurnFunc, _session, session
from .outcome import HEADER_DELEGATE_DETAIL, HEADER_DELEGATE_REASON, HEADER_LOCAL, OUTCOME_KEY, delegate_reason, outcome_of, reason_of
from .retrier import Retrier, RetrierBase, sdk_options
from .sse import empty_completion

__all__ = [
    "DecisionError",
    "DelegatedError",
    "HEADER_DELEGATE_DETAIL",
    "HEADER_DELEGATE_REASON",
    "HEADER_LOCAL",
    "InvalidArgumentError",
    "LimitReachedError",
    "NotAllowedError",
    "OUTCOME_KEY",
    "Retrier",
    "RetrierBase",
    "RetryPendingError",
    "Turn",
    "TurnFunc",
    "_refused",
    "_session",
    "decision_error",
    "delegate_reason",
    "empty_completion",
    "outcome_of",
    "reason_of",
    "sdk_options",
    "session",
]
