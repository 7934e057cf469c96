package admission

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// These tests drive the counts with synthetic events, in the order a log
// would show them, and a clock of their own.

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestAdmission(t *testing.T, l Limits) (*Control, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a, err := New(l, clock.now, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return a, clock
}

type eventLog struct {
	seq   uint64
	clock *fakeClock
}

func (l *eventLog) next(session string, ev *retrydv1.Event) *retrydv1.Event {
	l.seq++
	ev.Sequence, ev.SessionId, ev.Time = l.seq, session, timestamppb.New(l.clock.t)
	return ev
}

func (l *eventLog) scheduled(session, provider, key, retryID string, turn, step uint64, number uint32) *retrydv1.Event {
	return l.next(session, &retrydv1.Event{Kind: &retrydv1.Event_Scheduled{Scheduled: &retrydv1.RetryScheduled{
		RetryId: retryID, Turn: turn, Step: step, Provider: provider, PolicyKey: key, RetryNumber: number,
		Mode: retrydv1.Mode_MODE_NORMAL, DueAt: timestamppb.New(l.clock.t.Add(time.Second)),
	}}})
}

func (l *eventLog) started(session, retryID string) *retrydv1.Event {
	return l.next(session, &retrydv1.Event{Kind: &retrydv1.Event_Started{Started: &retrydv1.RetryStarted{RetryId: retryID}}})
}

func (l *eventLog) cancelled(session, retryID string) *retrydv1.Event {
	return l.next(session, &retrydv1.Event{Kind: &retrydv1.Event_Cancelled{Cancelled: &retrydv1.RetryCancelled{RetryId: retryID}}})
}

func (l *eventLog) closed(session, provider, key string) *retrydv1.Event {
	return l.next(session, &retrydv1.Event{Kind: &retrydv1.Event_Closed{Closed: &retrydv1.ChainClosed{Provider: provider, PolicyKey: key}}})
}

func (l *eventLog) delegated(session string, turn, step uint64) *retrydv1.Event {
	return l.next(session, &retrydv1.Event{Kind: &retrydv1.Event_Delegated{Delegated: &retrydv1.RetryDelegated{Turn: turn, Step: step}}})
}

func wantCounts(t *testing.T, a *Control, what string, tenantID string, want counts) {
	t.Helper()
	var got counts
	if tc := a.tenants[tenantID]; tc != nil {
		got = tc.logged
	}
	if got != want {
		t.Errorf("%s: tenant %q holds %+v, want %+v", what, tenantID, got, want)
	}
}

// TestAdmissionCountsFollowTheLog: Scheduled opens a pending retry, its
// chain and its session; Started and Cancelled of that retry end it;
// ChainClosed closes the chain; a session holding nothing is forgotten,
// and so is a tenant.
func TestAdmissionCountsFollowTheLog(t *testing.T) {
	t.Parallel()
	a, clock := newTestAdmission(t, Limits{PendingRetries: 100})
	log := &eventLog{clock: clock}
	s1, s2, b1 := "team-a\x1fs1", "team-a\x1fs2", "team-b\x1fs1"
	for _, step := range []struct {
		what    string
		ev      *retrydv1.Event
		a, b    counts
		tracked int
	}{
		{"s1 scheduled", log.scheduled(s1, "p", "k", "r1", 1, 1, 1), counts{1, 1, 1}, counts{}, 1},
		{"b1 scheduled", log.scheduled(b1, "p", "k", "r2", 1, 1, 1), counts{1, 1, 1}, counts{1, 1, 1}, 2},
		{"unknown retry started", log.started(s1, "nope"), counts{1, 1, 1}, counts{1, 1, 1}, 2},
		{"s1's retry started", log.started(s1, "r1"), counts{0, 1, 1}, counts{1, 1, 1}, 2},
		{"s1's delegation", log.delegated(s1, 1, 2), counts{0, 1, 1}, counts{1, 1, 1}, 2},
		{"s1's delegation cancelled (no retry id)", log.cancelled(s1, ""), counts{0, 1, 1}, counts{1, 1, 1}, 2},
		{"s1's second chain", log.scheduled(s1, "q", "k", "r3", 1, 3, 1), counts{1, 2, 1}, counts{1, 1, 1}, 2},
		{"s1's second retry cancelled", log.cancelled(s1, "r3"), counts{0, 2, 1}, counts{1, 1, 1}, 2},
		{"s1's second chain closed", log.closed(s1, "q", "k"), counts{0, 1, 1}, counts{1, 1, 1}, 2},
		{"an unknown chain closed", log.closed(s1, "x", "k"), counts{0, 1, 1}, counts{1, 1, 1}, 2},
		{"s2's delegation opens nothing", log.delegated(s2, 1, 1), counts{0, 1, 1}, counts{1, 1, 1}, 2},
		{"s1's first chain closed", log.closed(s1, "p", "k"), counts{}, counts{1, 1, 1}, 1},
		{"b1 cancelled", log.cancelled(b1, "r2"), counts{}, counts{0, 1, 1}, 1},
		{"b1 expired", log.closed(b1, "p", "k"), counts{}, counts{}, 0},
	} {
		a.Observe(step.ev)
		wantCounts(t, a, step.what, "team-a", step.a)
		wantCounts(t, a, step.what, "team-b", step.b)
		if len(a.sessions) != step.tracked {
			t.Errorf("%s: %d sessions tracked, want %d", step.what, len(a.sessions), step.tracked)
		}
	}
	if len(a.tenants) != 0 || a.logged != (counts{}) {
		t.Errorf("after every end: tenants %v, totals %+v", a.tenants, a.logged)
	}
}

func testFailure(t *testing.T, session string, turn, step uint64, code string, p *retrydv1.RetryPolicy) engine.Failure {
	t.Helper()
	pol, err := policy.Resolve(p)
	if err != nil {
		t.Fatal(err)
	}
	return engine.Failure{
		Request: &retrydv1.FailedStepRequest{SessionId: session, Turn: turn, Step: step, Provider: "p",
			Failure: &retrydv1.Failure{Code: code}},
		Policy: pol,
	}
}

func scheduledOutcome(ev *retrydv1.Event) engine.FailOutcome {
	return engine.FailOutcome{Response: &retrydv1.FailedStepResponse{Event: ev}, Scheduled: &engine.Retry{}}
}

// TestAdmissionReservations: an admitted failure holds its reservation
// until the log shows its Scheduled event (counted once: the reservation
// ends as the event is counted), or at once when it scheduled nothing, or
// after reservationTimeout when the log never shows it.
func TestAdmissionReservations(t *testing.T) {
	t.Parallel()
	a, clock := newTestAdmission(t, Limits{PendingRetriesPerTenant: 1})
	log := &eventLog{clock: clock}
	p := &retrydv1.RetryPolicy{}
	refused := func(what string, f engine.Failure) {
		t.Helper()
		var refusal *Refusal
		if r, err := a.Admit(f, clock.now()); !errors.As(err, &refusal) || refusal.Bound != "pending_retries_per_tenant" {
			t.Errorf("%s: %v %v, want a refusal at pending_retries_per_tenant", what, r, err)
		}
	}

	r1, err := a.Admit(testFailure(t, "s1", 1, 1, "SERVER", p), clock.now())
	if err != nil || r1 == nil {
		t.Fatalf("first admission: %v %v", r1, err)
	}
	refused("while s1's is in flight", testFailure(t, "s2", 1, 1, "SERVER", p))
	// Decided: the log has not shown it yet, so the reservation stays.
	ev := log.scheduled("s1", "p", "k", "r1", 1, 1, 1)
	a.Decided(r1, scheduledOutcome(ev), nil)
	refused("while the log lags", testFailure(t, "s2", 1, 1, "SERVER", p))
	if a.reserved.pending != 1 || a.ahead["s1"] != r1 || r1.next != nil || len(a.ahead) != 1 {
		t.Fatalf("reserved %+v, ahead %v; want s1's reservation held", a.reserved, a.ahead)
	}
	a.Observe(ev)
	if a.reserved != (counts{}) || a.logged != (counts{1, 1, 1}) {
		t.Errorf("after the log showed it: reserved %+v, held %+v; want it counted once", a.reserved, a.logged)
	}
	refused("while s1's retry is pending", testFailure(t, "s2", 1, 1, "SERVER", p))
	a.Observe(log.started("s1", "r1"))

	// A failure that scheduled nothing releases at once.
	r2, err := a.Admit(testFailure(t, "s2", 1, 1, "SERVER", p), clock.now())
	if err != nil || r2 == nil {
		t.Fatalf("s2: %v %v", r2, err)
	}
	a.Decided(r2, engine.FailOutcome{}, errors.New("store unavailable"))
	if a.reserved != (counts{}) {
		t.Errorf("after a failed decision: reserved %+v", a.reserved)
	}

	// A decision the log already showed releases at once too.
	r3, _ := a.Admit(testFailure(t, "s3", 1, 1, "SERVER", p), clock.now())
	ev3 := log.scheduled("s3", "p", "k", "r3", 1, 1, 1)
	a.Observe(ev3)
	a.Decided(r3, scheduledOutcome(ev3), nil)
	if a.reserved != (counts{}) || a.logged.pending != 1 {
		t.Errorf("decided after the log: reserved %+v, held %+v", a.reserved, a.logged)
	}
	a.Observe(log.cancelled("s3", "r3"))

	// A partitioned store may show a session's event after later
	// sequences of other sessions: the reservation holds until the log
	// shows its own session's event.
	r6, _ := a.Admit(testFailure(t, "s6", 1, 1, "SERVER", p), clock.now())
	ev6 := log.scheduled("s6", "p", "k", "r6", 1, 1, 1)
	a.Decided(r6, scheduledOutcome(ev6), nil)
	a.Observe(log.started("s7", "r7")) // a later sequence, another session
	if a.reserved.pending != 1 {
		t.Errorf("after a later event of another session: reserved %+v, want s6's held", a.reserved)
	}
	a.Observe(ev6)
	if a.reserved != (counts{}) || a.logged.pending != 1 {
		t.Errorf("after s6's own event: reserved %+v, held %+v; want it counted once", a.reserved, a.logged)
	}
	a.Observe(log.cancelled("s6", "r6"))

	// A decision the log never shows is released after the timeout.
	r4, _ := a.Admit(testFailure(t, "s4", 1, 1, "SERVER", p), clock.now())
	a.Decided(r4, scheduledOutcome(&retrydv1.Event{Sequence: 1000}), nil)
	refused("while s4's reservation waits", testFailure(t, "s5", 1, 1, "SERVER", p))
	clock.t = clock.t.Add(reservationTimeout + time.Second)
	if r, err := a.Admit(testFailure(t, "s5", 1, 1, "SERVER", p), clock.now()); err != nil || r == nil {
		t.Errorf("after the reservation timed out: %v %v", r, err)
	}
}

// TestAdmissionReservationsOfOneSession: reports of one session admitted
// before any was decided each hold a reservation, and each ends on its
// own: at its own sequence, or at its timeout.
func TestAdmissionReservationsOfOneSession(t *testing.T) {
	t.Parallel()
	a, clock := newTestAdmission(t, Limits{PendingRetriesPerTenant: 3})
	log := &eventLog{clock: clock}
	p := &retrydv1.RetryPolicy{}
	r1, err1 := a.Admit(testFailure(t, "s1", 1, 1, "SERVER", p), clock.now())
	r2, err2 := a.Admit(testFailure(t, "s1", 1, 2, "SERVER", p), clock.now())
	r3, err3 := a.Admit(testFailure(t, "s1", 1, 3, "SERVER", p), clock.now())
	if r1 == nil || r2 == nil || r3 == nil || err1 != nil || err2 != nil || err3 != nil {
		t.Fatalf("admissions: %v %v %v, %v %v %v", r1, r2, r3, err1, err2, err3)
	}
	ev1 := log.scheduled("s1", "p", "k", "r1", 1, 1, 1)
	ev2 := log.cancelled("s1", "r1")
	ev3 := log.scheduled("s1", "p", "k", "r3", 1, 3, 2)
	a.Decided(r1, scheduledOutcome(ev1), nil)
	a.Decided(r3, scheduledOutcome(ev3), nil)
	a.Decided(r2, scheduledOutcome(&retrydv1.Event{Sequence: 1000}), nil) // never shown
	if a.reserved.pending != 3 {
		t.Fatalf("decided, nothing shown: reserved %+v, want 3 pending", a.reserved)
	}
	a.Observe(ev1)
	a.Observe(ev2)
	if a.reserved.pending != 2 {
		t.Errorf("after r1's event: reserved %+v, want r2's and r3's held", a.reserved)
	}
	if _, err := a.Admit(testFailure(t, "s1", 1, 4, "SERVER", p), clock.now()); err != nil {
		t.Errorf("while s1 has reservations ahead: %v, want no refusal (the store answers)", err)
	}
	a.Observe(ev3)
	if a.reserved.pending != 1 || a.ahead["s1"] != r2 || r2.next != nil {
		t.Errorf("after r3's event: reserved %+v, ahead %v; want r2's alone held", a.reserved, a.ahead)
	}
	clock.t = clock.t.Add(reservationTimeout + time.Second)
	a.sweep(clock.t)
	if a.reserved != (counts{}) || len(a.ahead) != 0 {
		t.Errorf("after the timeout: reserved %+v, ahead %v; want nothing", a.reserved, a.ahead)
	}
}

// TestAdmissionPredictsWhatAddsNothing: at a bound, what the log shows of
// a session decides whether a failure may add work.
func TestAdmissionPredictsWhatAddsNothing(t *testing.T) {
	t.Parallel()
	a, clock := newTestAdmission(t, Limits{PendingRetriesPerTenant: 1})
	log := &eventLog{clock: clock}
	one := &retrydv1.RetryPolicy{MaxRetries: new(uint32(1))}
	key := testFailure(t, "s1", 1, 1, "SERVER", one).Policy.Key
	// s1's chain used its one retry, which started; s0 holds the bound.
	a.Observe(log.scheduled("s1", "p", key, "r1", 1, 1, 1))
	a.Observe(log.started("s1", "r1"))
	a.Observe(log.scheduled("s0", "p", key, "r0", 1, 1, 1))
	for _, tc := range []struct {
		what string
		f    engine.Failure
		pass bool
	}{
		{"over the budget", testFailure(t, "s1", 1, 2, "SERVER", one), true},
		{"a repeat of the scheduled step", testFailure(t, "s1", 1, 1, "SERVER", one), true},
		{"a stale step", testFailure(t, "s1", 0, 9, "SERVER", one), true},
		{"a code not retried", testFailure(t, "s2", 1, 1, "INVALID_REQUEST", one), true},
		{"a session with a pending retry", testFailure(t, "s0", 1, 2, "SERVER", one), true},
		{"a new session", testFailure(t, "s2", 1, 1, "SERVER", one), false},
		{"another policy in s1", testFailure(t, "s1", 1, 2, "SERVER", &retrydv1.RetryPolicy{}), false},
	} {
		r, err := a.Admit(tc.f, clock.now())
		if pass := err == nil; pass != tc.pass {
			t.Errorf("%s: admitted %v (%v), want %v", tc.what, pass, err, tc.pass)
		}
		if r != nil {
			t.Errorf("%s: reserved %+v at the bound", tc.what, r.need)
		}
	}
}

// TestAdmissionForget: the backstop stops counting a session whose end
// the log never showed, Forget after its last event (or after its
// pending retry's due time).
func TestAdmissionForget(t *testing.T) {
	t.Parallel()
	a, clock := newTestAdmission(t, Limits{PendingRetries: 10, Forget: time.Hour})
	log := &eventLog{clock: clock}
	a.Observe(log.scheduled("idle", "p", "k", "r1", 1, 1, 1))
	a.Observe(log.started("idle", "r1"))
	clock.t = clock.t.Add(30 * time.Minute)
	a.Observe(log.scheduled("pending", "p", "k", "r2", 1, 1, 1))
	clock.t = clock.t.Add(31 * time.Minute)
	a.sweep(clock.t)
	if _, ok := a.sessions["idle"]; ok || len(a.sessions) != 1 || a.logged != (counts{1, 1, 1}) {
		t.Errorf("after an hour: %d sessions tracked, held %+v; want only the pending one", len(a.sessions), a.logged)
	}
	clock.t = clock.t.Add(time.Hour)
	a.sweep(clock.t)
	if len(a.sessions) != 0 || a.logged != (counts{}) || len(a.tenants) != 0 {
		t.Errorf("after two: %d sessions tracked, held %+v", len(a.sessions), a.logged)
	}
}
