"""The middleware's exceptions: retryd refused the report of a failed
model request (DecisionError, LimitReachedError), or did not retry a model
request whose answer cannot go back to the SDK as it came (DelegatedError)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional

import grpc

from ..classify import Classification, exception_chain
from ..errors import error_reason, is_limit_reached, retry_delay, status_code
from ..outcome import Outcome
from .outcome import reason_of

class DecisionError(Exception):
    """retryd refused the report of a failed model request (it recorded
    nothing): ``reason`` is its google.rpc.ErrorInfo reason (for example
    LIMIT_REACHED), ``delay`` the google.rpc.RetryInfo delay it asked for
    (or None), ``code`` the gRPC status code. ``classification`` is what was
    reported, ``provider_error`` the attempt's own exception (if it raised
    one) and ``response`` the provider's response (if one came). The
    gRPC error is the ``__cause__``."""

    def __init__(
        self,
        err: BaseException,
        classification: Classification,
        response: Any = None,
        provider_error: Optional[BaseException] = None,
    ) -> None:
        self.reason: Optional[str] = error_reason(err)
        self.delay: Optional[timedelta] = retry_delay(err)
        self.code: Optional[grpc.StatusCode] = status_code(err)
        self.classification = classification
        self.response = response
        self.provider_error = provider_error
        code = self.code.name if self.code is not None else type(err).__name__
        detail = f"{code} {self.reason}" if self.reason else code
        if self.delay is not None:
            detail += f", retry after {self.delay.total_seconds():g}s"
        super().__init__(f"retryd refused the report of {classification.failure.code}: {detail}")


class LimitReachedError(DecisionError):
    """retryd's admission control refused the report (RESOURCE_EXHAUSTED,
    LIMIT_REACHED): ``bound`` is the full bound, ``delay`` when to report
    again."""

    def __init__(self, err: BaseException, classification: Classification, response: Any = None,
                 provider_error: Optional[BaseException] = None) -> None:
        super().__init__(err, classification, response, provider_error)
        self.bound: str = is_limit_reached(err) or ""


class DelegatedError(Exception):
    """A model request retryd did not retry whose provider answer cannot be
    handed to the SDK as it came: a stream retried after its 200 whose retry
    answered an error status (``response``), or a transport error raised by
    the attempt (``error``, also the ``__cause__``). ``outcome`` is
    retryd's answer."""

    def __init__(self, outcome: Outcome, response: Any = None, error: Optional[BaseException] = None) -> None:
        self.outcome = outcome
        self.response = response
        self.error = error
        what = f"HTTP {response.status_code}" if response is not None else repr(error)
        super().__init__(f"retryd did not retry the model request ({reason_of(outcome)}): {what}")


def decision_error(exc: BaseException) -> Optional[DecisionError]:
    """The DecisionError exc is or wraps (``__cause__``/``__context__``):
    some SDK releases wrap what their HTTP client raised in their own
    connection error."""
    for e in exception_chain(exc):
        if isinstance(e, DecisionError):
            return e
    return None


def refused(err: grpc.RpcError, c: Classification, response: Any, provider_error: Optional[BaseException]) -> DecisionError:
    if is_limit_reached(err) is not None:
        return LimitReachedError(err, c, response, provider_error)
    return DecisionError(err, c, response, provider_error)
