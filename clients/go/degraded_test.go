package retryd_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// degradedServer is a real retryd behind a proxy that can cut the client
// off, and a client through the proxy with a short decision timeout.
type degradedServer struct {
	*testServer
	proxy   *tcpProxy
	client  *retryd.Client
	reader  *sdkmetric.ManualReader
	spans   *tracetest.SpanRecorder
	timeout time.Duration
}

func startDegraded(t *testing.T, opts ...retryd.Option) *degradedServer {
	t.Helper()
	ts := startServer(t)
	proxy := startProxy(t, ts.srv.Addr)
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	timeout := 500 * time.Millisecond
	opts = append([]retryd.Option{
		retryd.WithInsecure(),
		retryd.WithDecisionTimeout(timeout),
		retryd.WithReattachBackoff(20*time.Millisecond, 100*time.Millisecond),
		retryd.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		retryd.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))),
	}, opts...)
	client := newClient(t, proxy.Addr(), opts...)
	return &degradedServer{testServer: ts, proxy: proxy, client: client, reader: reader, spans: spans, timeout: timeout}
}

// cut makes retryd unreachable for the client; restore undoes it.
func (d *degradedServer) cut()     { d.proxy.refuse(true); d.proxy.sever() }
func (d *degradedServer) restore() { d.proxy.refuse(false) }

// waitReachable waits until the client's connection reaches retryd again
// (gRPC reconnects with a backoff of at most 2 s).
func (d *degradedServer) waitReachable(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := d.client.GetChains(t.Context(), "degraded-probe")
		if status.Code(err) != codes.Unavailable {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("retryd still unreachable through the proxy after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// decisions reads the client's decision counter by (decision, local).
func (d *degradedServer) decisions(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := d.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "retryd.client.decisions" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				dec, _ := dp.Attributes.Value(attribute.Key("retryd.decision"))
				local, _ := dp.Attributes.Value(attribute.Key("retryd.decision.local"))
				key := dec.AsString()
				if local.AsBool() {
					key += "/local"
				}
				out[key] += dp.Value
			}
		}
	}
	return out
}

func (d *degradedServer) localSpans() int {
	n := 0
	for _, s := range d.spans.Ended() {
		if s.Name() == "retryd.local_decision" {
			n++
		}
	}
	return n
}

// TestDegradedLocalDecisions: with retryd unreachable, Recover decides
// locally with the request's policy (exact delays, its budget, then a
// local budget_exhausted delegation), marks every outcome, record, span
// and count as local; the first answered call is the server's again.
func TestDegradedLocalDecisions(t *testing.T) {
	t.Parallel()
	d := startDegraded(t)
	ctx := testContext(t)
	const session = "degraded-local"
	// Reach retryd once, so the connection was up before the outage.
	if _, err := d.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: session, Turn: 1, Step: 0}); err != nil {
		t.Fatal(err)
	}
	d.cut()
	for step, want := range []struct {
		retry bool
		delay uint64
	}{{true, 20}, {true, 40}, {false, 0}} {
		start := time.Now()
		out, err := d.client.Recover(ctx, failedStep(session, 1, uint64(step+1), backoffPolicy(20, 2)))
		if err != nil {
			t.Fatalf("step %d: Recover while retryd is unreachable: %v", step+1, err)
		}
		if !out.Local || out.Unreachable == nil || status.Code(out.Unreachable) != codes.Unavailable {
			t.Fatalf("step %d: Local %v, Unreachable %v; want a local decision caused by UNAVAILABLE", step+1, out.Local, out.Unreachable)
		}
		if took := time.Since(start); took > d.timeout+2*time.Second {
			t.Errorf("step %d: the local decision took %v; want about the decision timeout %v", step+1, took, d.timeout)
		}
		if out.Event.GetSequence() != 0 {
			t.Errorf("step %d: a local record has sequence %d, want 0", step+1, out.Event.GetSequence())
		}
		if !want.retry {
			if out.Delegate.GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED ||
				!strings.HasPrefix(out.Event.GetDelegated().GetDetail(), retryd.LocalDetailPrefix) {
				t.Errorf("step %d: %v, record %v; want a local budget_exhausted delegation", step+1, out.Delegate, out.Event)
			}
			continue
		}
		s := out.Event.GetScheduled()
		if !out.Retry || out.Schedule.GetDelayMs() != want.delay || s.GetRetryNumber() != uint32(step+1) ||
			!strings.HasPrefix(s.GetRetryId(), retryd.LocalRetryPrefix) || !strings.HasPrefix(s.GetDetail(), retryd.LocalDetailPrefix) ||
			out.Started.GetRetryId() != s.GetRetryId() || s.GetMaxRetries() != 2 || s.GetPolicyKey() == "" {
			t.Errorf("step %d: outcome %+v, record %v; want local retry %d after %d ms", step+1, out, s, step+1, want.delay)
		}
		if out.Started.GetStartedAt().AsTime().Before(s.GetDueAt().AsTime()) {
			t.Errorf("step %d: started at %v, before its due time %v", step+1, out.Started.GetStartedAt().AsTime(), s.GetDueAt().AsTime())
		}
	}

	d.restore()
	d.waitReachable(t)
	out, err := d.client.Recover(ctx, failedStep(session, 2, 1, backoffPolicy(20, 2)))
	if err != nil {
		t.Fatalf("Recover after retryd is reachable again: %v", err)
	}
	if out.Local || out.Event.GetSequence() == 0 || !out.Retry {
		t.Errorf("after the outage: Local %v, sequence %d, Retry %v; want the server's decision", out.Local, out.Event.GetSequence(), out.Retry)
	}
	got := d.decisions(t)
	want := map[string]int64{"schedule/local": 2, "delegate/local": 1, "schedule": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("retryd.client.decisions = %v, want %v", got, want)
			break
		}
	}
	if n := d.localSpans(); n != 3 {
		t.Errorf("%d retryd.local_decision spans, want 3", n)
	}
	// The local spans name things as retryd's decision spans do.
	var named []string
	for _, s := range d.spans.Ended() {
		if s.Name() != "retryd.local_decision" {
			continue
		}
		for _, kv := range s.Attributes() {
			if k := string(kv.Key); k == "retryd.retry.id" || k == "retryd.retry.number" || k == "retryd.delegate.reason" {
				named = append(named, k)
			}
		}
	}
	slices.Sort(named)
	if w := []string{"retryd.delegate.reason", "retryd.retry.id", "retryd.retry.id", "retryd.retry.number", "retryd.retry.number"}; !slices.Equal(named, w) {
		t.Errorf("local decision spans' attributes %v, want %v", named, w)
	}
	retrydtest.Verify(t, d.conn)
}

