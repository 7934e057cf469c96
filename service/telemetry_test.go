package service_test

import (
	"context"
	"slices"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func linked(s sdktrace.ReadOnlySpan, to trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.SpanID() == to.SpanID() && l.SpanContext.TraceID() == to.TraceID() {
			return true
		}
	}
	return false
}

// TestSpansLinkAttemptsToTheirTurn drives one logical turn with three
// failed attempts (schedule, schedule, exhausted) and checks the exact
// spans: a decision span per failure with its attributes and links to the
// chain's previous attempts, and a backoff span per retry that lasts from
// scheduling to Started and whose context Started carries.
func TestSpansLinkAttemptsToTheirTurn(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{telemetry: true}, func(t *testing.T, h *harness) {
		rec, reader := h.spans, h.metrics
		agent := h.tracer.Tracer("agent")
		turnCtx, turn := agent.Start(context.Background(), "turn")
		p := fast(60)
		var attempts []trace.SpanContext
		var started []*retrydv1.RetryStarted
		for i := uint64(1); i <= 3; i++ {
			ctx, attempt := agent.Start(turnCtx, "attempt")
			attempts = append(attempts, attempt.SpanContext())
			req := failure("s", i, i, "deepseek", "RATE_LIMIT", p)
			req.LogicalTurnId = "turn-1"
			resp, err := h.client.FailedStep(ctx, req)
			attempt.End()
			if err != nil {
				t.Fatal(err)
			}
			if s := resp.GetDecision().GetSchedule(); s != nil {
				st := h.start(s.GetRetryId())
				if st.GetTraceparent() == "" || st.GetTraceparent() != resp.GetEvent().GetScheduled().GetTraceparent() {
					t.Errorf("Started traceparent %q, scheduled %q: want the same, non-empty", st.GetTraceparent(), resp.GetEvent().GetScheduled().GetTraceparent())
				}
				started = append(started, st)
			}
		}
		turn.End()

		// The agent's gRPC client span (a child of its attempt span) is what
		// travels as trace context: retryd links to it.
		rpcs := make([]trace.SpanContext, len(attempts))
		for _, s := range spansNamed(rec, "retryd.v1.RetryService/FailedStep") {
			for i, a := range attempts {
				if s.SpanKind() == trace.SpanKindClient && s.Parent().SpanID() == a.SpanID() {
					rpcs[i] = s.SpanContext()
				}
			}
		}
		decisions := spansNamed(rec, "retryd.decide")
		if len(decisions) != 3 {
			t.Fatalf("%d decision spans, want 3", len(decisions))
		}
		for i, d := range decisions {
			a := attrs(d)
			if a["retryd.session.id"].AsString() != "s" || a["gen_ai.provider.name"].AsString() != "deepseek" ||
				a["retryd.failure.code"].AsString() != "RATE_LIMIT" || a["retryd.logical_turn.id"].AsString() != "turn-1" ||
				a["retryd.turn"].AsInt64() != int64(i+1) {
				t.Errorf("decision %d attributes: %v", i, a)
			}
			if _, ok := a["error.type"]; ok {
				t.Errorf("decision %d succeeded but carries error.type: %v", i, a)
			}
			if d.SpanContext().TraceID() != attempts[i].TraceID() {
				t.Errorf("decision %d is in trace %s, its attempt in %s", i, d.SpanContext().TraceID(), attempts[i].TraceID())
			}
			if !linked(d, rpcs[i]) {
				t.Errorf("decision %d does not link its own attempt", i)
			}
			for j := 0; j < i; j++ {
				if !linked(d, rpcs[j]) {
					t.Errorf("decision %d does not link previous attempt %d", i, j)
				}
			}
		}
		if a := attrs(decisions[0]); a["retryd.decision"].AsString() != "schedule" || a["retryd.retry.number"].AsInt64() != 1 ||
			a["retryd.retry.max"].AsInt64() != 2 || a["retryd.delay_ms"].AsInt64() != 60 || a["retryd.retry.id"].AsString() == "" {
			t.Errorf("first decision: %v", a)
		}
		last := decisions[2]
		if a := attrs(last); a["retryd.decision"].AsString() != "delegate" ||
			a["retryd.delegate.reason"].AsString() != "DELEGATE_REASON_BUDGET_EXHAUSTED" || last.Status().Code != codes.Error {
			t.Errorf("exhausted decision: %v status %v", a, last.Status())
		}

		// Backoff spans end when the observer sees Started.
		var backoffs []sdktrace.ReadOnlySpan
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if backoffs = spansNamed(rec, "retryd.backoff"); len(backoffs) == 2 {
				break
			}
		}
		if len(backoffs) != 2 {
			t.Fatalf("%d backoff spans, want 2", len(backoffs))
		}
		for i, b := range backoffs {
			if got := traceparentOf(b.SpanContext()); got != started[i].GetTraceparent() {
				t.Errorf("backoff %d is %s, Started carried %s", i, got, started[i].GetTraceparent())
			}
			if b.Parent().SpanID() != decisions[i].SpanContext().SpanID() {
				t.Errorf("backoff %d's parent is not its decision span", i)
			}
			want := time.Duration(60<<i) * time.Millisecond
			if d := b.EndTime().Sub(b.StartTime()); d < want || d > want+5*time.Second {
				t.Errorf("backoff %d lasted %v, want about %v", i, d, want)
			}
			if evs := b.Events(); len(evs) != 1 || evs[0].Name != "started" {
				t.Errorf("backoff %d events %v, want one started event", i, evs)
			}
		}

		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		sums := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if s, ok := m.Data.(metricdata.Sum[int64]); ok {
					for _, dp := range s.DataPoints {
						sums[m.Name] += dp.Value
					}
				}
			}
		}
		for name, want := range map[string]int64{"retryd.attempts.failed": 3, "retryd.decisions": 3,
			"retryd.retries.started": 2, "retryd.operations": 1} {
			if sums[name] != want {
				t.Errorf("%s = %d, want %d (all: %v)", name, sums[name], want, sums)
			}
		}
	})
}

