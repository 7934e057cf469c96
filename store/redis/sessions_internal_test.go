package redis

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
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

// Tests of the sessions a replica keeps with what it knows
// (knownValue.sess): a commit decides on the session the replica's last
// commit wrote the snapshot from, instead of decoding the snapshot again,
// and only while that is exactly what it knows.

type halfRand struct{}

func (halfRand) Float64() float64 { return 0.5 }

// fakeClock is a decision clock that moves only when told.
type fakeClock struct{ ns atomic.Int64 }

// replicaPair opens two replicas on one Redis prefix, with one clock and
// one retry id sequence.
func replicaPair(t testing.TB, decodeAlways bool) (a, b *Store, clock *fakeClock) {
	t.Helper()
	url, prefix := redistest.Shared(t).URL(0), redistest.Prefix()
	clock, ids := newFakeClock(), &atomic.Int64{}
	return openReplica(t, url, prefix, clock, ids, decodeAlways), openReplica(t, url, prefix, clock, ids, decodeAlways), clock
}

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// openReplica opens a store on url under prefix whose clock, ids and
// jitter are deterministic; its timer poller is stopped, so that timers
// fire only when a test fires them. decodeAlways turns the reuse of
// sessions off.
func openReplica(t testing.TB, url, prefix string, clock *fakeClock, ids *atomic.Int64, decodeAlways bool) *Store {
	t.Helper()
	s, err := Open(context.Background(), Config{URL: url, KeyPrefix: prefix,
		Options: store.Options{ChainTTL: time.Hour, AbandonGrace: time.Minute, Now: clock.now,
			NewID: func() string { return fmt.Sprintf("R%d", ids.Add(1)) }, Rand: halfRand{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.decodeAlways = decodeAlways
	t.Cleanup(func() { s.Close() })
	return s
}

// fixedPolicy retries every failure after delay, at most max times.
func fixedPolicy(t testing.TB, delay time.Duration, max uint32) *policy.Policy {
	t.Helper()
	ms := uint64(delay.Milliseconds())
	p, err := policy.Resolve(&retrydv1.RetryPolicy{MaxRetries: proto.Uint32(max), Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(ms), MaxDelayMs: proto.Uint64(ms), JitterRatio: proto.Float64(0)}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func failureOf(p *policy.Policy, session string, turn, step uint64) engine.Failure {
	return engine.Failure{Policy: p, Request: &retrydv1.FailedStepRequest{SessionId: session, Turn: turn, Step: step,
		Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}}
}

// startRetry starts a pending retry of a session (as its timer does for
// an awaiter), so that the session takes the next failure.
func startRetry(ctx context.Context, s *Store, session, retryID string) error {
	return s.update(ctx, session, func(tx *txn) error {
		var r *engine.Retry
		if tx.sess != nil {
			r = tx.sess.Retry(retryID)
		}
		if r == nil {
			return fmt.Errorf("no retry %s", retryID)
		}
		if ev := tx.sess.Start(tx.env, r, nil).Event; ev != nil {
			tx.changed(ev)
		}
		return nil
	})
}

// knownSession is the session replica s keeps for a session id, if any.
func knownSession(s *Store, id string) *engine.Session {
	return s.known.get(s.keys.sessionKey(id)).sess
}

// TestSessionReuseAnswersAsDecoding runs the same calls — decisions,
// repeated reports, successes, cancellations, a start for an awaiter, an
// abandonment, an expiry, and changes by a second replica between them
// (of the same session, and of another session, which moves the shared
// counter) — once on replicas that reuse the sessions they wrote and once
// on replicas that decode every snapshot, and requires the same answers,
// the same sessions and the same event log.
func TestSessionReuseAnswersAsDecoding(t *testing.T) {
	t.Parallel()
	var runs [2][]any
	var reused int
	for run, decodeAlways := range []bool{false, true} {
		a, b, clock := replicaPair(t, decodeAlways)
		ctx := context.Background()
		pol := fixedPolicy(t, time.Second, 20)
		var out []any
		record := func(what string, v any, err error) {
			t.Helper()
			if err != nil {
				out = append(out, what+": "+err.Error())
				return
			}
			out = append(out, v)
		}
		fail := func(s *Store, session string, turn, step uint64) string {
			t.Helper()
			before := knownSession(s, session)
			o, err := store.New(s).FailedStep(ctx, failureOf(pol, session, turn, step))
			record("FailedStep", o.Response, err)
			record("events", o.Events, err)
			if !decodeAlways && before != nil && knownSession(s, session) == before {
				reused++
			}
			return o.Response.GetDecision().GetSchedule().GetRetryId()
		}
		// step fails a step and starts its retry, as an agent that
		// awaits it and then runs the step again.
		step := func(s *Store, session string, turn, n uint64) {
			t.Helper()
			r := fail(s, session, turn, n)
			record("start", nil, startRetry(ctx, s, session, r))
		}
		get := func(session string) {
			t.Helper()
			chains, err := store.New(a).GetChains(ctx, session)
			record("GetChains", chains, err)
		}

		step(a, "s1", 1, 1)
		r := fail(a, "s1", 1, 2)
		fail(a, "s1", 1, 2) // repeated: the same answer, nothing written
		fail(a, "s1", 1, 3) // refused: a retry is pending
		record("start", nil, startRetry(ctx, a, "s1", r))
		fail(a, "s1", 1, 2) // repeated after the start
		ok, err := store.New(a).StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "s1", Turn: 1, Step: 3})
		record("StepSucceeded", ok, err)
		step(a, "s1", 1, 4)
		step(b, "s1", 1, 5) // the other replica changes the session
		step(a, "s1", 1, 6) // a conflict: a decides again on b's snapshot
		step(b, "s3", 1, 1) // the counter moves, s1 does not
		step(a, "s1", 1, 7)
		r = fail(a, "s1", 1, 8)
		cancelled, err := storetest.CancelRetry(ctx, a, r)
		record("CancelRetry", cancelled, err)
		fail(a, "s2", 1, 1)
		all, err := store.New(a).CancelSession(ctx, "s2")
		record("CancelSession", all, err)
		get("s2")

		// A start for an awaiter (its entry is written outside commits).
		r = fail(a, "s1", 1, 9)
		aw, err := a.attach(ctx, "s1", r, clock.now())
		if err != nil {
			t.Fatal(err)
		}
		clock.advance(2 * time.Second)
		record("fire (awaited)", nil, a.fire(ctx, "s1", r))
		aw.Detach()
		get("s1")

		// An abandonment, then an expiry and a new session of the same id.
		r = fail(a, "s1", 1, 10)
		clock.advance(time.Second / 2)
		record("fire (early)", nil, a.fire(ctx, "s1", r))
		clock.advance(2 * time.Second)
		record("fire (unawaited)", nil, a.fire(ctx, "s1", r))
		clock.advance(2 * time.Minute)
		record("fire (abandoned)", nil, a.fire(ctx, "s1", r))
		get("s1")
		clock.advance(3 * time.Hour)
		record("expiry", nil, a.wake(ctx, "s1", ""))
		step(a, "s1", 2, 1)
		step(a, "s1", 2, 2)
		get("s1")
		get("s3")

		var log []*retrydv1.Event
		err = store.New(a).WatchEvents(ctx, &retrydv1.WatchEventsRequest{StopAtEnd: true}, func(ev *retrydv1.Event) error {
			log = append(log, ev)
			return nil
		})
		record("WatchEvents", log, err)
		runs[run] = out
	}
	if reused == 0 {
		t.Fatal("no decision reused the session its replica wrote: the test proves nothing")
	}
	if len(runs[0]) != len(runs[1]) {
		t.Fatalf("%d answers with reuse, %d without", len(runs[0]), len(runs[1]))
	}
	for i := range runs[0] {
		if !sameAnswer(runs[0][i], runs[1][i]) {
			t.Errorf("answer %d differs:\nwith reuse:    %v\nwithout reuse: %v", i, runs[0][i], runs[1][i])
		}
	}
}

// sameAnswer compares answers: messages and lists of messages with
// proto.Equal, the rest as values.
func sameAnswer(x, y any) bool {
	switch x := x.(type) {
	case proto.Message:
		y, ok := y.(proto.Message)
		return ok && proto.Equal(x, y)
	case []*retrydv1.Event:
		y, ok := y.([]*retrydv1.Event)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !proto.Equal(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(x, y)
}

// TestSessionReuseAfterOtherReplica: a replica decides on the session it
// wrote only while nothing else changed it; after another replica's
// change, the conflict makes it decide on the current snapshot, and the
// session its failed attempt changed is dropped.
func TestSessionReuseAfterOtherReplica(t *testing.T) {
	t.Parallel()
	a, b, _ := replicaPair(t, false)
	ctx := context.Background()
	pol := fixedPolicy(t, time.Second, 20)
	number := func(s *Store, step uint64) uint32 {
		t.Helper()
		o, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, step))
		if err != nil {
			t.Fatalf("FailedStep step %d: %v", step, err)
		}
		if err := startRetry(ctx, s, "s", o.Scheduled.ID); err != nil {
			t.Fatalf("starting the retry of step %d: %v", step, err)
		}
		return o.Response.GetDecision().GetSchedule().GetRetryNumber()
	}
	if n := number(a, 1); n != 1 {
		t.Fatalf("step 1: retry %d", n)
	}
	first := knownSession(a, "s")
	if first == nil {
		t.Fatal("the replica keeps no session after writing it")
	}
	if n := number(a, 2); n != 2 {
		t.Fatalf("step 2: retry %d", n)
	}
	if knownSession(a, "s") != first {
		t.Fatal("the replica did not decide step 2 (and its start) on the session it wrote")
	}
	if n := number(b, 3); n != 3 {
		t.Fatalf("step 3 on the other replica: retry %d", n)
	}
	// a still keeps its session, but what it knows is out of date: the
	// commit's check fails, and a decides again on b's snapshot.
	o, err := store.New(a).FailedStep(ctx, failureOf(pol, "s", 1, 4))
	if err != nil || o.Response.GetDecision().GetSchedule().GetRetryNumber() != 4 {
		t.Fatalf("step 4 after the other replica's step 3: %v %v, want retry 4", o.Response, err)
	}
	if got := knownSession(a, "s"); got == first || got == nil {
		t.Fatalf("after the conflict the replica keeps %p (before: %p), want the session decided again", got, first)
	}
	if err := startRetry(ctx, a, "s", o.Scheduled.ID); err != nil {
		t.Fatal(err)
	}
	second := knownSession(a, "s")
	// The counter moves (another session), the session does not: the
	// conflicted attempt changed a's session, which must not be decided on
	// again: step 5 is decided once, on the snapshot, and written.
	// (After the conflict a reads first for a second, which would find the
	// counter's new value: end that, so that the commit conflicts.)
	if _, err := store.New(b).FailedStep(ctx, failureOf(pol, "other", 1, 1)); err != nil {
		t.Fatal(err)
	}
	a.contention[a.keys.partition("s")].Store(0)
	o, err = store.New(a).FailedStep(ctx, failureOf(pol, "s", 1, 5))
	if err != nil || o.Response.GetDecision().GetSchedule().GetRetryNumber() != 5 || len(o.Events) == 0 {
		t.Fatalf("step 5 after the counter moved: %v (%d events) %v, want retry 5 with its events", o.Response, len(o.Events), err)
	}
	if knownSession(a, "s") == second {
		t.Fatal("the replica kept the session its conflicted attempt changed")
	}
	chains, err := store.New(b).GetChains(ctx, "s")
	if err != nil || chains.GetStep() != 5 || chains.GetChains()[0].GetRetries() != 5 {
		t.Fatalf("the session in Redis: %v %v, want step 5 and 5 retries", chains, err)
	}
	if err := startRetry(ctx, a, "s", o.Scheduled.ID); err != nil {
		t.Fatal(err)
	}

	// While a reads first (after a conflict), a session read back as a
	// wrote it stays reusable, and one another replica changed does not.
	a.conflicted(a.keys.partition("s"))
	third := knownSession(a, "s")
	if _, err := store.New(b).FailedStep(ctx, failureOf(pol, "other2", 1, 1)); err != nil {
		t.Fatal(err)
	}
	if n := number(a, 6); n != 6 || knownSession(a, "s") != third {
		t.Fatalf("step 6, read first: retry %d, session reused: %t; want retry 6 decided on the kept session",
			n, knownSession(a, "s") == third)
	}
	if n := number(b, 7); n != 7 {
		t.Fatalf("step 7 on the other replica: retry %d", n)
	}
	if n := number(a, 8); n != 8 || knownSession(a, "s") == third {
		t.Fatalf("step 8, read first after the other replica's step 7: retry %d, session reused: %t; want retry 8 decided on the snapshot read",
			n, knownSession(a, "s") == third)
	}
}

// failScripts is a hook that fails the commit scripts while armed: before
// Redis runs them, or (lost) after, so that the outcome is unknown.
type failScripts struct {
	armed atomic.Bool
	lost  bool
}

func (f *failScripts) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (f *failScripts) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (f *failScripts) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); !f.armed.Load() || name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		if f.lost {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		err := errors.New("connection reset (test)")
		cmd.SetErr(err)
		return err
	}
}

// TestSessionReuseAfterFailedWrite: a commit that failed, whether or not
// Redis ran it, leaves no session to reuse; the next decision is made on
// what Redis holds.
func TestSessionReuseAfterFailedWrite(t *testing.T) {
	t.Parallel()
	url := redistest.Shared(t).URL(0)
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("ran=%t", lost), func(t *testing.T) {
			clock := newFakeClock()
			s := openReplica(t, url, redistest.Prefix(), clock, &atomic.Int64{}, false)
			hook := &failScripts{lost: lost}
			s.rdb.AddHook(hook)
			ctx := context.Background()
			pol := fixedPolicy(t, time.Second, 20)
			first, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 1))
			if err != nil {
				t.Fatal(err)
			}
			if knownSession(s, "s") == nil {
				t.Fatal("the replica keeps no session after writing it")
			}
			if err := startRetry(ctx, s, "s", first.Scheduled.ID); err != nil {
				t.Fatal(err)
			}
			hook.armed.Store(true)
			if _, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 2)); !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("step 2 with the script failing: %v, want unavailable", err)
			}
			hook.armed.Store(false)
			if sess := knownSession(s, "s"); sess != nil {
				t.Fatal("the replica keeps a session after a commit that failed")
			}
			o, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 2))
			if err != nil || o.Response.GetDecision().GetSchedule().GetRetryNumber() != 2 {
				t.Fatalf("step 2 again: %v %v, want retry 2", o.Response, err)
			}
			// Not written before: decided now, with its events. Written
			// (the answer was lost): a repeated report, answered as
			// recorded, with none.
			if got := len(o.Events) > 0; got == lost {
				t.Fatalf("step 2 again after the script ran=%t: %d events", lost, len(o.Events))
			}
			chains, err := store.New(s).GetChains(ctx, "s")
			if err != nil || chains.GetStep() != 2 || chains.GetChains()[0].GetRetries() != 2 {
				t.Fatalf("the session in Redis: %v %v, want step 2 and 2 retries", chains, err)
			}
			if err := startRetry(ctx, s, "s", o.Response.GetDecision().GetSchedule().GetRetryId()); err != nil {
				t.Fatal(err)
			}
			if o, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 3)); err != nil || o.Response.GetDecision().GetSchedule().GetRetryNumber() != 3 {
				t.Fatalf("step 3: %v %v, want retry 3", o.Response, err)
			}
		})
	}
}
