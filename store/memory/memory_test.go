package memory

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/storetest"
	"google.golang.org/protobuf/proto"
)

// clock is a settable time source for expiry tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func fail(t *testing.T, s *Store, session string, step uint64, delayMs uint64) *retrydv1.FailedStepResponse {
	t.Helper()
	p, err := policy.Resolve(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(delayMs), MaxDelayMs: proto.Uint64(delayMs), JitterRatio: proto.Float64(0)}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := store.New(s).FailedStep(context.Background(), engine.Failure{
		Request: &retrydv1.FailedStepRequest{SessionId: session, Turn: step, Step: step, Provider: "p",
			Failure: &retrydv1.Failure{Code: "SERVER"}},
		Policy: p,
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Response
}

func TestExpiryKeepsPendingSessions(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := New(Config{Options: store.Options{ChainTTL: time.Hour, Now: c.Now}})
	defer s.Close()

	idle := fail(t, s, "idle", 1, 1)
	idleID := idle.GetDecision().GetSchedule().GetRetryId()
	if _, err := storetest.CancelRetry(context.Background(), s, idleID); err != nil {
		t.Fatal(err)
	}
	pending := fail(t, s, "pending", 1, 10_000_000)
	// A session whose chain is open (its retry started) closes it on expiry.
	open := fail(t, s, "open", 1, 1)
	r, err := s.indexed(open.GetDecision().GetSchedule().GetRetryId())
	if err != nil {
		t.Fatal(err)
	}
	sh, h := s.shardOf("open")
	sh.mu.Lock()
	if ev := sh.sessions.get(h, "open").Start(s.env(), r, nil).Event; ev != nil {
		s.log.append(ev)
	}
	sh.mu.Unlock()

	c.advance(2 * time.Hour)
	s.expire(c.Now().Add(-time.Hour))

	evs, _, _ := s.log.read(0, "open", 100)
	if last := evs[len(evs)-1].GetClosed(); last.GetReason() != retrydv1.CloseReason_CLOSE_REASON_EXPIRED {
		t.Errorf("expiry of an open chain logged %v, want a closed(expired) event", evs[len(evs)-1])
	}
	if n := s.Len(); n != 1 {
		t.Fatalf("%d sessions after expiry, want 1 (the one with a pending retry)", n)
	}
	if _, err := s.indexed(idleID); err == nil {
		t.Errorf("expired session's retry %s is still indexed", idleID)
	}
	if _, err := s.indexed(pending.GetDecision().GetSchedule().GetRetryId()); err != nil {
		t.Errorf("pending retry lost: %v", err)
	}
	if _, err := store.New(s).GetChains(context.Background(), "idle"); err == nil {
		t.Error("expired session still answers GetChains")
	}
}

func TestRetainedRetriesAreBounded(t *testing.T) {
	t.Parallel()
	s := New(Config{})
	defer s.Close()
	var ids []string
	for step := uint64(1); step <= engine.MaxRetainedRetries+4; step++ {
		resp := fail(t, s, "s", step, 1_000_000)
		id := resp.GetDecision().GetSchedule().GetRetryId()
		if id == "" {
			// The budget of 2 is used: the chain closed, the next failure starts again.
			continue
		}
		ids = append(ids, id)
		if _, err := storetest.CancelRetry(context.Background(), s, id); err != nil {
			t.Fatal(err)
		}
	}
	indexed := 0
	for _, id := range ids {
		if _, err := s.indexed(id); err == nil {
			indexed++
		}
	}
	if indexed != engine.MaxRetainedRetries {
		t.Errorf("%d of %d retries still indexed, want %d", indexed, len(ids), engine.MaxRetainedRetries)
	}
	if _, err := s.indexed(ids[0]); err == nil {
		t.Error("the oldest retry is still indexed")
	}
}

func TestTimerHeapOrder(t *testing.T) {
	t.Parallel()
	h := newTimerHeap()
	base := time.Now().Add(-time.Second)
	for _, i := range []int{5, 1, 4, 2, 3} {
		h.push(base.Add(time.Duration(i)*time.Millisecond), &engine.Retry{ID: fmt.Sprint(i)})
	}
	for want := 1; want <= 5; want++ {
		e, ok := h.next(time.Now)
		if !ok || e.retry.ID != fmt.Sprint(want) {
			t.Fatalf("entry %d: got %v %v", want, e.retry.ID, ok)
		}
	}
	h.stop()
	if _, ok := h.next(time.Now); ok {
		t.Error("next after stop returned an entry")
	}
}

// BenchmarkFailedStep measures one decision through the store (no gRPC):
// a fresh session per iteration, as in a storm of first failures.
func BenchmarkFailedStep(b *testing.B) {
	s := New(Config{})
	defer s.Close()
	p, err := policy.Resolve(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			_, err := store.New(s).FailedStep(context.Background(), engine.Failure{
				Request: &retrydv1.FailedStepRequest{SessionId: fmt.Sprintf("s-%p-%d", pb, i), Turn: 1, Step: 1,
					Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}},
				Policy: p,
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkIdleChainMemory reports the heap a session holds once its
// retry has started (one open chain, one retained retry, its step record):
// the steady state of an idle agent session between failures.
// Run: go test -run '^$' -bench IdleChainMemory ./store/memory/
func BenchmarkIdleChainMemory(b *testing.B) {
	p, err := policy.Resolve(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(1), MaxDelayMs: proto.Uint64(1), JitterRatio: proto.Float64(0)}})
	if err != nil {
		b.Fatal(err)
	}
	heapPerSession(b, func(s *Store, i int) {
		id := fmt.Sprintf("session-%08d", i)
		out, err := store.New(s).FailedStep(context.Background(), engine.Failure{
			Request: &retrydv1.FailedStepRequest{SessionId: id, Turn: 1, Step: 1, Provider: "p",
				Failure: &retrydv1.Failure{Code: "SERVER", Message: "provider said no"}},
			Policy: p,
		})
		if err != nil {
			b.Fatal(err)
		}
		r, err := s.indexed(out.Response.GetDecision().GetSchedule().GetRetryId())
		if err != nil {
			b.Fatal(err)
		}
		sh, h := s.shardOf(id)
		sh.mu.Lock()
		if ev := sh.sessions.get(h, id).Start(s.env(), r, nil).Event; ev != nil {
			s.log.append(ev)
		}
		sh.sessions.get(h, id).Commit()
		sh.mu.Unlock()
	})
}

// BenchmarkPendingChainMemory reports the heap a session holds while its
// retry is pending (one open chain, one pending retry and its timer, its
// step record), as in retryd-bench's chains part: the state of an agent
// session waiting out a backoff.
// Run: go test -run '^$' -bench PendingChainMemory ./store/memory/
func BenchmarkPendingChainMemory(b *testing.B) {
	p, err := policy.Resolve(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(3_600_000), MaxDelayMs: proto.Uint64(3_600_000), JitterRatio: proto.Float64(0)}})
	if err != nil {
		b.Fatal(err)
	}
	heapPerSession(b, func(s *Store, i int) {
		_, err := store.New(s).FailedStep(context.Background(), engine.Failure{
			Request: &retrydv1.FailedStepRequest{SessionId: "chain-" + strconv.Itoa(i), Turn: 1, Step: 1, Provider: "deepseek",
				Failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429, Message: "rate limited"}},
			Policy: p,
		})
		if err != nil {
			b.Fatal(err)
		}
	})
}

