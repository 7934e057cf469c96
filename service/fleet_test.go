package service_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/config"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"
)

// fleetPolicies protect "deepseek" with a budget of two retries that
// practically never refills, and "openai" with a circuit that opens after
// three failures; "mistral" is not protected.
const fleetPolicies = `
providers:
  deepseek:
    fleet: {capacity: 2, refillPerSecond: 0.0001, successCredit: 0, disableCircuit: true, maxFleetRetryAfterMs: 0}
  openai:
    fleet: {disableBudget: true, minSamples: 3, failureThreshold: 0.5, openForMs: 4000, spreadWindowMs: 1000}
  groq:
    fleet: {disableBudget: true, disableCircuit: true, maxFleetRetryAfterMs: 8000, spreadWindowMs: 0}
`

func providerState(t *testing.T, h *harness, ctx context.Context, provider string) *retrydv1.GetProviderStateResponse {
	t.Helper()
	st, err := h.client.GetProviderState(ctx, &retrydv1.GetProviderStateRequest{Provider: provider})
	if err != nil {
		t.Fatalf("GetProviderState(%s): %v", provider, err)
	}
	return st
}

// TestFleetBudget: the provider's budget is shared by every session of a
// tenant: once it is empty, normal mode delegates (fleet_budget_exhausted)
// and schedule mode is paced to at most its cap; another provider and
// another tenant keep their own budgets.
func TestFleetBudget(t *testing.T) {
	eachBackend(t, harnessOpts{policies: fleetPolicies}, func(t *testing.T, h *harness) {
		ctx := context.Background()
		for i := range 2 {
			s := h.schedule(failure(fmt.Sprintf("b%d", i), 1, 1, "deepseek", "RATE_LIMIT", fast(100)))
			if s.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_BACKOFF || s.GetDetail() != "" {
				t.Errorf("retry %d within the budget: %v", i, s)
			}
		}
		resp := h.fail(failure("b2", 1, 1, "deepseek", "RATE_LIMIT", fast(100)))
		dg := resp.GetDecision().GetDelegate()
		if dg.GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED || dg.GetDetail() == "" {
			t.Fatalf("third retry with the budget empty: %v, want fleet_budget_exhausted", resp.GetDecision())
		}
		if resp.GetEvent().GetDelegated().GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED {
			t.Errorf("the event log does not say why: %v", resp.GetEvent())
		}

		// Schedule mode must not end: it is paced, at most to its cap.
		sched := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{100}, TailDelayMs: proto.Uint64(3000)}
		s := h.schedule(failure("paced", 1, 1, "deepseek", "SERVER", sched))
		if s.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_FLEET_BUDGET || s.GetDelayMs() > 3000 || s.GetDelayMs() < 100 ||
			!strings.Contains(s.GetDetail(), "budget") {
			t.Errorf("schedule mode with the budget empty: %v, want paced by the budget within [100, 3000] ms", s)
		}

		st := providerState(t, h, ctx, "deepseek")
		if !st.GetProtected() || st.GetBudgetCapacity() != 2 || st.GetBudgetTokens() > 0.01 || st.GetQueuedRetries() != 3 {
			t.Errorf("deepseek's state: %v, want protected, capacity 2, no tokens left (the refill is 0.0001/s), 3 queued", st)
		}
		// Cancelling a queued retry takes it out of the queue at once: in
		// the cancellation's own transaction.
		if _, err := h.client.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "b0"}}); err != nil {
			t.Fatal(err)
		}
		if n := providerState(t, h, ctx, "deepseek").GetQueuedRetries(); n != 2 {
			t.Errorf("after a queued retry was cancelled: %d queued, want 2", n)
		}

		// Another tenant, and an unprotected provider, are untouched.
		if s := h.schedule(failure("b9", 1, 1, "mistral", "RATE_LIMIT", fast(100))); s.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_BACKOFF {
			t.Errorf("unprotected provider: %v", s)
		}
		if st := providerState(t, h, ctx, "mistral"); st.GetProtected() {
			t.Errorf("mistral reported protected: %v", st)
		}
		resp, err := h.client.FailedStep(as("team-b"), failure("b0", 1, 1, "deepseek", "RATE_LIMIT", fast(100)))
		if err != nil || resp.GetDecision().GetSchedule() == nil {
			t.Errorf("another tenant's first retry: %v %v, want scheduled from its own budget", resp.GetDecision(), err)
		}
		if st := providerState(t, h, as("team-b"), "deepseek"); st.GetBudgetTokens() < 0.99 || st.GetBudgetTokens() > 1.01 {
			t.Errorf("team-b's deepseek budget: %v tokens, want 1", st.GetBudgetTokens())
		}
	})
}

