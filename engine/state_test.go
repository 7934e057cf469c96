package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"

	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/proto"
)

var base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type fixedRand float64

func (r fixedRand) Float64() float64 { return float64(r) }

// env is step i's view of the world: the same for every run of the script,
// so two sessions in the same state must answer step i the same way.
func env(i int) Env {
	n := 0
	return Env{
		Now:  base.Add(time.Duration(i) * 3 * time.Second),
		Rand: fixedRand(float64(i%10) / 10),
		NewID: func() string {
			n++
			return fmt.Sprintf("r%03d-%d", i, n)
		},
	}
}

func resolve(t *testing.T, p *retrydv1.RetryPolicy) *policy.Policy {
	t.Helper()
	rp, err := policy.Resolve(p)
	if err != nil {
		t.Fatal(err)
	}
	return rp
}

// result is what one step returned, in a comparable form.
type result struct {
	msgs []proto.Message
	err  string
}

func (r result) equal(o result) bool {
	if r.err != o.err || len(r.msgs) != len(o.msgs) {
		return false
	}
	for i := range r.msgs {
		if !proto.Equal(r.msgs[i], o.msgs[i]) {
			return false
		}
	}
	return true
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

type step struct {
	name string
	do   func(s *Session, e Env) result
}

// script drives one session through every transition: schedule, replay,
// conflict, stale, pending refusals, start, cancel, exhaustion, always-mode
// delegation (first, declined, handled, cancelled), CancelAll, success,
// no provider, more retries than a session retains, and expiry.
func script(t *testing.T) []step {
	normal := resolve(t, &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(1000), MaxDelayMs: proto.Uint64(10_000), JitterRatio: proto.Float64(0.2)}})
	always := resolve(t, &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS})
	sched := resolve(t, &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE})
	fail := func(turn, st uint64, provider, code string, p *policy.Policy, d retrydv1.Downstream) step {
		return step{fmt.Sprintf("fail t%d s%d %s %s %s", turn, st, provider, code, d), func(s *Session, e Env) result {
			out, err := s.Fail(e, Failure{
				Request: &retrydv1.FailedStepRequest{
					SessionId: s.ID, Turn: turn, Step: st, Provider: provider, Downstream: d,
					Failure: &retrydv1.Failure{Code: code, HttpStatus: 500},
				},
				Policy:       p,
				AttemptTrace: fmt.Sprintf("00-%032x-%016x-01", turn*1000+st, st+1),
				BackoffTrace: fmt.Sprintf("00-%032x-%016x-01", turn*1000+st, st+2),
			})
			r := result{err: errString(err)}
			if out.Response != nil {
				r.msgs = append(r.msgs, out.Response)
			}
			for _, ev := range out.Events {
				r.msgs = append(r.msgs, ev)
			}
			for _, f := range out.Forgotten {
				r.msgs = append(r.msgs, f.State())
			}
			return r
		}}
	}
	start := step{"start pending", func(s *Session, e Env) result {
		if s.Pending() == nil {
			return result{err: "no pending retry"}
		}
		r := s.Pending()
		ev := s.Start(e, r, nil).Event
		if ev == nil {
			return result{err: "not started"}
		}
		return result{msgs: []proto.Message{ev, r.State()}}
	}}
	cancel := step{"cancel pending", func(s *Session, e Env) result {
		if s.Pending() == nil {
			return result{err: "no pending retry"}
		}
		r := s.Pending()
		var msgs []proto.Message
		for _, ev := range s.Cancel(e, r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil).Events {
			msgs = append(msgs, ev)
		}
		return result{msgs: append(msgs, r.State())}
	}}
	cancelOldest := step{"cancel the oldest retained retry again", func(s *Session, e Env) result {
		if len(s.Retries()) == 0 {
			return result{err: "no retries"}
		}
		r := s.Retries()[0]
		return result{msgs: []proto.Message{r.State()}, err: fmt.Sprint(len(s.Cancel(e, r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil).Events))}
	}}
	cancelAll := step{"cancel all", func(s *Session, e Env) result {
		ca := s.CancelAll(e, nil)
		states, deleg, evs := ca.States, ca.Delegation, ca.Events
		r := result{err: fmt.Sprint(deleg)}
		for _, st := range states {
			r.msgs = append(r.msgs, st)
		}
		for _, ev := range evs {
			r.msgs = append(r.msgs, ev)
		}
		return r
	}}
	succeed := func(turn, st uint64) step {
		return step{fmt.Sprintf("succeed t%d s%d", turn, st), func(s *Session, e Env) result {
			closed, evs, err := s.Succeed(e, turn, st)
			r := result{err: errString(err)}
			for _, c := range closed {
				r.msgs = append(r.msgs, c)
			}
			for _, ev := range evs {
				r.msgs = append(r.msgs, ev)
			}
			return r
		}}
	}
	expire := step{"expire", func(s *Session, e Env) result {
		var r result
		for _, ev := range s.Expire(e) {
			r.msgs = append(r.msgs, ev)
		}
		return r
	}}
	chains := step{"chains", func(s *Session, e Env) result {
		return result{msgs: []proto.Message{s.Chains()}}
	}}
	notAsked, declined, handled := retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, retrydv1.Downstream_DOWNSTREAM_DECLINED, retrydv1.Downstream_DOWNSTREAM_HANDLED
	unset := retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED

	steps := []step{
		chains,
		fail(1, 1, "p", "SERVER", normal, unset),  // retry 1
		fail(1, 1, "p", "SERVER", normal, unset),  // the same report: the same answer
		fail(1, 1, "p", "TIMEOUT", normal, unset), // conflict
		fail(1, 2, "p", "SERVER", normal, unset),  // pending
		succeed(1, 2),                             // pending
		start,
		start,                                    // nothing pending
		fail(1, 2, "p", "SERVER", normal, unset), // retry 2
		chains,
		start,
		fail(1, 3, "p", "SERVER", normal, unset), // budget exhausted: the chain closes
		fail(1, 2, "p", "SERVER", normal, unset), // stale
		fail(1, 4, "p", "RATE_LIMIT", normal, unset),
		cancel,
		fail(1, 5, "q", "SERVER", sched, unset),
		start,
		fail(1, 6, "q", "SERVER", sched, unset),
		cancelAll, // cancels the pending retry, closes q's chain
		fail(2, 1, "p", "SERVER", always, notAsked), // downstream_first: a delegation opens
		cancelAll, // closes the delegation
		fail(2, 1, "p", "SERVER", always, declined), // the delegation was cancelled
		fail(2, 2, "p", "SERVER", always, notAsked),
		fail(2, 2, "p", "SERVER", always, declined), // scheduled
		start,
		fail(2, 3, "p", "SERVER", always, notAsked),
		fail(2, 3, "p", "SERVER", always, handled),
		fail(2, 4, "p", "ABORTED", always, notAsked),
		fail(2, 5, "", "SERVER", nil, unset), // no provider
		succeed(2, 5),
		succeed(3, 1),
		fail(3, 2, "p", "SERVER", normal, unset),
		start,
		chains,
	}
	// More retries than a session keeps: the oldest are forgotten, among
	// them the latest retry of p's normal chain.
	for i := range uint64(MaxRetainedRetries + 3) {
		steps = append(steps, fail(4, i+1, "r", "SERVER", sched, unset), cancel)
	}
	steps = append(steps,
		cancelOldest,
		chains,
		fail(5, 1, "p", "SERVER", normal, unset), // p's chain continues with retry 2
		start,
		expire,
		chains,
		fail(5, 2, "p", "SERVER", normal, unset),
	)
	return steps
}