// heapPerSession reports the heap that 20 000 sessions, each made by
// session on a fresh store, hold after a GC, per session.
func heapPerSession(b *testing.B, session func(s *Store, i int)) {
	const sessions = 20_000
	for range b.N {
		s := New(Config{Options: store.Options{EventLogSize: 1}})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range sessions {
			session(s, i)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/sessions, "bytes/session")
		s.Close()
	}
}

// TestTimersFollowTheAwaiters: a retry nobody awaits has one timer, at the
// end of its abandon grace, and none at its due time, where it would find
// nothing to do; an agent that awaits it before it is due adds the timer
// for the due time, so it starts then and not at the end of the grace.
func TestTimersFollowTheAwaiters(t *testing.T) {
	t.Parallel()
	const grace = time.Minute
	s := New(Config{Options: store.Options{AbandonGrace: grace}})
	defer s.Close()
	id := fail(t, s, "a", 1, 500).GetDecision().GetSchedule().GetRetryId()
	r, err := s.indexed(id)
	if err != nil {
		t.Fatal(err)
	}
	s.timers.mu.Lock()
	timers := slices.Clone(s.timers.entries)
	s.timers.mu.Unlock()
	if len(timers) != 1 || timers[0].when().Before(r.Due().Add(grace)) {
		t.Fatalf("timers of a retry nobody awaits: %v, want one, at its due time %v plus the grace", timers, r.Due())
	}

	got := make(chan *retrydv1.AwaitRetryResponse, 2)
	go func() {
		err := storetest.AwaitRetry(context.Background(), s, id, func(m *retrydv1.AwaitRetryResponse) error {
			got <- m
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}()
	for {
		select {
		case m := <-got:
			if m.GetStarted() != nil {
				return
			}
		case <-time.After(grace / 3):
			t.Fatalf("an awaited retry due at %v had not started by %v", r.Due(), time.Now())
		}
	}
}
