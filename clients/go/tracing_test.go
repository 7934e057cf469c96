package retryd

import (
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

func TestRenderRetry(t *testing.T) {
	t.Parallel()
	schedule := &retrydv1.RetryPolicy{Schedule: []uint64{2000, 5000, 5000, 5000, 10000}}
	tests := []struct {
		s    *retrydv1.RetryScheduled
		want string
	}{
		{&retrydv1.RetryScheduled{RetryNumber: 2, MaxRetries: proto.Uint32(5), DelayMs: 4000}, "Retrying model request (2/5). 4s"},
		{&retrydv1.RetryScheduled{RetryNumber: 1, MaxRetries: proto.Uint32(2), DelayMs: 505}, "Retrying model request (1/2). 0.5s"},
		{&retrydv1.RetryScheduled{RetryNumber: 7, Mode: retrydv1.Mode_MODE_ALWAYS, DelayMs: 1500}, "Retrying model request (7/∞). 1.5s"},
		{&retrydv1.RetryScheduled{RetryNumber: 2, Mode: retrydv1.Mode_MODE_SCHEDULE, Policy: schedule, DelayMs: 5000}, "Retrying model request (2/5). 5s"},
		{&retrydv1.RetryScheduled{RetryNumber: 6, Mode: retrydv1.Mode_MODE_SCHEDULE, Policy: schedule, DelayMs: 20000}, "Retrying model request (6/∞). 20s"},
		{&retrydv1.RetryScheduled{RetryNumber: 1, MaxRetries: proto.Uint32(3), DelayMs: 0}, "Retrying model request (1/3). 0s"},
	}
	for _, tt := range tests {
		if got := RenderRetry(tt.s); got != tt.want {
			t.Errorf("RenderRetry(%v) = %q, want %q", tt.s, got, tt.want)
		}
	}
}

func TestAttemptOptionsLinkTheBackoffSpan(t *testing.T) {
	t.Parallel()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	sc := BackoffSpanContext(&retrydv1.RetryStarted{Traceparent: tp})
	if !sc.IsValid() || sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sc.SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("BackoffSpanContext = %v", sc)
	}
	cfg := trace.NewSpanStartConfig(AttemptOptions(&retrydv1.RetryStarted{Traceparent: tp})...)
	if links := cfg.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != sc.SpanID() {
		t.Errorf("links %v, want one to the backoff span", links)
	}
	if opts := AttemptOptions(nil); len(opts) != 0 {
		t.Errorf("first attempt got %d options, want none", len(opts))
	}
	if opts := AttemptOptions(&retrydv1.RetryStarted{}); len(opts) != 0 {
		t.Errorf("untraced Started got %d options, want none", len(opts))
	}
}
