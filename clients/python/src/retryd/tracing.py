"""OpenTelemetry for the retryd client, through opentelemetry-api only (the
``otel`` extra): the application chooses and configures the SDK. Without
opentelemetry-api installed every function here is a no-op and the client
records nothing.

The spans, attributes and links are the Go and TypeScript clients':

- ``start_turn(logical_turn_id)`` opens the span of one user-visible
  (logical) turn, ``logical turn``, with ``retryd.logical_turn.id``. Start
  every attempt of the turn inside it, so the whole retry chain of the turn
  is one trace (Go's StartTurn).
- ``start_attempt(...)`` opens one provider attempt, ``llm.attempt``, linked
  (``retryd.link=backoff``) to retryd's backoff span that the Started
  confirmation of its retry carries; ``attempt_links(started)`` gives that
  link for a span of your own (Go's AttemptOptions, TypeScript's
  backoffLink).
- Every call sends the current span's W3C trace context as ``traceparent``
  metadata, so retryd's decision and backoff spans join the caller's trace
  (Go's WithTracerProvider).
- ``recover()`` has a span, ``retryd.recover`` (TypeScript's), with the
  request's and the outcome's attributes, and a local decision (degraded
  mode) a ``retryd.local_decision`` span (Go's).
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence

from ._version import __version__
from .v1 import events_pb2

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span, SpanContext, Tracer, TracerProvider

    from .outcome import Outcome
    from .v1 import retry_service_pb2

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator as _Propagator

    AVAILABLE = True
    """Whether opentelemetry-api is installed."""
except ImportError:  # pragma: no cover - the otel extra is not installed
    AVAILABLE = False

#: The instrumentation scope of the client's spans.
INSTRUMENTATION_NAME = "retryd"
#: The attribute that names the logical turn on the span start_turn opens.
LOGICAL_TURN_ATTRIBUTE = "retryd.logical_turn.id"
#: The attribute of an attempt's link to retryd's backoff span, and its value.
LINK_ATTRIBUTE = "retryd.link"
LINK_BACKOFF = "backoff"
#: Span names.
SPAN_TURN = "logical turn"
SPAN_ATTEMPT = "llm.attempt"
SPAN_RECOVER = "retryd.recover"
SPAN_LOCAL_DECISION = "retryd.local_decision"

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def get_tracer(tracer_provider: Optional["TracerProvider"] = None) -> Optional["Tracer"]:
    """The client's tracer from tracer_provider (default: the global one),
    or None without opentelemetry-api."""
    if not AVAILABLE:
        return None
    return _otel_trace.get_tracer(INSTRUMENTATION_NAME, __version__, tracer_provider)


def current_traceparent() -> Optional[str]:
    """The W3C traceparent of the current span, or None when there is no
    valid one (or no opentelemetry-api)."""
    if not AVAILABLE:
        return None
    if not _otel_trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: Dict[str, str] = {}
    _Propagator().inject(carrier)
    return carrier.get("traceparent")


def backoff_span_context(started: Optional[events_pb2.RetryStarted]) -> Optional["SpanContext"]:
    """The span context of retryd's backoff span that a Started
    confirmation carries; None when retryd exports no traces (or without
    opentelemetry-api)."""
    if not AVAILABLE or started is None:
        return None
    m = _TRACEPARENT.match(started.traceparent)
    if m is None:
        return None
    trace_id, span_id = int(m.group(1), 16), int(m.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return _otel_trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=_otel_trace.TraceFlags(int(m.group(3), 16) & _otel_trace.TraceFlags.SAMPLED),
    )


def attempt_links(started: Optional[events_pb2.RetryStarted]) -> List["Link"]:
    """The links of the attempt that follows a Started confirmation: one to
    retryd's backoff span (attribute retryd.link=backoff), so the trace
    shows which wait each retry ended. Empty for the first attempt
    (started None) or a Started without trace context."""
    sc = backoff_span_context(started)
    if sc is None:
        return []
    return [_otel_trace.Link(sc, {LINK_ATTRIBUTE: LINK_BACKOFF})]


def turn_span(tracer: "Tracer", logical_turn_id: str, *, context: Any = None) -> "Span":
    """Starts (without making it current) the span of one logical turn,
    ``logical turn`` with retryd.logical_turn.id, under context (default:
    the current one). start_turn is this as a block; the SDK middleware
    holds one open across a stream the SDK reads later."""
    return tracer.start_span(SPAN_TURN, context=context, attributes={LOGICAL_TURN_ATTRIBUTE: logical_turn_id})


def attempt_span(
    tracer: "Tracer",
    *,
    session_id: str,
    turn: int,
    step: int,
    provider: str,
    attempt: int,
    started: Optional[events_pb2.RetryStarted] = None,
    context: Any = None,
) -> "Span":
    """Starts (without making it current) one provider attempt's span,
    ``llm.attempt``, linked to the backoff span of started (the Started of
    the retry it is; None for the first attempt), with the TypeScript
    middleware's attributes, under context (default: the current one)."""
    attrs: Dict[str, Any] = {
        "retryd.session.id": session_id,
        "retryd.turn": turn,
        "retryd.step": step,
        "gen_ai.provider.name": provider,
        "retryd.attempt": attempt,
    }
    if started is not None:
        attrs["retryd.retry.id"] = started.retry_id
        attrs["retryd.retry.number"] = started.retry_number
    return tracer.start_span(SPAN_ATTEMPT, context=context, links=attempt_links(started), attributes=attrs)