// TestFleetCircuit: failures over the threshold open the provider's
// circuit; retries scheduled then wait for the open period, at most to the
// policy's cap, and say so.
func TestFleetCircuit(t *testing.T) {
	eachBackend(t, harnessOpts{policies: fleetPolicies}, func(t *testing.T, h *harness) {
		ctx := context.Background()
		for i := range 3 {
			h.fail(failure(fmt.Sprintf("c%d", i), 1, 1, "openai", "SERVER", fast(100)))
		}
		st := providerState(t, h, ctx, "openai")
		if st.GetCircuit() != retrydv1.CircuitState_CIRCUIT_STATE_OPEN || st.GetOpenUntil() == nil || st.GetFailureRate() != 1 {
			t.Fatalf("after 3 failures out of 3: %v, want the circuit open", st)
		}
		s := h.schedule(failure("c9", 1, 1, "openai", "SERVER", fast(100)))
		if s.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_CIRCUIT_OPEN || s.GetDelayMs() < 3000 || s.GetDelayMs() > 10_000 ||
			!strings.Contains(s.GetDetail(), "circuit") {
			t.Errorf("retry while open: %v, want held by the circuit for about its 4 s, at most the 10 s cap", s)
		}
		// The other providers' circuits are not affected.
		if st := providerState(t, h, ctx, "groq"); st.GetCircuit() != retrydv1.CircuitState_CIRCUIT_STATE_CLOSED {
			t.Errorf("groq: %v", st)
		}
	})
}

// TestFleetRetryAfter: one agent's provider Retry-After holds every agent's
// retries against the provider.
func TestFleetRetryAfter(t *testing.T) {
	eachBackend(t, harnessOpts{policies: fleetPolicies}, func(t *testing.T, h *harness) {
		first := failure("r0", 1, 1, "groq", "RATE_LIMIT", fast(100))
		first.Failure.ProviderRetryAfterMs = proto.Int64(6000)
		if s := h.schedule(first); s.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER {
			t.Fatalf("the agent that got Retry-After: %v", s)
		}
		s := h.schedule(failure("r1", 1, 1, "groq", "RATE_LIMIT", fast(100)))
		if s.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_PACING || s.GetDelayMs() < 5000 || s.GetDelayMs() > 6100 {
			t.Errorf("another agent's retry: %v, want held by the fleet-wide Retry-After (about 6 s)", s)
		}
		if st := providerState(t, h, context.Background(), "groq"); st.GetEarliestStart() == nil {
			t.Errorf("groq's state shows no earliest start: %v", st)
		}
	})
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10 s")
		}
	}
}

// TestFleetSharedAcrossReplicas: two replicas over one Redis decide with
// one budget per provider: what one spent, the other cannot, and both read
// the same state.
//
// It runs on one Redis, and on a Redis Cluster with one partition (where
// fleet protection works: there is one fleet state per provider).
func TestFleetSharedAcrossReplicas(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]func(t *testing.T) string{
		"redis":         func(t *testing.T) string { return redistest.Shared(t).URL(0) },
		"redis-cluster": func(t *testing.T) string { return redistest.SharedCluster(t).URL() + "&partitions=1" },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testFleetShared(t, url(t)) // the subtest's t: a skip ends its own goroutine
		})
	}
}

