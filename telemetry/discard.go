package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// DiscardKey marks a span that was opened speculatively and turned out not
// to be needed: a span carrying DiscardKey=true when it ends is dropped
// instead of exported. retryd opens a retry's backoff span before it knows
// whether the failure is scheduled (the store records the span's context
// with the retry), and discards it when the failure is delegated.
const DiscardKey = attribute.Key("retryd.discard")

// discardFilter forwards every span to next except discarded ones.
type discardFilter struct {
	next sdktrace.SpanProcessor
}

// NewDiscardFilter wraps next so that spans ended with DiscardKey=true are
// not passed on.
func NewDiscardFilter(next sdktrace.SpanProcessor) sdktrace.SpanProcessor {
	return discardFilter{next: next}
}

func (f discardFilter) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) {
	f.next.OnStart(parent, s)
}

func (f discardFilter) OnEnd(s sdktrace.ReadOnlySpan) {
	for _, kv := range s.Attributes() {
		if kv.Key == DiscardKey && kv.Value.AsBool() {
			return
		}
	}
	f.next.OnEnd(s)
}

func (f discardFilter) Shutdown(ctx context.Context) error   { return f.next.Shutdown(ctx) }
func (f discardFilter) ForceFlush(ctx context.Context) error { return f.next.ForceFlush(ctx) }