@contextlib.contextmanager
def start_turn(logical_turn_id: str, *, tracer_provider: Optional["TracerProvider"] = None) -> Iterator[Optional["Span"]]:
    """Opens the span of one logical turn (``logical turn``, attribute
    retryd.logical_turn.id) as the current span, and ends it when the block
    ends. Pass the same id as the reports' logical_turn_id. Yields the span
    (None without opentelemetry-api)."""
    tracer = get_tracer(tracer_provider)
    if tracer is None:
        yield None
        return
    with _otel_trace.use_span(turn_span(tracer, logical_turn_id), end_on_exit=True) as span:
        yield span


@contextlib.contextmanager
def start_attempt(
    *,
    session_id: str,
    turn: int,
    step: int,
    provider: str,
    attempt: int,
    started: Optional[events_pb2.RetryStarted] = None,
    tracer_provider: Optional["TracerProvider"] = None,
) -> Iterator[Optional["Span"]]:
    """Opens one provider attempt's span (``llm.attempt``, see
    attempt_span) as the current span. An exception raised in the block
    marks the span as an error. Yields the span (None without
    opentelemetry-api)."""
    tracer = get_tracer(tracer_provider)
    if tracer is None:
        yield None
        return
    span = attempt_span(tracer, session_id=session_id, turn=turn, step=step, provider=provider, attempt=attempt,
                        started=started)
    with _otel_trace.use_span(span, end_on_exit=True) as current:
        yield current


def decision_name(out: "Outcome") -> str:
    """retryd.decision of an outcome: a retry that was later cancelled was
    still scheduled."""
    return "delegate" if out.kind == "delegate" else "schedule"


class RecoverSpan:
    """The ``retryd.recover`` span of one recover() call (inert without a
    tracer). Use as a context manager: the span is current inside it."""

    def __init__(self, tracer: Optional["Tracer"], request: "retry_service_pb2.FailedStepRequest") -> None:
        self._span: Optional["Span"] = None
        self._token: Any = None
        if tracer is None:
            return
        self._tracer = tracer
        self._span = tracer.start_span(
            SPAN_RECOVER,
            attributes={
                "retryd.session.id": request.session_id,
                "retryd.turn": request.turn,
                "retryd.step": request.step,
                "gen_ai.provider.name": request.provider,
                "retryd.failure.code": request.failure.code,
            },
        )
        if request.logical_turn_id:
            self._span.set_attribute(LOGICAL_TURN_ATTRIBUTE, request.logical_turn_id)

    def __enter__(self) -> "RecoverSpan":
        if self._span is not None:
            self._token = _otel_context.attach(_otel_trace.set_span_in_context(self._span))
        return self

    def __exit__(self, typ: Optional[type], exc: Optional[BaseException], tb: Any) -> None:
        if self._span is None:
            return
        try:
            if exc is not None:
                local = getattr(exc, "local", None)
                if isinstance(local, bool):
                    self._span.set_attribute("retryd.decision.local", local)
                if isinstance(exc, Exception):
                    self._span.record_exception(exc)
                self._span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, str(exc) or type(exc).__name__))
        finally:
            self._span.end()
            if self._token is not None:
                _otel_context.detach(self._token)

    def event(self, name: str, err: Optional[BaseException] = None) -> None:
        if self._span is not None:
            self._span.add_event(name, {"exception.message": str(err)} if err is not None else None)

    def outcome(self, out: "Outcome") -> None:
        """Records the outcome's attributes, and a local decision's span."""
        if self._span is None:
            return
        span = self._span
        span.set_attribute("retryd.decision", decision_name(out))
        span.set_attribute("retryd.decision.local", out.local and not out.local_start)
        if out.kind == "retry" and out.schedule is not None:
            span.set_attribute("retryd.retry.id", out.schedule.retry_id)
            span.set_attribute("retryd.retry.number", out.schedule.retry_number)
            span.set_attribute("retryd.delay_ms", out.schedule.delay_ms)
            span.set_attribute("retryd.retry.local_start", out.local_start)
        elif out.kind == "delegate" and out.delegate is not None:
            span.set_attribute("retryd.delegate.reason", events_pb2.DelegateReason.Name(out.delegate.reason))
        if out.local and not out.local_start:
            self._local_decision(out)

    def _local_decision(self, out: "Outcome") -> None:
        attrs: Dict[str, Any] = {"retryd.decision": decision_name(out), "retryd.decision.local": True}
        if out.schedule is not None:
            attrs["retryd.retry.id"] = out.schedule.retry_id
            attrs["retryd.retry.number"] = out.schedule.retry_number
            attrs["retryd.delay_ms"] = out.schedule.delay_ms
        if out.delegate is not None:
            attrs["retryd.delegate.reason"] = events_pb2.DelegateReason.Name(out.delegate.reason)
        span = self._tracer.start_span(SPAN_LOCAL_DECISION, attributes=attrs)
        if isinstance(out.unreachable, Exception):
            span.record_exception(out.unreachable)
        span.end()


__all__: Sequence[str] = (
    "AVAILABLE",
    "INSTRUMENTATION_NAME",
    "LINK_ATTRIBUTE",
    "LINK_BACKOFF",
    "LOGICAL_TURN_ATTRIBUTE",
    "SPAN_ATTEMPT",
    "SPAN_LOCAL_DECISION",
    "SPAN_RECOVER",
    "SPAN_TURN",
    "attempt_links",
    "attempt_span",
    "backoff_span_context",
    "current_traceparent",
    "get_tracer",
    "start_attempt",
    "start_turn",
    "turn_span",
)
