package redis_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
	"github.com/retryd/retryd/store/storetest"
	"google.golang.org/protobuf/proto"
)

// scheduled is a first failure of a session under a policy whose retry is
// due after delay.
func scheduled(t testing.TB, session string, delay time.Duration) engine.Failure {
	t.Helper()
	ms := uint64(delay.Milliseconds())
	p, err := policy.Resolve(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(ms), MaxDelayMs: proto.Uint64(ms), JitterRatio: proto.Float64(0)}})
	if err != nil {
		t.Fatal(err)
	}
	f := failure(session)
	f.Policy = p
	return f
}

// clock is a settable decision clock shared by the replicas of a test.
type clock struct{ now atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.now.Store(time.Now().UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.now.Load()) }
func (c *clock) Advance(d time.Duration) { c.now.Add(int64(d)) }

// TestStats: the population counters follow decisions, cancellations and
// expiry on whichever replica they happen; awaiters are each replica's
// own.
func TestStats(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix()
	clk := newClock()
	cfg := redis.Config{Options: store.Options{ChainTTL: time.Hour, Now: clk.Now}, URL: srv.URL(0), KeyPrefix: prefix}
	replicas := make([]*redis.Store, 2)
	for i := range replicas {
		s, err := redis.Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		replicas[i] = s
	}
	a, b := replicas[0], replicas[1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want := func(what string, want store.Stats, awaitersA, awaitersB int64) {
		t.Helper()
		for {
			ga, gb := a.Stats(), b.Stats()
			wa, wb := want, want
			wa.Awaiters, wb.Awaiters = awaitersA, awaitersB
			if ga == wa && gb == wb {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: stats %+v and %+v, want %+v and %+v", what, ga, gb, wa, wb)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	fail := func(s *redis.Store, f engine.Failure) string {
		t.Helper()
		out, err := store.New(s).FailedStep(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return out.Response.GetDecision().GetSchedule().GetRetryId()
	}

	first := fail(a, scheduled(t, "a", time.Hour))
	want("a scheduled retry", store.Stats{Sessions: 1, OpenChains: 1, PendingRetries: 1}, 0, 0)
	delegated := failure("b")
	delegated.Policy = nil
	fail(b, delegated)
	want("and a delegation", store.Stats{Sessions: 2, OpenChains: 1, PendingRetries: 1}, 0, 0)
	third := fail(b, scheduled(t, "c", 10*time.Hour))
	want("and another retry", store.Stats{Sessions: 3, OpenChains: 2, PendingRetries: 2}, 0, 0)

	awaited := make(chan error, 1)
	go func() {
		awaited <- storetest.AwaitRetry(ctx, a, third, func(*retrydv1.AwaitRetryResponse) error { return nil })
	}()
	want("an awaiter on A", store.Stats{Sessions: 3, OpenChains: 2, PendingRetries: 2}, 1, 0)
	if _, err := storetest.CancelRetry(ctx, b, first); err != nil {
		t.Fatal(err)
	}
	want("the first retry cancelled", store.Stats{Sessions: 3, OpenChains: 1, PendingRetries: 1}, 1, 0)
	// Idle past the TTL, a and b expire; c is kept while its retry pends.
	clk.Advance(2 * time.Hour)
	want("two sessions expired", store.Stats{Sessions: 1, OpenChains: 1, PendingRetries: 1}, 1, 0)
	if _, err := store.New(b).CancelSession(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := <-awaited; err != nil {
		t.Fatal(err)
	}
	want("all cancelled", store.Stats{Sessions: 1}, 0, 0)
	clk.Advance(2 * time.Hour)
	want("all expired", store.Stats{}, 0, 0)
}
