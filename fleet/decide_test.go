package fleet_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
)

// TestDecideThreadsTheState: Decide returns the state after the decision
// and leaves the one it was given as it was. Two failures in a row exhaust
// a budget of one token only because the second decides with the state
// the first returned; decided again on the state given to the first, the
// second retry is scheduled.
func TestDecideThreadsTheState(t *testing.T) {
	t.Parallel()
	cfg := config(func(c *fleet.Config) { c.Capacity, c.RefillPerSecond = 1, 0.001 })
	p, err := policy.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	a := policy.Attempt{Code: "RATE_LIMIT"}
	d := policy.Decision{Schedule: true, DelayMs: 500, RetryNumber: 1, Source: retrydv1.DelaySource_DELAY_SOURCE_BACKOFF}
	// A window already in use: Decide counts the failure into it, and must
	// not do so in the caller's copy.
	given := fleet.ProviderState{Window: make([]fleet.WindowBucket, cfg.WindowBuckets)}
	before := given
	before.Window = append([]fleet.WindowBucket(nil), given.Window...)

	first := fleet.Decide(cfg, given, p, a, d, t0, noRand{t})
	if first.Decision != d || !first.Queued {
		t.Fatalf("first failure: %+v, want the policy's decision, admitted", first)
	}
	if first.State.Queued != 1 || first.State.Tokens != 0 {
		t.Fatalf("state after the first: Queued %d Tokens %v, want 1 and 0", first.State.Queued, first.State.Tokens)
	}
	if !reflect.DeepEqual(given, before) {
		t.Fatalf("Decide changed the state it was given:\n%+v\nwas\n%+v", given, before)
	}

	second := fleet.Decide(cfg, first.State, p, a, d, t0, noRand{t})
	if second.Queued || second.Decision.Schedule ||
		second.Decision.Reason != retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED {
		t.Fatalf("second failure on the first's state: %+v, want delegated, budget exhausted", second)
	}
	if snap := second.State.Snapshot(cfg, t0); snap.Failures != 2 || snap.Queued != 1 {
		t.Errorf("state after the second: %+v, want 2 failures and 1 queued", snap)
	}

	if again := fleet.Decide(cfg, given, p, a, d, t0, noRand{t}); !again.Queued {
		t.Errorf("the second failure on the first's input: %+v, want admitted (the input kept its token)", again)
	}
}

// TestDecideLeavesUnscheduledAlone: a delegation the policy made stays
// one; the failure still counts, and nothing is queued.
func TestDecideLeavesUnscheduledAlone(t *testing.T) {
	t.Parallel()
	cfg := config(nil)
	p, err := policy.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	d := policy.Decision{Reason: retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE}
	got := fleet.Decide(cfg, fleet.ProviderState{}, p, policy.Attempt{Code: "SERVER"}, d, t0, noRand{t})
	if got.Decision != d || got.Queued {
		t.Fatalf("Decide = %+v, want the policy's delegation, nothing queued", got)
	}
	if snap := got.State.Snapshot(cfg, t0); snap.Failures != 1 || snap.Queued != 0 || snap.Tokens != 100 {
		t.Errorf("state %+v, want the failure counted and the budget untouched", snap)
	}
	// Always mode's second report of one failure (declined) is not counted
	// again, and an invalid request says nothing about the provider.
	for _, a := range []policy.Attempt{
		{Code: "SERVER", Downstream: retrydv1.Downstream_DOWNSTREAM_DECLINED},
		{Code: "INVALID_REQUEST"},
	} {
		if st := fleet.Decide(cfg, fleet.ProviderState{}, p, a, d, t0, noRand{t}).State; st.Snapshot(cfg, t0).Failures != 0 {
			t.Errorf("%+v counted as a provider failure", a)
		}
	}
}

// TestStartDueThreadsTheState: with the circuit half-open and one probe
// allowed, the first due retry starts as the probe and the next one,
// asked with the state the first returned, is held; asked with the state
// given to the first, it would start too.
func TestStartDueThreadsTheState(t *testing.T) {
	t.Parallel()
	cfg := config(func(c *fleet.Config) { c.HalfOpenProbes = 1 })
	given := openAt(0)
	now := at(6 * time.Second) // the open period ended at 5 s
	v, next := fleet.StartDue(cfg, given, now, fixedRand(0))
	if v.Action != fleet.StartNow || !v.Probe {
		t.Fatalf("first due retry: %+v, want started as the probe", v)
	}
	if next.Circuit != fleet.HalfOpen || next.ProbesStarted != 1 || given.Circuit != fleet.Open {
		t.Fatalf("state after the first: %+v (given: %+v), want half-open with its probe out, the given one as it was", next, given)
	}
	v2, _ := fleet.StartDue(cfg, next, now, fixedRand(0))
	if v2.Action != fleet.StartLater || !v2.At.After(now) {
		t.Errorf("second due retry on the first's state: %+v, want held", v2)
	}
	if again, _ := fleet.StartDue(cfg, given, now, fixedRand(0)); again.Action != fleet.StartNow {
		t.Errorf("second due retry on the first's input: %+v, want started (the input had no probe out)", again)
	}
}

// TestStartDueHoldsBehindAnOpenCircuit: a retry that falls due while the
// circuit is open waits for its end plus its place in the spread window,
// and the state moves on to the next place.
func TestStartDueHoldsBehindAnOpenCircuit(t *testing.T) {
	t.Parallel()
	cfg := config(nil)
	v, next := fleet.StartDue(cfg, openAt(0), at(time.Second), fixedRand(0))
	if v.Action != fleet.StartLater || !v.At.Equal(at(5*time.Second)) {
		t.Fatalf("StartDue = %+v, want held to the open period's end (phase 0: the first slot)", v)
	}
	v2, _ := fleet.StartDue(cfg, next, at(time.Second), fixedRand(0))
	if v2.Action != fleet.StartLater || !v2.At.Equal(at(5*time.Second+ms(3091))) {
		t.Errorf("the next one = %+v, want the spread window's next slot, 3091 ms after the end", v2)
	}
}

// TestApply: a success credits the budget and, in a half-open round,
// closes the circuit; a dropped retry leaves the queue. The state given
// stays as it was.
func TestApply(t *testing.T) {
	t.Parallel()
	cfg := config(nil)
	given := fleet.ProviderState{Tokens: 10, TokensAt: t0, Circuit: fleet.HalfOpen, HalfOpenSince: t0, Queued: 2,
		Window: make([]fleet.WindowBucket, cfg.WindowBuckets)}
	before := given
	before.Window = append([]fleet.WindowBucket(nil), given.Window...)

	ok := fleet.Apply(cfg, given, fleet.ReportSucceeded, t0)
	if ok.Circuit != fleet.Closed || ok.Tokens != 10.1 || ok.Queued != 2 {
		t.Errorf("after a success: circuit %v, %v tokens, %d queued; want closed, 10.1, 2", ok.Circuit, ok.Tokens, ok.Queued)
	}
	if dropped := fleet.Apply(cfg, given, fleet.ReportDropped, t0); dropped.Queued != 1 || dropped.Circuit != fleet.HalfOpen {
		t.Errorf("after a dropped retry: %d queued, circuit %v; want 1, half-open", dropped.Queued, dropped.Circuit)
	}
	if !reflect.DeepEqual(given, before) {
		t.Errorf("Apply changed the state it was given:\n%+v\nwas\n%+v", given, before)
	}
}
