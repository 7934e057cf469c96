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
	failure := func(session string) Failure {
		return Failure{Policy: p, FleetKey: "t\x1fp", FleetConfig: cfg, Request: &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "RATE_LIMIT"}}}
	}
	var fresh fleet.ProviderState
	first, err := NewSession("a", base).Fail(env(0), failure("a"), fresh)
	if err != nil || first.Scheduled == nil || !first.FleetChanged || !first.FleetQueued {
		t.Fatalf("first: %v %+v, want scheduled, queued, with a new fleet state", err, first.Response)
	}
	if first.Fleet.Queued != 1 || first.Fleet.Tokens != 0 {
		t.Fatalf("fleet state after the first: Queued %d Tokens %v, want 1 and 0", first.Fleet.Queued, first.Fleet.Tokens)
	}
	second, err := NewSession("b", base).Fail(env(0), failure("b"), first.Fleet)
	if err != nil || second.Scheduled != nil || second.FleetQueued ||
		second.Response.GetDecision().GetDelegate().GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED {
		t.Fatalf("second, on the first's state: %v %v, want delegated: fleet budget exhausted", err, second.Response)
	}
	if !second.FleetChanged || second.Fleet.Snapshot(cfg, env(0).Now).Failures != 2 {
		t.Errorf("fleet state after the second: %+v, want both failures counted", second.Fleet)
	}
	if again, _ := NewSession("c", base).Fail(env(0), failure("c"), fresh); again.Scheduled == nil {
		t.Errorf("the same failure on a fresh state: %v, want scheduled", again.Response)
	}

	// A repeated report is answered from the step record: the fleet is
	// not asked again, and its state is not to be saved.
	sess := NewSession("d", base)
	if _, err := sess.Fail(env(0), failure("d"), fresh); err != nil {
		t.Fatal(err)
	}
	sess.Commit()
	if replay, err := sess.Fail(env(0), failure("d"), first.Fleet); err != nil || replay.FleetChanged {
		t.Errorf("a repeated report: %v, FleetChanged %t, want the recorded answer and no fleet state", err, replay.FleetChanged)
	}

	// Without a FleetKey the state is not used.
	plain := failure("e")
	plain.FleetKey = ""
	if out, _ := NewSession("e", base).Fail(env(0), plain, second.Fleet); out.Scheduled == nil || out.FleetChanged {
		t.Errorf("an unprotected failure: %v, FleetChanged %t, want scheduled by the policy alone", out.Response, out.FleetChanged)
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
		SessionId: "s", Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}}, fleet.ProviderState{})
	if err != nil || out.Scheduled == nil {
		t.Fatalf("Fail: %v %v", err, out.Response)
	}
	r := out.Scheduled
	now := env(1).Now
	open := fleet.ProviderState{Circuit: fleet.Open, OpenUntil: now.Add(2 * time.Second), Queued: 1}
	held := sess.Start(env(1), r, &Fleet{Config: cfg, State: open})
	if held.Event != nil || r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		t.Fatalf("started behind an open circuit: %v", held.Event)
	}
	if held.HeldUntil.Before(open.OpenUntil) || !held.FleetChanged || held.Fleet.SpreadNext != 1 {
		t.Fatalf("held: until %v (open until %v), fleet %+v; want held past the open period, its spread slot taken",
			held.HeldUntil, open.OpenUntil, held.Fleet)
	}
	closed := fleet.ProviderState{Queued: 1}
	started := sess.Start(env(1), r, &Fleet{Config: cfg, State: closed})
	if started.Event.GetStarted() == nil || !started.HeldUntil.IsZero() || started.Fleet.Queued != 0 {
		t.Fatalf("closed circuit: event %v, held until %v, fleet %+v; want started and no longer queued",
			started.Event, started.HeldUntil, started.Fleet)
	}
	if again := sess.Start(env(2), r, &Fleet{Config: cfg, State: open}); again.Event != nil || again.FleetChanged {
		t.Errorf("a started retry again: %+v, want nothing, the fleet not asked", again)
	}
}