// roundTrip restores s from its snapshot's bytes, as a durable store does.
func roundTrip(t *testing.T, s *Session) *Session {
	t.Helper()
	b, err := proto.Marshal(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var snap statev1.Session
	if err := proto.Unmarshal(b, &snap); err != nil {
		t.Fatal(err)
	}
	r, err := RestoreSession(&snap)
	if err != nil {
		t.Fatalf("RestoreSession: %v", err)
	}
	return r
}

// TestRestoreBehavesIdentically restores the session after every step of
// the script and runs the rest of the script on the copy: every later answer
// and the final state must be those of the session that never stopped.
func TestRestoreBehavesIdentically(t *testing.T) {
	t.Parallel()
	steps := script(t)
	orig := NewSession("s", base)
	copies := make([]*Session, len(steps)+1)
	want := make([]result, len(steps))
	for i, st := range steps {
		copies[i] = roundTrip(t, orig)
		if got, wantSnap := copies[i].Snapshot(), orig.Snapshot(); !proto.Equal(got, wantSnap) {
			t.Fatalf("before step %d (%s): restored snapshot differs:\n got %v\nwant %v", i, st.name, got, wantSnap)
		}
		if settled := copies[i].Settled(); len(settled) != 0 {
			t.Fatalf("before step %d: a restored session has %d settled retries, want none", i, len(settled))
		}
		for _, r := range copies[i].Retries() {
			if r.Awaiters != 0 {
				t.Fatalf("before step %d: restored retry %s (%s) has %d awaiters", i, r.ID, r.Status, r.Awaiters)
			}
		}
		want[i] = st.do(orig, env(i))
		orig.Commit()
	}
	copies[len(steps)] = roundTrip(t, orig)
	final := orig.Snapshot()
	if len(final.GetRetries()) != MaxRetainedRetries {
		t.Fatalf("the script ends with %d retained retries, want %d", len(final.GetRetries()), MaxRetainedRetries)
	}
	unretained := 0
	for _, c := range final.GetChains() {
		if c.GetLatestUnretained() != nil {
			unretained++
		}
	}
	if unretained == 0 {
		t.Fatal("the script never forgets a chain's latest retry")
	}
	for from, c := range copies {
		for i := from; i < len(steps); i++ {
			got := steps[i].do(c, env(i))
			c.Commit()
			if !got.equal(want[i]) {
				t.Fatalf("restored before step %d: step %d (%s) answered\n%v %q\nwant\n%v %q",
					from, i, steps[i].name, got.msgs, got.err, want[i].msgs, want[i].err)
			}
		}
		if got := c.Snapshot(); !proto.Equal(got, final) {
			t.Fatalf("restored before step %d: final state differs:\n got %v\nwant %v", from, got, final)
		}
	}
}

// TestRevertUndoesEveryStep: a checkpoint taken before any step, reverted
// after it, gives back the same state, leaves every awaiter waiting, and the
// step then answers as it did the first time.
func TestRevertUndoesEveryStep(t *testing.T) {
	t.Parallel()
	steps := script(t)
	s := NewSession("s", base)
	for i, st := range steps {
		before, err := proto.Marshal(s.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		pending := s.Pending()
		cp := s.Checkpoint()
		first := st.do(s, env(i))
		s.Revert(cp)
		after, err := proto.Marshal(s.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		var b, a statev1.Session
		if err := proto.Unmarshal(before, &b); err != nil {
			t.Fatal(err)
		}
		if err := proto.Unmarshal(after, &a); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&a, &b) {
			t.Fatalf("step %d (%s): reverted state differs:\n got %v\nwant %v", i, st.name, &a, &b)
		}
		if s.Pending() != pending {
			t.Fatalf("step %d (%s): the pending retry object changed across a revert", i, st.name)
		}
		if settled := s.Settled(); len(settled) != 0 {
			t.Fatalf("step %d (%s): a reverted start or cancel left %d retries settled", i, st.name, len(settled))
		}
		again := st.do(s, env(i))
		if !again.equal(first) {
			t.Fatalf("step %d (%s) after a revert answered\n%v %q\nwant\n%v %q", i, st.name, again.msgs, again.err, first.msgs, first.err)
		}
		if pending != nil && pending.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING && !slices.Contains(s.Settled(), pending) {
			t.Fatalf("step %d (%s): terminal retry %s is not settled for the store to release", i, st.name, pending.ID)
		}
		s.Commit()
		if settled := s.Settled(); len(settled) != 0 {
			t.Fatalf("step %d (%s): %d retries still settled after Commit", i, st.name, len(settled))
		}
	}
}

func TestRestoreRefusesInconsistentSnapshots(t *testing.T) {
	t.Parallel()
	normal := resolve(t, nil)
	s := NewSession("s", base)
	if _, err := s.Fail(env(0), Failure{Policy: normal, Request: &retrydv1.FailedStepRequest{
		SessionId: "s", Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}}); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*statev1.Session){
		"no id":                func(x *statev1.Session) { x.Id = "" },
		"pending not retained": func(x *statev1.Session) { x.PendingRetryId = "nope" },
		"pending forgotten":    func(x *statev1.Session) { x.PendingRetryId = "" },
		"unknown chain":        func(x *statev1.Session) { x.Retries[0].Chain.Provider = "other" },
		"short fingerprint":    func(x *statev1.Session) { x.Records[0].Fingerprint = x.Records[0].Fingerprint[:3] },
		"started without record": func(x *statev1.Session) {
			x.Retries[0].Status = retrydv1.RetryStatus_RETRY_STATUS_STARTED
			x.PendingRetryId = ""
		},
		"latest unknown": func(x *statev1.Session) { x.Chains[0].LatestRetryId = "nope" },
	}
	for name, damage := range cases {
		b, err := proto.Marshal(s.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		var snap statev1.Session
		if err := proto.Unmarshal(b, &snap); err != nil {
			t.Fatal(err)
		}
		damage(&snap)
		if _, err := RestoreSession(&snap); err == nil {
			t.Errorf("%s: RestoreSession accepted it", name)
		}
	}
}