// TestFleetRefusedOnPartitions: the service refuses fleet protection over
// a store of several partitions, which would split every provider's
// budget and circuit, and names the way out; without fleet blocks it runs.
func TestFleetRefusedOnPartitions(t *testing.T) {
	t.Parallel()
	policies, err := config.Parse([]byte(fleetPolicies))
	if err != nil {
		t.Fatal(err)
	}
	st, err := redis.Open(context.Background(), redis.Config{
		URL: redistest.Shared(t).URL(0) + "?partitions=4", KeyPrefix: redistest.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, err = service.New(st, service.WithPolicies(policies))
	if err == nil || !strings.Contains(err.Error(), "4 partitions") || !strings.Contains(err.Error(), "partitions=1") {
		t.Fatalf("service over 4 partitions with fleet protection: %v, want a refusal naming partitions=1", err)
	}
	if _, err := service.New(st); err != nil {
		t.Fatalf("service over 4 partitions without fleet protection: %v", err)
	}
}

// fleetReplicas returns two replicas of the service with fleetPolicies
// over one Redis at url: two stores under one key prefix, as two retryd
// processes have them.
func fleetReplicas(t *testing.T, url string) [2]*service.Service {
	t.Helper()
	prefix := redistest.Prefix()
	policies, err := config.Parse([]byte(fleetPolicies))
	if err != nil {
		t.Fatal(err)
	}
	var replicas [2]*service.Service
	for i := range replicas {
		st, err := redis.Open(context.Background(), redis.Config{URL: suiteURL(url), KeyPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if replicas[i], err = service.New(st, service.WithPolicies(policies)); err != nil {
			t.Fatal(err)
		}
	}
	return replicas
}

func testFleetShared(t *testing.T, url string) {
	replicas := fleetReplicas(t, url)
	ctx := context.Background()
	decide := func(r *service.Service, session string) *retrydv1.Decision {
		t.Helper()
		resp, err := r.FailedStep(ctx, failure(session, 1, 1, "deepseek", "RATE_LIMIT", fast(100)))
		if err != nil {
			t.Fatalf("FailedStep: %v", err)
		}
		return resp.GetDecision()
	}
	// The budget holds two retries: one taken on each replica…
	if d := decide(replicas[0], "s0"); d.GetSchedule() == nil {
		t.Fatalf("first retry on replica 0: %v", d)
	}
	if d := decide(replicas[1], "s1"); d.GetSchedule() == nil {
		t.Fatalf("second retry on replica 1: %v", d)
	}
	// …and the third is refused on either.
	for i, r := range replicas {
		if d := decide(r, fmt.Sprintf("s%d", 2+i)); d.GetDelegate().GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED {
			t.Errorf("replica %d with the shared budget spent: %v, want fleet_budget_exhausted", i, d)
		}
	}
	for i, r := range replicas {
		st, err := r.GetProviderState(ctx, &retrydv1.GetProviderStateRequest{Provider: "deepseek"})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetBudgetTokens() > 0.01 || st.GetWindowSamples() != 4 {
			t.Errorf("replica %d reads %v, want the shared state: no tokens, 4 failures", i, st)
		}
	}
}

// TestFleetQueueDrainedOnAnyReplica: a retry fleet protection queued on
// one replica and cancelled through another leaves its provider's queue at
// once, as every replica reads it: the cancellation and the queue change
// are one transaction, whichever replica runs it. Neither replica follows
// the event log here.
func TestFleetQueueDrainedOnAnyReplica(t *testing.T) {
	t.Parallel()
	replicas := fleetReplicas(t, redistest.Shared(t).URL(0))
	ctx := context.Background()
	queued := func() [2]uint32 {
		t.Helper()
		var n [2]uint32
		for i, r := range replicas {
			st, err := r.GetProviderState(ctx, &retrydv1.GetProviderStateRequest{Provider: "deepseek"})
			if err != nil {
				t.Fatal(err)
			}
			n[i] = st.GetQueuedRetries()
		}
		return n
	}
	var ids [2]string
	for i := range ids {
		resp, err := replicas[0].FailedStep(ctx, failure(fmt.Sprintf("q%d", i), 1, 1, "deepseek", "RATE_LIMIT", fast(5000)))
		if err != nil || resp.GetDecision().GetSchedule() == nil {
			t.Fatalf("retry %d on replica 0: %v %v, want scheduled", i, resp.GetDecision(), err)
		}
		ids[i] = resp.GetDecision().GetSchedule().GetRetryId()
	}
	if n := queued(); n != [2]uint32{2, 2} {
		t.Fatalf("queued as the replicas read it: %v, want 2 on both", n)
	}
	// By retry id through the other replica…
	if _, err := replicas[1].CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
		Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: ids[0]}}); err != nil {
		t.Fatal(err)
	}
	if n := queued(); n != [2]uint32{1, 1} {
		t.Errorf("after replica 1 cancelled replica 0's retry: %v queued, want 1 on both", n)
	}
	// …and by session.
	if _, err := replicas[1].CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
		Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "q1"}}); err != nil {
		t.Fatal(err)
	}
	if n := queued(); n != [2]uint32{0, 0} {
		t.Errorf("after replica 1 cancelled replica 0's other session: %v queued, want 0 on both", n)
	}
}

