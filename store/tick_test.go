package store

import (
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
)

// fakeTxn is a transaction over one session in memory, for the rules'
// pure logic: what they record and save is kept for the test to read.
type fakeTxn struct {
	env    engine.Env
	sess   *engine.Session
	events []*retrydv1.Event
	fleets map[string]engine.Fleet
	saved  []engine.Fleet
}

func (t *fakeTxn) Env() engine.Env               { return t.env }
func (t *fakeTxn) Session() *engine.Session      { return t.sess }
func (t *fakeTxn) Create() *engine.Session       { t.sess = engine.NewSession("s", t.env.Now); return t.sess }
func (t *fakeTxn) Record(evs ...*retrydv1.Event) { t.events = append(t.events, evs...) }
func (t *fakeTxn) Forget([]*engine.Retry)        {}
func (t *fakeTxn) SaveFleet(fl engine.Fleet)     { t.saved = append(t.saved, fl) }
func (t *fakeTxn) Fleet(key string) (engine.Fleet, bool) {
	fl, ok := t.fleets[key]
	return fl, ok
}

var base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type zeroRand struct{}

func (zeroRand) Float64() float64 { return 0 }

// scheduled returns a transaction whose session has a pending retry due
// a second after base, admitted by fleet protection under key "k" when
// protected.
func scheduled(t *testing.T, protected bool) (*fakeTxn, *engine.Retry) {
	t.Helper()
	p, err := policy.Resolve(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: ptr[uint64](1000), JitterRatio: ptr(0.0)}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	tx := &fakeTxn{env: engine.Env{Now: base, Rand: zeroRand{}, NewID: func() string { n++; return "r" + string(rune('0'+n)) }},
		fleets: map[string]engine.Fleet{}}
	f := engine.Failure{Policy: p, Request: &retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: 1, Provider: "p",
		Failure: &retrydv1.Failure{Code: "SERVER"}}}
	if protected {
		f.Fleet = &engine.Fleet{Key: "k", Config: fleet.DefaultConfig()}
	}
	out, err := Fail(tx, f)
	if err != nil || out.Scheduled == nil {
		t.Fatalf("Fail: %v %v, want a scheduled retry", err, out.Response)
	}
	if protected {
		tx.fleets["k"] = tx.saved[len(tx.saved)-1]
	}
	tx.sess.Commit()
	tx.events, tx.saved = nil, nil
	return tx, out.Scheduled
}

func ptr[T any](v T) *T { return &v }

// TestTick: the timer rule, for each place a retry's timer can fire.
func TestTick(t *testing.T) {
	t.Parallel()
	const grace = 5 * time.Second
	due := base.Add(time.Second)
	for _, tc := range []struct {
		name     string
		at       time.Time
		awaited  bool
		want     retrydv1.RetryStatus
		wantNext time.Time
	}{
		{"early, awaited: wait for the due time", base, true, retrydv1.RetryStatus_RETRY_STATUS_PENDING, due},
		{"early, nobody awaits: the abandon time", base, false, retrydv1.RetryStatus_RETRY_STATUS_PENDING, due.Add(grace)},
		{"due, awaited: started", due, true, retrydv1.RetryStatus_RETRY_STATUS_STARTED, time.Time{}},
		{"due, nobody awaits: the abandon time", due, false, retrydv1.RetryStatus_RETRY_STATUS_PENDING, due.Add(grace)},
		{"grace over, nobody awaits: abandoned", due.Add(grace), false, retrydv1.RetryStatus_RETRY_STATUS_CANCELLED, time.Time{}},
		{"grace over, awaited at last: started", due.Add(grace), true, retrydv1.RetryStatus_RETRY_STATUS_STARTED, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tx, r := scheduled(t, false)
			tx.env.Now = tc.at
			next := Tick(tx, r, tc.awaited, due.Add(grace))
			if r.Status != tc.want || !next.Equal(tc.wantNext) {
				t.Fatalf("Tick at %v (awaited %t): %s, next %v; want %s, next %v",
					tc.at.Sub(base), tc.awaited, r.Status, next, tc.want, tc.wantNext)
			}
			if changed := tc.want != retrydv1.RetryStatus_RETRY_STATUS_PENDING; changed != (len(tx.events) > 0) {
				t.Errorf("recorded %d events, want some only when the retry ended", len(tx.events))
			}
			if tc.want == retrydv1.RetryStatus_RETRY_STATUS_CANCELLED &&
				tx.events[0].GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_ABANDONED {
				t.Errorf("cancelled %v, want reason abandoned", tx.events[0])
			}
		})
	}
}

// TestTickFleet: a retry fleet protection admitted leaves its provider's
// queue when the timer starts or abandons it, in the same transaction;
// an open circuit holds its start; a state no longer kept is not asked.
func TestTickFleet(t *testing.T) {
	t.Parallel()
	due := base.Add(time.Second)
	t.Run("started", func(t *testing.T) {
		t.Parallel()
		tx, r := scheduled(t, true)
		tx.env.Now = due
		if next := Tick(tx, r, true, due.Add(time.Minute)); !next.IsZero() || r.Status != retrydv1.RetryStatus_RETRY_STATUS_STARTED {
			t.Fatalf("Tick: %s, next %v; want started", r.Status, next)
		}
		if len(tx.saved) != 1 || tx.saved[0].Key != "k" || tx.saved[0].State.Queued != 0 {
			t.Fatalf("saved %+v, want the state of k with nothing queued", tx.saved)
		}
	})
	t.Run("abandoned", func(t *testing.T) {
		t.Parallel()
		tx, r := scheduled(t, true)
		tx.env.Now = due.Add(time.Minute)
		if next := Tick(tx, r, false, due.Add(time.Minute)); !next.IsZero() || r.Status != retrydv1.RetryStatus_RETRY_STATUS_CANCELLED {
			t.Fatalf("Tick: %s, next %v; want cancelled", r.Status, next)
		}
		if len(tx.saved) != 1 || tx.saved[0].State.Queued != 0 {
			t.Fatalf("saved %+v, want the state of k with nothing queued", tx.saved)
		}
	})
	t.Run("held by an open circuit", func(t *testing.T) {
		t.Parallel()
		tx, r := scheduled(t, true)
		fl := tx.fleets["k"]
		fl.State.Circuit, fl.State.OpenUntil = fleet.Open, due.Add(10*time.Second)
		tx.fleets["k"] = fl
		tx.env.Now = due
		next := Tick(tx, r, true, due.Add(time.Minute))
		if r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING || next.Before(fl.State.OpenUntil) || len(tx.events) != 0 {
			t.Fatalf("Tick: %s, next %v, %d events; want held pending past %v", r.Status, next, len(tx.events), fl.State.OpenUntil)
		}
		if len(tx.saved) != 1 {
			t.Errorf("saved %d fleet states, want the one StartDue returned", len(tx.saved))
		}
	})
	t.Run("state expired", func(t *testing.T) {
		t.Parallel()
		tx, r := scheduled(t, true)
		delete(tx.fleets, "k")
		tx.env.Now = due
		if next := Tick(tx, r, true, due.Add(time.Minute)); !next.IsZero() || r.Status != retrydv1.RetryStatus_RETRY_STATUS_STARTED || len(tx.saved) != 0 {
			t.Fatalf("Tick: %s, next %v, saved %+v; want started, no state saved", r.Status, next, tx.saved)
		}
	})
}