// TestDegradedLocalCap: a policy without a finite budget (always mode)
// retries locally only up to WithLocalRetryBudget, then delegates.
func TestDegradedLocalCap(t *testing.T) {
	t.Parallel()
	d := startDegraded(t, retryd.WithLocalRetryBudget(3))
	d.cut()
	ctx := testContext(t)
	always := backoffPolicy(5, 0)
	always.Mode, always.MaxRetries = retrydv1.Mode_MODE_ALWAYS, nil
	retries := 0
	for step := uint64(1); step <= 5; step++ {
		req := failedStep("degraded-cap", 1, step, always)
		req.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
		out, err := d.client.Recover(ctx, req)
		if err != nil || !out.Local {
			t.Fatalf("step %d: %+v, %v; want a local decision", step, out, err)
		}
		if out.Retry {
			retries++
			if out.Event.GetScheduled().MaxRetries != nil {
				t.Errorf("always mode's local record names a maximum: %v", out.Event.GetScheduled())
			}
			continue
		}
		if out.Delegate.GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED {
			t.Errorf("step %d: %v, want budget_exhausted at the local cap", step, out.Delegate)
		}
		break
	}
	if retries != 3 {
		t.Errorf("%d local retries before the cap, want 3", retries)
	}
}

// TestDegradedFailClosed: WithFailClosed returns the transport error
// instead of deciding.
func TestDegradedFailClosed(t *testing.T) {
	t.Parallel()
	d := startDegraded(t, retryd.WithFailClosed())
	d.cut()
	out, err := d.client.Recover(testContext(t), failedStep("degraded-closed", 1, 1, backoffPolicy(20, 2)))
	if status.Code(err) != codes.Unavailable || out.Local {
		t.Errorf("Recover fail-closed = %+v, %v; want UNAVAILABLE and no decision", out, err)
	}
}

// TestDegradedAwaitCannotReattach: retryd scheduled a retry, then became
// unreachable while the agent awaited it. Recover starts the retry itself
// once the decision timeout has passed after its due time. When retryd is
// back, the next report's RETRY_PENDING for that retry is resolved by
// awaiting it (retryd records the start it missed) and the report is
// answered by retryd; the log stays valid.
func TestDegradedAwaitCannotReattach(t *testing.T) {
	t.Parallel()
	d := startDegraded(t)
	ctx := testContext(t)
	const session = "degraded-reattach"
	type result struct {
		out retryd.Outcome
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, err := d.client.Recover(ctx, failedStep(session, 1, 1, backoffPolicy(300, 2)))
		done <- result{out, err}
	}()
	waitAwaiters(t, d.conn, session, 1)
	d.cut()
	r := <-done
	if r.err != nil {
		t.Fatalf("Recover: %v", r.err)
	}
	if !r.out.Local || !r.out.Retry || r.out.Started.GetRetryId() != r.out.Schedule.GetRetryId() ||
		strings.HasPrefix(r.out.Schedule.GetRetryId(), retryd.LocalRetryPrefix) {
		t.Fatalf("outcome %+v; want the server's retry started locally", r.out)
	}
	if took := time.Since(start); took < 300*time.Millisecond+d.timeout {
		t.Errorf("started after %v; want no earlier than the due time plus the decision timeout", took)
	}

	d.restore()
	d.waitReachable(t)
	out, err := d.client.Recover(ctx, failedStep(session, 1, 2, backoffPolicy(300, 2)))
	if err != nil {
		t.Fatalf("the next report after retryd is back: %v", err)
	}
	if out.Local || out.Schedule.GetRetryNumber() != 2 {
		t.Errorf("next report: Local %v, retry %d; want the server's retry 2 (it counted the retry started without it)", out.Local, out.Schedule.GetRetryNumber())
	}
	counts := kindCounts(sessionEvents(t, d.conn, session))
	if counts["started"] != 2 || counts["scheduled"] != 2 {
		t.Errorf("session events %v; want 2 scheduled and 2 started", counts)
	}
	retrydtest.Verify(t, d.conn)
}