// TestFleetStartGate: a retry admitted while the provider's circuit was
// closed does not start while it is open, even though it fell due; it
// starts (as a probe) once the open period ended.
func TestFleetStartGate(t *testing.T) {
	eachBackend(t, harnessOpts{policies: fleetPolicies}, func(t *testing.T, h *harness) {
		ctx := context.Background()
		early := h.schedule(failure("g0", 1, 1, "openai", "SERVER", fast(200)))
		for i := range 3 {
			h.fail(failure(fmt.Sprintf("g%d", i+1), 1, 1, "openai", "SERVER", fast(100)))
		}
		st := providerState(t, h, ctx, "openai")
		if st.GetCircuit() != retrydv1.CircuitState_CIRCUIT_STATE_OPEN {
			t.Fatalf("circuit %v after 4 failures of 4, want open", st.GetCircuit())
		}
		openUntil := st.GetOpenUntil().AsTime()
		if due := early.GetDueAt().AsTime(); !due.Before(openUntil) {
			t.Fatalf("the early retry is due at %v, not before the open period's end %v: nothing to prove", due, openUntil)
		}
		started := h.start(early.GetRetryId())
		if at := started.GetStartedAt().AsTime(); at.Before(openUntil) {
			t.Errorf("the early retry started at %v, inside the open period (until %v)", at, openUntil)
		}
		if got := providerState(t, h, ctx, "openai").GetQueuedRetries(); got != 3 {
			t.Errorf("queued retries %d after the early one started, want the 3 scheduled while open", got)
		}
	})
}

// TestFleetVisible: what fleet protection did shows in the decision span
// and in the decisions metric, not only in the response.
func TestFleetVisible(t *testing.T) {
	eachBackend(t, harnessOpts{policies: fleetPolicies, telemetry: true}, func(t *testing.T, h *harness) {
		for i := range 3 {
			h.fail(failure(fmt.Sprintf("v%d", i), 1, 1, "deepseek", "RATE_LIMIT", fast(100)))
		}
		sched := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{100}, TailDelayMs: proto.Uint64(3000)}
		h.schedule(failure("v9", 1, 1, "deepseek", "SERVER", sched))

		var rm metricdata.ResourceMetrics
		if err := h.metrics.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		byReason := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "retryd.decisions" {
					for _, dp := range s.DataPoints {
						// A delegation says why by its delegate reason, a
						// schedule by its delay source: never both.
						reason, delegated := dp.Attributes.Value("retryd.delegate.reason")
						source, scheduled := dp.Attributes.Value("retryd.delay.source")
						decision, _ := dp.Attributes.Value("retryd.decision")
						if delegated == scheduled {
							t.Errorf("decisions %v: want exactly one of retryd.delegate.reason and retryd.delay.source", dp.Attributes.ToSlice())
						}
						byReason[decision.AsString()+"/"+reason.AsString()+source.AsString()] += dp.Value
					}
				}
			}
		}
		want := map[string]int64{"schedule/backoff": 2, "delegate/fleet_budget_exhausted": 1, "schedule/fleet_budget": 1}
		for k, n := range want {
			if byReason[k] != n {
				t.Errorf("decisions %s = %d, want %d (all: %v)", k, byReason[k], n, byReason)
			}
		}
		var sources []string
		for _, s := range spansNamed(h.spans, "retryd.decide") {
			if v, ok := attrs(s)["retryd.delay.source"]; ok {
				sources = append(sources, v.AsString())
			}
			if v, ok := attrs(s)["retryd.delegate.reason"]; ok {
				sources = append(sources, v.AsString())
			}
		}
		if !slices.ContainsFunc(sources, func(s string) bool { return strings.Contains(s, "FLEET_BUDGET") }) {
			t.Errorf("no decision span names the fleet budget: %v", sources)
		}
	})
}
