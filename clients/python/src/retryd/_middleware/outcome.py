"""Where the middleware puts retryd's answer for the SDK and its caller to
read: the outcome attached to a response handed back, its request or an
exception (OUTCOME_KEY), the Retryd-Delegate-* headers, and the readers
outcome_of and delegate_reason."""

from __future__ import annotations

from typing import Any, List, Optional, Set

from ..outcome import Outcome
from ..v1 import events_pb2

#: Headers added to a provider response handed back after retryd delegated.
HEADER_DELEGATE_REASON = "Retryd-Delegate-Reason"
HEADER_DELEGATE_DETAIL = "Retryd-Delegate-Detail"
HEADER_LOCAL = "Retryd-Local"
#: Where the outcome is attached: a response's or request's extensions, an
#: exception's attribute.
OUTCOME_KEY = "retryd_outcome"


def reason_of(out: Outcome) -> str:
    """The delegate reason's name, or the cancel reason for a cancelled retry."""
    if out.delegate is not None:
        return str(events_pb2.DelegateReason.Name(out.delegate.reason))
    if out.cancelled is not None:
        return "retry " + str(events_pb2.CancelReason.Name(out.cancelled.reason))
    return "no retry"


def outcome_of(x: Any) -> Optional[Outcome]:
    """The retryd outcome attached to a response the middleware returned, to
    an exception it raised or passed on, or to an SDK exception made from
    either (its ``response`` or ``request``), following ``__cause__`` and
    ``__context__``; None when retryd was not asked or retried."""
    seen: Set[int] = set()
    todo: List[Any] = [x]
    while todo:
        o = todo.pop(0)
        if o is None or id(o) in seen or len(seen) > 16:
            continue
        seen.add(id(o))
        got = getattr(o, OUTCOME_KEY, None)
        if isinstance(got, Outcome):
            return got
        ext = getattr(o, "extensions", None)
        if isinstance(ext, dict) and isinstance(ext.get(OUTCOME_KEY), Outcome):
            found: Outcome = ext[OUTCOME_KEY]
            return found
        if isinstance(o, BaseException):
            todo += [getattr(o, "response", None), getattr(o, "request", None), o.__cause__, o.__context__]
    return None


def delegate_reason(x: Any) -> Optional[str]:
    """The reason retryd gave for not retrying (see outcome_of), e.g.
    DELEGATE_REASON_REPLAY_UNSAFE, or None."""
    out = outcome_of(x)
    return reason_of(out) if out is not None else None


def attach(response: Any, request: Any, out: Outcome) -> None:
    """Attaches out to the response handed back (extensions and headers) and
    to its request (an SDK error made from a stream has only the request)."""
    for o in (response, request):
        if o is None:
            continue
        ext = o.extensions
        if not isinstance(ext, dict):
            ext = dict(ext)
            o.extensions = ext
        ext[OUTCOME_KEY] = out
    if response is not None:
        response.headers[HEADER_DELEGATE_REASON] = reason_of(out)
        if out.delegate is not None and out.delegate.detail:
            response.headers[HEADER_DELEGATE_DETAIL] = out.delegate.detail.encode("ascii", "replace").decode()
        if out.local:
            response.headers[HEADER_LOCAL] = "true"
