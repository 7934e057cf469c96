"""The OpenTelemetry spans of one model call through a retryd transport,
retryd.tracing's own (no second implementation): each attempt an
``llm.attempt`` span linked (retryd.link=backoff) to retryd's backoff span
that its retry's Started carries, and every attempt of the call in one
trace: under the span current when the SDK call was made (the caller's own
``logical turn``, retryd.tracing.start_turn), else under a ``logical turn``
span the call opens (retryd.logical_turn.id: the Turn's logical_turn_id,
else "<session>/<turn>"). The reports and StepSucceeded run inside the
attempt's span, so recover()'s ``retryd.recover`` span and retryd's own
decision and backoff spans are in the same trace.

A stream's attempt is still open when the transport returns it: the spans
end when the stream ends or is closed. Inert without a tracer
(opentelemetry-api not installed)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .. import tracing
from ..v1 import events_pb2
from .numbering import Turn

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer


class CallSpans:
    """The spans of one model call (see the module)."""

    def __init__(self, tracer: Optional["Tracer"], turn: Turn, provider: str) -> None:
        self._tracer = tracer
        self._turn, self._provider = turn, provider
        self._turn_span: Optional["Span"] = None
        self._attempt: Optional["Span"] = None
        self._attempts = 0
        self._parent: Any = None
        if tracer is None:
            return
        from opentelemetry import context, trace

        self._parent = context.get_current()
        if not trace.get_current_span().get_span_context().is_valid:
            turn_id = turn.logical_turn_id or f"{turn.session_id}/{turn.turn}"
            self._turn_span = tracing.turn_span(tracer, turn_id)
            self._parent = trace.set_span_in_context(self._turn_span)

    def attempt(self, step: int, started: Optional[events_pb2.RetryStarted]) -> None:
        """Ends the previous attempt's span and starts the next one's."""
        if self._tracer is None:
            return
        self._end_attempt()
        self._attempts += 1
        self._attempt = tracing.attempt_span(
            self._tracer, session_id=self._turn.session_id, turn=self._turn.turn, step=step, provider=self._provider,
            attempt=self._attempts, started=started, context=self._parent,
        )

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Makes the attempt's span current for a block (an HTTP send, a
        report), which must not yield to the SDK: a stream's spans outlive
        the generator frames that read it."""
        span = self._attempt or self._turn_span
        if span is None:
            yield
            return
        from opentelemetry import trace

        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield

    def fail(self, err: BaseException) -> None:
        """Marks the attempt (and the call's turn span) as failed with err,
        the exception the call raises."""
        if self._tracer is None:
            return
        from opentelemetry import trace

        for span in (self._attempt, self._turn_span):
            if span is not None and span.is_recording():
                if isinstance(err, Exception):
                    span.record_exception(err)
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(err) or type(err).__name__))

    def end(self) -> None:
        """Ends the spans still open. Idempotent."""
        self._end_attempt()
        if self._turn_span is not None:
            self._turn_span.end()
            self._turn_span = None

    def _end_attempt(self) -> None:
        if self._attempt is not None:
            self._attempt.end()
            self._attempt = None
