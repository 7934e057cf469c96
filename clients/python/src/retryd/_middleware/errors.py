"""The middleware's exceptions: retryd refused the report of a failed
model request (DecisionError and its subclasses, each also the typed
refusal of retryd.errors that recover() raises), or did not retry a model
request whose answer cannot go back to the SDK as it came (DelegatedError)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, Optional, Type

import grpc

from .. import errors
from ..classify import Classification, exception_chain
from ..errors import RetrydError, retry_delay, status_code
from ..outcome import Outcome
from .outcome import reason_of

class DecisionError(RetrydError):
    """retryd did not decide the report of a failed model request: it
    refused it (and recorded nothing), or the report failed. A RetrydError,
    so a grpc.RpcError (``code()``, ``details()``, the error helpers);
    ``reason`` is its google.rpc.ErrorInfo reason (for example
    LIMIT_REACHED), ``delay`` the google.rpc.RetryInfo delay it asked for
    (or None). ``classification`` is what was reported, ``provider_error``
    the attempt's own exception (if it raised one) and ``response`` the
    provider's response (if one came). The gRPC error is the
    ``__cause__``.

    A refusal that recover() raises typed is raised as the subclass that is
    also that type: LimitReachedError is a retryd.LimitReachedError,
    RetryPendingError a retryd.RetryPendingError, InvalidArgumentError a
    retryd.InvalidArgumentError, NotAllowedError a retryd.NotAllowedError,
    so one ``except retryd.LimitReachedError`` catches admission control's
    refusal whether it came from recover() or from an SDK call."""

    def __init__(
        self,
        err: grpc.RpcError,
        classification: Classification,
        response: Any = None,
        provider_error: Optional[BaseException] = None,
    ) -> None:
        rpc = err.rpc_error if isinstance(err, RetrydError) else err
        super().__init__(rpc)
        self.delay: Optional[timedelta] = retry_delay(rpc)
        self.classification = classification
        self.response = response
        self.provider_error = provider_error
        code = self.code().name if status_code(rpc) is not None else type(rpc).__name__
        detail = f"{code} {self.reason}" if self.reason else code
        if self.delay is not None:
            detail += f", retry after {self.delay.total_seconds():g}s"
        self.args = (f"retryd refused the report of {classification.failure.code}: {detail}",)


class LimitReachedError(DecisionError, errors.LimitReachedError):
    """retryd's admission control refused the report (RESOURCE_EXHAUSTED,
    LIMIT_REACHED): ``bound`` is the full bound, ``delay`` when to report
    again. Also a retryd.LimitReachedError."""


class RetryPendingError(DecisionError, errors.RetryPendingError):
    """retryd refused the report: the session has a scheduled retry that
    has not started (``retry_id``). Also a retryd.RetryPendingError."""


class InvalidArgumentError(DecisionError, errors.InvalidArgumentError):
    """retryd refused the report as malformed (``violations``). Also a
    retryd.InvalidArgumentError (and a ValueError)."""


class NotAllowedError(DecisionError, errors.NotAllowedError):
    """The tenant may not use the provider (``provider``) or the policy
    (``policy_name``) the report named. Also a retryd.NotAllowedError."""


# The middleware's form of each of recover()'s typed refusals.
_TYPED: Dict[type, Type[DecisionError]] = {
    errors.LimitReachedError: LimitReachedError,
    errors.RetryPendingError: RetryPendingError,
    errors.InvalidArgumentError: InvalidArgumentError,
    errors.NotAllowedError: NotAllowedError,
}


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
    """The middleware's exception for a report recover() raised err for:
    the DecisionError subclass of its typed refusal (the same typing as
    recover()'s, retryd.errors.typed_error), else DecisionError."""
    typed = errors.typed_error(err)
    cls = _TYPED.get(type(typed), DecisionError)
    return cls(err, c, response, provider_error)
