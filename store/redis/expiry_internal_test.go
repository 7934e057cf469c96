package redis

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis/redistest"
	"github.com/retryd/retryd/store/storetest"
	"google.golang.org/protobuf/proto"
)

// TestExpiryThenDecisionInOneGroup: when a session's expiry and a new
// decision of the same session share a group commit, in that order, the
// decision is made on a new session and kept; the expired session's
// chain is logged closed (expired) and its retry forgotten.
func TestExpiryThenDecisionInOneGroup(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s, err := Open(context.Background(), Config{Options: store.Options{ChainTTL: time.Hour, Now: clock},
		URL: redistest.Shared(t).URL(0), KeyPrefix: redistest.Prefix(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()

	p, err := policy.Resolve(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(10), MaxDelayMs: proto.Uint64(10), JitterRatio: proto.Float64(0)}})
	if err != nil {
		t.Fatal(err)
	}
	failure := func(step uint64) engine.Failure {
		return engine.Failure{Policy: p, Request: &retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: step,
			Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}}
	}
	first, err := store.New(s).FailedStep(ctx, failure(1))
	if err != nil {
		t.Fatal(err)
	}
	// The retry starts: its chain stays open.
	err = s.update(ctx, "s", func(tx *txn) error {
		tx.changed(tx.sess.Start(tx.env, tx.sess.Retry(first.Scheduled.ID), nil).Event)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	now.Add(int64(2 * time.Hour))

	var second engine.FailOutcome
	group := []*request{
		{id: "s", fn: s.woken, done: make(chan error, 1), bound: time.Now().Add(time.Minute)},
		{id: "s", fn: decide(failure(2), &second), done: make(chan error, 1), bound: time.Now().Add(time.Minute)},
	}
	for i, err := range s.commitGroup(s.keys.partition("s"), group) {
		if err != nil {
			t.Fatalf("transition %d of the group: %v", i, err)
		}
	}
	if second.Response.GetDecision().GetSchedule().GetRetryNumber() != 1 {
		t.Errorf("the decision after the expiry: %v, want retry 1 of a new chain", second.Response)
	}
	chains, err := store.New(s).GetChains(ctx, "s")
	if err != nil || chains.GetStep() != 2 || len(chains.GetChains()) != 1 ||
		chains.GetChains()[0].GetLatest().GetRetryId() != second.Scheduled.ID {
		t.Errorf("the session after the group: %v %v, want the new decision", chains, err)
	}
	if _, err := storetest.CancelRetry(ctx, s, first.Scheduled.ID); err == nil {
		t.Errorf("the expired session's retry %s still answers", first.Scheduled.ID)
	}
	var kinds []string
	err = store.New(s).WatchEvents(ctx, &retrydv1.WatchEventsRequest{SessionId: "s", StopAtEnd: true}, func(ev *retrydv1.Event) error {
		switch {
		case ev.GetScheduled() != nil:
			kinds = append(kinds, "scheduled")
		case ev.GetStarted() != nil:
			kinds = append(kinds, "started")
		case ev.GetClosed() != nil:
			kinds = append(kinds, "closed:"+ev.GetClosed().GetReason().String())
		default:
			kinds = append(kinds, "other")
		}
		return nil
	})
	if want := []string{"scheduled", "started", "closed:CLOSE_REASON_EXPIRED", "scheduled"}; err != nil || !slices.Equal(kinds, want) {
		t.Errorf("the session's log: %v %v, want %v", kinds, err, want)
	}
	if st := s.Stats(); st != (store.Stats{Sessions: 1, OpenChains: 1, PendingRetries: 1}) {
		t.Errorf("stats after the group: %+v, want one session with its open chain and pending retry", st)
	}
}

// TestSessionTimer: a session has one timer, at its pending retry's
// abandon time while nobody awaits the retry (so an unawaited retry's
// timer fires once, and abandons it), at its due time once an agent
// attaches, and at its expiry without a pending retry; a write that
// changes none of that leaves it; a timer that falls due early is set
// again; past its expiry the session goes, and its timer with it.
func TestSessionTimer(t *testing.T) {
	t.Parallel()
	s, _, clock := replicaPair(t, false)
	ctx := context.Background()
	pol := fixedPolicy(t, time.Hour, 5)
	key := s.keys.timersKey(0)
	timer := func() float64 {
		t.Helper()
		if n := s.rdb.ZCard(ctx, key).Val(); n != 1 {
			t.Fatalf("%d timers, want the session's one", n)
		}
		v, err := s.rdb.ZScore(ctx, key, timerMember("s")).Result()
		if err != nil {
			t.Fatalf("the session's timer: %v", err)
		}
		return v
	}
	session := func() *engine.Session {
		t.Helper()
		sess, err := s.loadOne(ctx, "s")
		if err != nil || sess == nil {
			t.Fatalf("the session: %v, %v", sess, err)
		}
		return sess
	}
	expiry := func() float64 { return *score(s.expiresAt(session())) }
	ms := func(at time.Time) float64 { return *score(at) }
	grace := time.Minute // openReplica's AbandonGrace

	first, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	due := first.Scheduled.Due()
	if got, want := timer(), ms(due.Add(grace)); got != want {
		t.Fatalf("an unawaited retry's timer is at %v, want its abandon time %v", got, want)
	}
	// A repeated report changes nothing: neither does the timer.
	if _, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 1)); err != nil {
		t.Fatal(err)
	}
	if got, want := timer(), ms(due.Add(grace)); got != want {
		t.Fatalf("after a repeated report the timer is at %v, want %v", got, want)
	}
	// An agent attaches: the timer moves to the due time, and stays there.
	aw, err := s.attach(ctx, "s", first.Scheduled.ID, due)
	if err != nil {
		t.Fatal(err)
	}
	aw.Detach()
	if got, want := timer(), ms(due); got != want {
		t.Fatalf("after an agent attached the timer is at %v, want the due time %v", got, want)
	}
	// The retry starts: the session now waits for its expiry.
	clock.advance(time.Minute)
	if err := startRetry(ctx, s, "s", first.Scheduled.ID); err != nil {
		t.Fatal(err)
	}
	if got, want := timer(), expiry(); got != want {
		t.Fatalf("after the retry started the timer is at %v, the expiry %v", got, want)
	}
	// A new pending retry moves it to the retry's abandon time.
	clock.advance(time.Minute)
	second, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	abandon := ms(second.Scheduled.Due().Add(grace))
	if got := timer(); got != abandon {
		t.Fatalf("after a new retry the timer is at %v, want its abandon time %v", got, abandon)
	}
	// Falling due early (as after an agent left), it is set again.
	if err := s.rdb.ZAdd(ctx, key, goredis.Z{Score: ms(clock.now()), Member: timerMember("s")}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.wake(ctx, "s", ""); err != nil {
		t.Fatal(err)
	}
	if got := timer(); got != abandon {
		t.Fatalf("after an early timer it is at %v, want the abandon time %v", got, abandon)
	}
	// At the abandon time the retry is abandoned, in that one firing.
	clock.ns.Store(int64(abandon) * int64(time.Millisecond))
	if err := s.wake(ctx, "s", ""); err != nil {
		t.Fatal(err)
	}
	if r := session().Retry(second.Scheduled.ID); r.Status != retrydv1.RetryStatus_RETRY_STATUS_CANCELLED {
		t.Fatalf("at its abandon time the retry is %v", r.Status)
	}
	if got, want := timer(), expiry(); got != want {
		t.Fatalf("after the abandonment the timer is at %v, the expiry %v", got, want)
	}
	// Past its expiry the session goes, and its timer.
	clock.ns.Store(int64(expiry()+1) * int64(time.Millisecond))
	if err := s.wake(ctx, "s", ""); err != nil {
		t.Fatal(err)
	}
	if sess, err := s.loadOne(ctx, "s"); err != nil || sess != nil {
		t.Fatalf("past its expiry the session is %v (%v)", sess, err)
	}
	if n := s.rdb.ZCard(ctx, key).Val(); n != 0 {
		t.Errorf("%d timers once the session expired", n)
	}
}
