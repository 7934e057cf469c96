package retryd

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// WithTracerProvider instruments the client's calls with OpenTelemetry's
// gRPC stats handler and propagates W3C trace context to retryd, so its
// decision spans join the caller's trace; a local decision (degraded
// mode) gets a span of its own, "retryd.local_decision". With
// NewFromConn, instrument the connection yourself
// (otelgrpc.NewClientHandler); the option still gives local decisions
// their span.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(o *options) {
		o.tracerProvider = tp
		o.dialOptions = append(o.dialOptions, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(tp),
			otelgrpc.WithPropagators(propagation.TraceContext{}))))
	})
}

// LogicalTurnAttribute names the logical turn on the span StartTurn opens.
const LogicalTurnAttribute = attribute.Key("retryd.logical_turn.id")

// StartTurn opens the span of one user-visible (logical) turn. Start every
// attempt of the turn as a child of the returned context, so the whole
// retry chain of the turn is one trace; pass the same logicalTurnID as
// FailedStepRequest.logical_turn_id. The caller ends the span.
func (c *Client) StartTurn(ctx context.Context, tracer trace.Tracer, logicalTurnID string) (context.Context, trace.Span) {
	return tracer.Start(ctx, "logical turn", trace.WithAttributes(LogicalTurnAttribute.String(logicalTurnID)))
}

// AttemptOptions returns the span options for the attempt that follows a
// Started confirmation: a link to retryd's backoff span, whose context the
// confirmation carries, so the trace shows which wait each retry ended.
// With a nil started (the first attempt) it returns opts unchanged.
func AttemptOptions(started *retrydv1.RetryStarted, opts ...trace.SpanStartOption) []trace.SpanStartOption {
	sc := BackoffSpanContext(started)
	if !sc.IsValid() {
		return opts
	}
	return append(opts, trace.WithLinks(trace.Link{
		SpanContext: sc,
		Attributes:  []attribute.KeyValue{attribute.String("retryd.link", "backoff")},
	}))
}

// BackoffSpanContext parses the backoff span context a Started
// confirmation carries; it is invalid when retryd does not export traces.
func BackoffSpanContext(started *retrydv1.RetryStarted) trace.SpanContext {
	if started.GetTraceparent() == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": started.GetTraceparent()})
	return trace.SpanContextFromContext(ctx)
}

// RenderRetry renders a scheduled retry as the harness's status line:
// "Retrying model request (2/5). 4s". The denominator is the chain's
// finite maximum, or the schedule's length while a schedule-mode retry is
// within it, and ∞ when unlimited.
func RenderRetry(s *retrydv1.RetryScheduled) string {
	denom := "∞"
	switch {
	case s.MaxRetries != nil:
		denom = fmt.Sprint(s.GetMaxRetries())
	case s.GetMode() == retrydv1.Mode_MODE_SCHEDULE && int(s.GetRetryNumber()) <= len(s.GetPolicy().GetSchedule()):
		denom = fmt.Sprint(len(s.GetPolicy().GetSchedule()))
	}
	return fmt.Sprintf("Retrying model request (%d/%s). %s", s.GetRetryNumber(), denom, renderDelay(s.GetDelayMs()))
}

// renderDelay prints whole seconds as "4s" and anything else with one
// decimal ("1.5s", "0.5s").
func renderDelay(ms uint64) string {
	d := time.Duration(ms) * time.Millisecond
	secs := d.Seconds()
	if secs == math.Trunc(secs) {
		return fmt.Sprintf("%ds", int64(secs))
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", secs), ".0") + "s"
}
