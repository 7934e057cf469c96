package memory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
)

// TestFleetStateWithTheDecision: the store keeps the fleet state a
// decision returned, and a decision whose durable write failed leaves
// nothing queued, while the failure it counted and the token it took stay
// spent (the state lives in the process, not on disk).
func TestFleetStateWithTheDecision(t *testing.T) {
	t.Parallel()
	d := newDisk()
	s := New(Config{Persist: d.persist})
	defer s.Close()
	cfg := fleet.DefaultConfig()
	cfg.Capacity, cfg.RefillPerSecond = 5, 0.0001
	p, err := policy.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	decide := func(session string) error {
		_, err := store.New(s).FailedStep(context.Background(), engine.Failure{Policy: p, Fleet: &engine.Fleet{Key: "k", Config: cfg},
			Request: &retrydv1.FailedStepRequest{SessionId: session, Turn: 1, Step: 1, Provider: "p",
				Failure: &retrydv1.Failure{Code: "SERVER"}}})
		return err
	}
	if err := decide("a"); err != nil {
		t.Fatal(err)
	}
	if err := decide("b"); err != nil {
		t.Fatal(err)
	}
	st, err := s.FleetState(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if snap := st.Snapshot(cfg, s.cfg.Now()); snap.Queued != 2 || snap.Failures != 2 || snap.Tokens > 3.01 {
		t.Fatalf("after two decisions: %+v, want 2 queued, 2 failures, 3 tokens", snap)
	}

	d.broken.Store(true)
	if err := decide("c"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("with the disk broken: %v, want unavailable", err)
	}
	st, _ = s.FleetState(context.Background(), "k")
	if snap := st.Snapshot(cfg, s.cfg.Now()); snap.Queued != 2 || snap.Failures != 3 || snap.Tokens > 2.01 {
		t.Fatalf("after a decision that was not written: %+v, want still 2 queued, the failure and its token spent", snap)
	}

	// The service's reports change the same state.
	d.broken.Store(false)
	if err := s.UpdateFleet(context.Background(), "k", cfg, fleet.ReportDropped, s.cfg.Now()); err != nil {
		t.Fatal(err)
	}
	st, _ = s.FleetState(context.Background(), "k")
	if st.Queued != 1 {
		t.Fatalf("after a dropped retry: %d queued, want 1", st.Queued)
	}
	if got, _ := s.FleetState(context.Background(), "unknown"); got.Queued != 0 || got.TokensAt != (time.Time{}) {
		t.Errorf("a key never written: %+v, want the fresh state", got)
	}
}

// TestFleetExpiryBesideATransaction: the sweep of idle fleet states runs
// while a transaction holds a state it read and has not saved yet. The
// sweep waits for that state without holding the map's lock, so the
// transaction's save (which looks the key up again) finishes, then the
// sweep, and the state saved is kept: it is not idle.
func TestFleetExpiryBesideATransaction(t *testing.T) {
	t.Parallel()
	s := New(Config{})
	defer s.Close()
	held, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 2)
	go func() {
		done <- s.Update(context.Background(), "s", "k", store.TransitionFunc(func(tx store.Txn) error {
			fl, _ := tx.Fleet("k")
			close(held)
			<-proceed
			fl.State.Queued = 3
			tx.SaveFleet(fl)
			return nil
		}))
	}()
	<-held
	go func() {
		s.fleets.expire(s.cfg.Now().Add(-time.Minute))
		done <- nil
	}()
	// Time for the sweep to reach the held state; the outcome must not
	// depend on whether it did.
	time.Sleep(50 * time.Millisecond)
	close(proceed)
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the transaction and the sweep of fleet states deadlocked")
		}
	}
	if st, _ := s.FleetState(context.Background(), "k"); st.Queued != 3 {
		t.Errorf("after the sweep: %d queued, want the 3 the transaction saved", st.Queued)
	}
}
