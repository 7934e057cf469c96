package redis

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/redis/redistest"
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
	s, err := Open(context.Background(), Config{StoreOptions: service.StoreOptions{ChainTTL: time.Hour, Now: clock},
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
	first, err := s.FailedStep(ctx, failure(1))
	if err != nil {
		t.Fatal(err)
	}
	// The retry starts: its chain stays open.
	err = s.update(ctx, "s", func(tx *txn) error {
		tx.changed(tx.sess.Start(tx.env, tx.sess.Retry(first.Scheduled.ID), nil).Event)
		tx.clearTimer(first.Scheduled.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	now.Add(int64(2 * time.Hour))

	var second engine.FailOutcome
	group := []*request{
		{id: "s", fn: s.expiry, done: make(chan error, 1)},
		{id: "s", fn: decide(failure(2), &second), done: make(chan error, 1)},
	}
	for i, err := range s.commitGroup(s.keys.partition("s"), group) {
		if err != nil {
			t.Fatalf("transition %d of the group: %v", i, err)
		}
	}
	if second.Response.GetDecision().GetSchedule().GetRetryNumber() != 1 {
		t.Errorf("the decision after the expiry: %v, want retry 1 of a new chain", second.Response)
	}
	chains, err := s.GetChains(ctx, "s")
	if err != nil || chains.GetStep() != 2 || len(chains.GetChains()) != 1 ||
		chains.GetChains()[0].GetLatest().GetRetryId() != second.Scheduled.ID {
		t.Errorf("the session after the group: %v %v, want the new decision", chains, err)
	}
	if _, err := s.CancelRetry(ctx, "", first.Scheduled.ID); err == nil {
		t.Errorf("the expired session's retry %s still answers", first.Scheduled.ID)
	}
	var kinds []string
	err = s.WatchEvents(ctx, &retrydv1.WatchEventsRequest{SessionId: "s", StopAtEnd: true}, func(ev *retrydv1.Event) error {
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
	if st := s.Stats(); st != (service.Stats{Sessions: 1, OpenChains: 1, PendingRetries: 1}) {
		t.Errorf("stats after the group: %+v, want one session with its open chain and pending retry", st)
	}
}

// TestExpiryTimerMovesOnlyEarlier: a write leaves a session's expiry
// timer where it is unless the session now expires earlier than before;
// a timer that falls due early is set to the session's expiry then; and
// the session still expires when it should.
func TestExpiryTimerMovesOnlyEarlier(t *testing.T) {
	t.Parallel()
	s, _, clock := replicaPair(t, false)
	ctx := context.Background()
	pol := fixedPolicy(t, time.Hour, 5)
	timer := func() float64 {
		t.Helper()
		v, err := s.rdb.ZScore(ctx, s.keys.timersKey(0), timerMember("s", expiryTimer)).Result()
		if err != nil {
			t.Fatalf("the expiry timer: %v", err)
		}
		return v
	}
	expiry := func() float64 {
		t.Helper()
		sess, err := s.loadOne(ctx, "s")
		if err != nil || sess == nil {
			t.Fatalf("the session: %v, %v", sess, err)
		}
		return *score(s.expiresAt(sess))
	}

	first, err := s.FailedStep(ctx, failureOf(pol, "s", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := timer(), expiry(); got != want {
		t.Fatalf("a new session's timer is at %v, its expiry %v", got, want)
	}
	// The retry starts: the session no longer waits for its abandon time,
	// so it expires earlier, and the timer moves there.
	clock.advance(time.Minute)
	if err := startRetry(ctx, s, "s", first.Scheduled.ID); err != nil {
		t.Fatal(err)
	}
	early := expiry()
	if got := timer(); got != early {
		t.Fatalf("after the retry started the timer is at %v, the expiry %v", got, early)
	}
	// A new pending retry makes the session expire later: the timer stays.
	clock.advance(time.Minute)
	second, err := s.FailedStep(ctx, failureOf(pol, "s", 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if later := expiry(); later <= early || timer() != early {
		t.Fatalf("after a new retry: the timer is at %v, the expiry %v, the timer was at %v", timer(), later, early)
	}
	// When it falls due, the session is kept and the timer set again.
	clock.ns.Store(int64(early) * int64(time.Millisecond))
	if err := s.expireSession(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if got, want := timer(), expiry(); got != want {
		t.Fatalf("after the early timer: the timer is at %v, the expiry %v", got, want)
	}
	// Once that retry started too, past its expiry the session goes.
	clock.advance(time.Minute)
	if err := startRetry(ctx, s, "s", second.Scheduled.ID); err != nil {
		t.Fatal(err)
	}
	if got, want := timer(), expiry(); got != want {
		t.Fatalf("after the second retry started the timer is at %v, the expiry %v", got, want)
	}
	clock.ns.Store(int64(expiry()+1) * int64(time.Millisecond))
	if err := s.expireSession(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if sess, err := s.loadOne(ctx, "s"); err != nil || sess != nil {
		t.Fatalf("past its expiry the session is %v (%v)", sess, err)
	}
}