// TestDegradedLostAnswer: retryd scheduled a report whose answer never
// reached the client, which decided locally and started its own retry.
// When retryd is back, the session's next report meets RETRY_PENDING for
// that unknown retry; the client awaits it and reports again.
func TestDegradedLostAnswer(t *testing.T) {
	t.Parallel()
	d := startDegraded(t)
	ctx := testContext(t)
	const session = "degraded-lost"
	d.cut()
	req := failedStep(session, 1, 1, backoffPolicy(20, 2))
	out, err := d.client.Recover(ctx, req)
	if err != nil || !out.Local || !out.Retry {
		t.Fatalf("Recover while cut off: %+v, %v; want a local retry", out, err)
	}
	// What the lost report did on the server.
	if _, err := retrydv1.NewRetryServiceClient(d.conn).FailedStep(ctx, req); err != nil {
		t.Fatal(err)
	}
	d.restore()
	d.waitReachable(t)
	out, err = d.client.Recover(ctx, failedStep(session, 1, 2, backoffPolicy(20, 2)))
	if err != nil {
		t.Fatalf("the next report: %v", err)
	}
	if out.Local || !out.Retry || out.Schedule.GetRetryNumber() != 2 {
		t.Errorf("next report: %+v; want the server's retry 2", out)
	}
	retrydtest.Verify(t, d.conn)
}

// TestDegradedBoundedChains: the client keeps at most WithLocalChains
// chains; a forgotten chain starts again at retry 1.
func TestDegradedBoundedChains(t *testing.T) {
	t.Parallel()
	d := startDegraded(t, retryd.WithLocalChains(2))
	d.cut()
	ctx := testContext(t)
	recover := func(session string, step uint64) uint32 {
		t.Helper()
		out, err := d.client.Recover(ctx, failedStep(session, 1, step, backoffPolicy(5, 5)))
		if err != nil || !out.Local {
			t.Fatalf("%s step %d: %+v, %v", session, step, out, err)
		}
		return out.Schedule.GetRetryNumber()
	}
	recover("bounded-a", 1)
	if n := recover("bounded-a", 2); n != 2 {
		t.Fatalf("bounded-a's second local retry is %d, want 2", n)
	}
	recover("bounded-b", 1)
	recover("bounded-c", 1) // the third chain pushes out bounded-a's
	if n := recover("bounded-a", 3); n != 1 {
		t.Errorf("bounded-a after its chain was forgotten: retry %d, want 1", n)
	}
}

// TestDegradedDownstreamPhase: a local decision reads the downstream phase
// as retryd does. An unset phase is NOT_ASKED in the record, and in
// normal mode, where the phase decides nothing, a report of the same step
// with another phase gets the same decision (retryd answers it from the
// step record), not a second retry.
func TestDegradedDownstreamPhase(t *testing.T) {
	t.Parallel()
	d := startDegraded(t)
	d.cut()
	ctx := testContext(t)
	const session = "degraded-phase"
	first, err := d.client.Recover(ctx, failedStep(session, 1, 1, backoffPolicy(5, 5)))
	if err != nil || !first.Local || !first.Retry {
		t.Fatalf("Recover while cut off: %+v, %v; want a local retry", first, err)
	}
	id := first.Event.GetScheduled().GetRetryId()
	for _, phase := range []retrydv1.Downstream{retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, retrydv1.Downstream_DOWNSTREAM_DECLINED} {
		req := failedStep(session, 1, 1, backoffPolicy(5, 5))
		req.Downstream = phase
		out, err := d.client.Recover(ctx, req)
		if err != nil || !out.Local {
			t.Fatalf("the step again with downstream %v: %+v, %v; want a local decision", phase, out, err)
		}
		if got := out.Event.GetScheduled().GetRetryId(); got != id {
			t.Errorf("the step again with downstream %v: retry %q (number %d), want the same retry %q",
				phase, got, out.Event.GetScheduled().GetRetryNumber(), id)
		}
	}
	noProvider := failedStep(session, 1, 2, nil)
	noProvider.Provider, noProvider.PolicySource = "", nil
	out, err := d.client.Recover(ctx, noProvider)
	if err != nil || !out.Local {
		t.Fatalf("a failure without a provider: %+v, %v; want a local delegation", out, err)
	}
	if got := out.Event.GetDelegated().GetDownstream(); got != retrydv1.Downstream_DOWNSTREAM_NOT_ASKED {
		t.Errorf("the local delegation records downstream %v, want %v as retryd records it", got, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED)
	}
}
