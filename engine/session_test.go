package engine

import (
	"slices"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
)

// BenchmarkFirstFailure measures the engine's part of a failure storm:
// each op is a new session's first failure, which the default policy
// schedules, then, as the store does, its commit. allocs/op is what the
// engine allocates for it; the ids are made before the clock runs.
//
//	go test -run '^$' -bench FirstFailure -benchmem ./engine/
func BenchmarkFirstFailure(b *testing.B) {
	benchmarkFirstFailure(b, false)
}

// BenchmarkFirstFailureCancelled is BenchmarkFirstFailure with the
// scheduled retry then cancelled and committed: the session's whole life
// in a storm whose agents give up.
func BenchmarkFirstFailureCancelled(b *testing.B) {
	benchmarkFirstFailure(b, true)
}

// storm is the last session of benchmarkFirstFailure: a store keeps its
// sessions, so the benchmark's must not live on its stack.
var storm *Session

// BenchmarkFirstFailureDelegated is BenchmarkFirstFailure with a
// failure that names no provider, which is delegated: a new session with
// a step record and no chain, as in a storm that fleet protection
// delegates.
func BenchmarkFirstFailureDelegated(b *testing.B) {
	failure := &retrydv1.Failure{Code: "SERVER", HttpStatus: 503}
	e := env(0)
	b.ReportAllocs()
	for b.Loop() {
		s := NewSession("storm", base)
		storm = s // a store keeps it
		out, err := s.Fail(e, Failure{Request: &retrydv1.FailedStepRequest{
			SessionId: "storm", Turn: 1, Step: 1, Failure: failure}})
		if err != nil || out.Response.GetDecision().GetDelegate() == nil {
			b.Fatalf("Fail: %v %v, want delegated", out.Response, err)
		}
		s.Commit()
	}
}

func benchmarkFirstFailure(b *testing.B, cancel bool) {
	p, err := policy.Resolve(nil)
	if err != nil {
		b.Fatal(err)
	}
	failure := &retrydv1.Failure{Code: "SERVER", HttpStatus: 503}
	ids := []string{"retry"}
	e := env(0)
	e.NewID = func() string { return ids[0] }
	b.ReportAllocs()
	for b.Loop() {
		s := NewSession("storm", base)
		storm = s // a store keeps it
		out, err := s.Fail(e, Failure{Policy: p, Request: &retrydv1.FailedStepRequest{
			SessionId: "storm", Turn: 1, Step: 1, Provider: "deepseek", Failure: failure}})
		if err != nil || out.Scheduled == nil {
			b.Fatalf("Fail: %v %v, want scheduled", out.Response, err)
		}
		s.Commit()
		if cancel {
			s.Cancel(e, out.Scheduled, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil)
			s.Commit()
		}
	}
}

// TestSettledKeepsEveryRetryUntilCommit: the retries that end between two
// commits are all Settled, in order, however many there are, and a
// Revert gives back those settled before its checkpoint.
func TestSettledKeepsEveryRetryUntilCommit(t *testing.T) {
	t.Parallel()
	p := resolve(t, nil)
	s := NewSession("s", base)
	step := uint64(0)
	schedule := func(i int) *Retry {
		t.Helper()
		step++
		out, err := s.Fail(env(i), Failure{Policy: p, Request: &retrydv1.FailedStepRequest{
			SessionId: "s", Turn: 1, Step: step, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}})
		if err != nil || out.Scheduled == nil {
			t.Fatalf("step %d: %v %v, want scheduled", step, out.Response, err)
		}
		return out.Scheduled
	}
	for round := range 3 {
		r1 := schedule(2 * round)
		s.Start(env(2*round), r1, nil)
		if got := s.Settled(); !slices.Equal(got, []*Retry{r1}) {
			t.Fatalf("round %d: settled %v after one start, want [%s]", round, ids(got), r1.ID)
		}
		r2 := schedule(2*round + 1)
		cp := s.Checkpoint()
		s.Cancel(env(2*round+1), r2, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil)
		if got := s.Settled(); !slices.Equal(got, []*Retry{r1, r2}) {
			t.Fatalf("round %d: settled %v after a start and a cancel, want [%s %s]", round, ids(got), r1.ID, r2.ID)
		}
		s.Revert(cp)
		if got := s.Settled(); !slices.Equal(got, []*Retry{r1}) {
			t.Fatalf("round %d: settled %v after a revert of the cancel, want [%s]", round, ids(got), r1.ID)
		}
		s.Cancel(env(2*round+1), r2, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil)
		s.Commit()
		if got := s.Settled(); len(got) != 0 {
			t.Fatalf("round %d: settled %v after Commit, want none", round, ids(got))
		}
	}
}

// TestRevertedFirstChainIsNotReused: a session's first chain comes in a
// block with room for the session's slices (chainBlock); when a Revert
// undoes the failure that made it, the next failure makes a chain of its
// own, as the reverted one may still be referred to (by its retry).
func TestRevertedFirstChainIsNotReused(t *testing.T) {
	t.Parallel()
	p := resolve(t, nil)
	s := NewSession("s", base)
	fail := func() *Retry {
		t.Helper()
		out, err := s.Fail(env(0), Failure{Policy: p, Request: &retrydv1.FailedStepRequest{
			SessionId: "s", Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}})
		if err != nil || out.Scheduled == nil {
			t.Fatalf("Fail: %v %v, want scheduled", out.Response, err)
		}
		return out.Scheduled
	}
	cp := s.Checkpoint()
	reverted := fail()
	s.Revert(cp)
	again := fail()
	if again.chain == reverted.chain {
		t.Fatal("the failure after a revert reused the reverted failure's chain")
	}
	if reverted.chain.Retries != 1 || !reverted.chain.Open || reverted.chain.Latest != reverted {
		t.Errorf("the reverted chain changed: %+v", reverted.chain)
	}
}

func ids(rs []*Retry) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}
