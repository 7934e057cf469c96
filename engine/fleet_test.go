package engine

import (
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// TestFailThreadsFleetState: a failure of a protected provider decides
// with the fleet state the store hands Fail and returns the state to save.
// Two sessions share a budget of one token: the second failure is
// delegated only because it decides with the state the first returned.
func TestFailThreadsFleetState(t *testing.T) {
	t.Parallel()
	cfg := fleet.DefaultConfig()
	cfg.Capacity, cfg.RefillPerSecond, cfg.SuccessCredit = 1, 0.001, 0
	p := resolve(t, nil)
	failure := func(session string, st fleet.ProviderState) Failure {
		return Failure{Policy: p, Fleet: &Fleet{Key: "t\x1fp", Config: cfg, State: st}, Request: &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "RATE_LIMIT"}}}
	}
	var fresh fleet.ProviderState
	first, err := NewSession("a", base).Fail(env(0), failure("a", fresh))
	if err != nil || first.Scheduled == nil || first.Fleet == nil || !first.FleetQueued {
		t.Fatalf("first: %v %+v, want scheduled, queued, with a new fleet state", err, first.Response)
	}
	if first.Fleet.Key != "t\x1fp" || first.Fleet.State.Queued != 1 || first.Fleet.State.Tokens != 0 {
		t.Fatalf("fleet state after the first: %+v, want key t\x1fp, Queued 1 and Tokens 0", first.Fleet)
	}
	if got := first.Scheduled.FleetKey(); got != "t\x1fp" {
		t.Errorf("the queued retry's FleetKey %q, want the state's key", got)
	}
	second, err := NewSession("b", base).Fail(env(0), failure("b", first.Fleet.State))
	if err != nil || second.Scheduled != nil || second.FleetQueued ||
		second.Response.GetDecision().GetDelegate().GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED {
		t.Fatalf("second, on the first's state: %v %v, want delegated: fleet budget exhausted", err, second.Response)
	}
	if second.Fleet == nil || second.Fleet.State.Snapshot(cfg, env(0).Now).Failures != 2 {
		t.Errorf("fleet state after the second: %+v, want both failures counted", second.Fleet)
	}
	if again, _ := NewSession("c", base).Fail(env(0), failure("c", fresh)); again.Scheduled == nil {
		t.Errorf("the same failure on a fresh state: %v, want scheduled", again.Response)
	}

	// A repeated report is answered from the step record: the fleet is
	// not asked again, and its state is not to be saved.
	sess := NewSession("d", base)
	if _, err := sess.Fail(env(0), failure("d", fresh)); err != nil {
		t.Fatal(err)
	}
	sess.Commit()
	if replay, err := sess.Fail(env(0), failure("d", first.Fleet.State)); err != nil || replay.Fleet != nil {
		t.Errorf("a repeated report: %v, fleet %+v, want the recorded answer and no fleet state", err, replay.Fleet)
	}

	// Without fleet protection no state is used or returned, and the
	// retry keeps no key.
	plain := failure("e", second.Fleet.State)
	plain.Fleet = nil
	if out, _ := NewSession("e", base).Fail(env(0), plain); out.Scheduled == nil || out.Fleet != nil || out.Scheduled.FleetKey() != "" {
		t.Errorf("an unprotected failure: %v, fleet %+v, want scheduled by the policy alone", out.Response, out.Fleet)
	}
}

// TestCancelDrainsTheFleetQueue: cancelling a retry fleet protection
// queued takes it out of the queue in the same transition, given the state
// its key names; a terminal retry, or a state of another key, is left
// alone.
func TestCancelDrainsTheFleetQueue(t *testing.T) {
	t.Parallel()
	cfg := fleet.DefaultConfig()
	p := resolve(t, nil)
	for _, tc := range []struct {
		name      string
		key       string
		wantQueue uint64
		changed   bool
	}{
		{"its key", "t\x1fp", 0, true},
		{"another key", "t\x1fq", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sess := NewSession("s", base)
			out, err := sess.Fail(env(0), Failure{Policy: p, Fleet: &Fleet{Key: "t\x1fp", Config: cfg},
				Request: &retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: 1, Provider: "p",
					Failure: &retrydv1.Failure{Code: "SERVER"}}})
			if err != nil || out.Scheduled == nil || out.Fleet.State.Queued != 1 {
				t.Fatalf("Fail: %v %v, fleet %+v; want a queued retry", err, out.Response, out.Fleet)
			}
			sess.Commit()
			st := &Fleet{Key: tc.key, Config: cfg, State: out.Fleet.State}
			c := sess.Cancel(env(1), out.Scheduled, retrydv1.CancelReason_CANCEL_REASON_ABANDONED, st)
			if len(c.Events) == 0 || (c.Fleet != nil) != tc.changed {
				t.Fatalf("Cancel: %d events, fleet %+v; want a cancellation, fleet changed %t", len(c.Events), c.Fleet, tc.changed)
			}
			if c.Fleet != nil && (c.Fleet.Key != tc.key || c.Fleet.State.Queued != tc.wantQueue) {
				t.Errorf("fleet after the cancellation: %+v, want key %q with %d queued", c.Fleet, tc.key, tc.wantQueue)
			}
			sess.Commit()
			if again := sess.Cancel(env(2), out.Scheduled, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, st); len(again.Events) != 0 || again.Fleet != nil {
				t.Errorf("a cancelled retry again: %+v, want nothing", again)
			}
		})
	}
}

// TestStartThreadsFleetState: a due retry starts only if the fleet state
// the store hands Start lets it; held, it stays pending and the outcome
// says until when, with the state to save.
func TestStartThreadsFleetState(t *testing.T) {
	t.Parallel()
	cfg := fleet.DefaultConfig()
	p := resolve(t, nil)
	sess := NewSession("s", base)
	out, err := sess.Fail(env(0), Failure{Policy: p, Request: &retrydv1.FailedStepRequest{
		SessionId: "s", Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}})
	if err != nil || out.Scheduled == nil {
		t.Fatalf("Fail: %v %v", err, out.Response)
	}
	r := out.Scheduled
	now := env(1).Now
	open := fleet.ProviderState{Circuit: fleet.Open, OpenUntil: now.Add(2 * time.Second), Queued: 1}
	held := sess.Start(env(1), r, &Fleet{Key: "k", Config: cfg, State: open})
	if held.Event != nil || r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		t.Fatalf("started behind an open circuit: %v", held.Event)
	}
	if held.HeldUntil.Before(open.OpenUntil) || held.Fleet == nil || held.Fleet.Key != "k" || held.Fleet.State.SpreadNext != 1 {
		t.Fatalf("held: until %v (open until %v), fleet %+v; want held past the open period, its spread slot taken",
			held.HeldUntil, open.OpenUntil, held.Fleet)
	}
	closed := fleet.ProviderState{Queued: 1}
	started := sess.Start(env(1), r, &Fleet{Key: "k", Config: cfg, State: closed})
	if started.Event.GetStarted() == nil || !started.HeldUntil.IsZero() || started.Fleet.State.Queued != 0 {
		t.Fatalf("closed circuit: event %v, held until %v, fleet %+v; want started and no longer queued",
			started.Event, started.HeldUntil, started.Fleet)
	}
	if again := sess.Start(env(2), r, &Fleet{Key: "k", Config: cfg, State: open}); again.Event != nil || again.Fleet != nil {
		t.Errorf("a started retry again: %+v, want nothing, the fleet not asked", again)
	}
}
