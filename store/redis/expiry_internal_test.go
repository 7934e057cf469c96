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