func traceparentOf(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// TestNoTracingNoTraceparent: without a tracer provider nothing is traced
// and no trace context is recorded.
func TestNoTracingNoTraceparent(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		resp := h.fail(failure("s", 1, 1, "p", "SERVER", fast(1)))
		if tp := resp.GetEvent().GetScheduled().GetTraceparent(); tp != "" {
			t.Errorf("traceparent %q recorded with tracing off", tp)
		}
		st := h.start(resp.GetDecision().GetSchedule().GetRetryId())
		if !proto.Equal(st, st) || st.GetTraceparent() != "" {
			t.Errorf("Started carries %q with tracing off", st.GetTraceparent())
		}
	})
}

// TestFailedDecisionSpan: a decision the store refuses (a stale step)
// ends its span with status Error and error.type, the gRPC code the agent
// got; the provider's failure code stays in retryd.failure.code.
func TestFailedDecisionSpan(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{telemetry: true}, func(t *testing.T, h *harness) {
		ctx := context.Background()
		if _, err := h.client.FailedStep(ctx, failure("s", 2, 2, "deepseek", "SERVER", fast(60))); err != nil {
			t.Fatal(err)
		}
		_, err := h.client.FailedStep(ctx, failure("s", 1, 1, "deepseek", "RATE_LIMIT", fast(60)))
		if status.Code(err) != grpccodes.FailedPrecondition {
			t.Fatalf("stale step: %v, want FAILED_PRECONDITION", err)
		}
		decisions := spansNamed(h.spans, "retryd.decide")
		if len(decisions) != 2 {
			t.Fatalf("%d decision spans, want 2", len(decisions))
		}
		ok, failed := attrs(decisions[0]), attrs(decisions[1])
		if _, has := ok["error.type"]; has || decisions[0].Status().Code == codes.Error {
			t.Errorf("the decided failure's span: %v, status %v; want no error.type, no Error", ok, decisions[0].Status())
		}
		if failed["error.type"].AsString() != "FailedPrecondition" || failed["retryd.failure.code"].AsString() != "RATE_LIMIT" ||
			decisions[1].Status().Code != codes.Error {
			t.Errorf("the refused failure's span: %v, status %v; want error.type FailedPrecondition, Error", failed, decisions[1].Status())
		}
	})
}

// TestSpansNameTheTenant: a tenant's decision and backoff spans carry its
// id in retryd.tenant.id and the session id as the tenant sent it, never
// the qualified id the store keeps; the default tenant's id is empty.
func TestSpansNameTheTenant(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{telemetry: true}, func(t *testing.T, h *harness) {
		for _, ctx := range []context.Context{as("team-a"), context.Background()} {
			resp, err := h.client.FailedStep(ctx, failure("s", 1, 1, "deepseek", "RATE_LIMIT", fast(10)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h.client.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
				Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: resp.GetDecision().GetSchedule().GetRetryId()}}); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if len(spansNamed(h.spans, "retryd.backoff")) == 2 {
				break
			}
		}
		for _, name := range []string{"retryd.decide", "retryd.backoff"} {
			for _, s := range spansNamed(h.spans, name) {
				a := attrs(s)
				got = append(got, name+" "+a["retryd.tenant.id"].AsString()+"/"+a["retryd.session.id"].AsString())
			}
		}
		slices.Sort(got)
		want := []string{"retryd.backoff /s", "retryd.backoff team-a/s", "retryd.decide /s", "retryd.decide team-a/s"}
		if !slices.Equal(got, want) {
			t.Errorf("spans' tenant/session: %q, want %q", got, want)
		}
	})
}
