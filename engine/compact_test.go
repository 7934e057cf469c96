package engine

import (
	"fmt"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
)

// TestCommittedRecordAnswersAsBefore: once Commit compacts the record of a
// scheduled decision (drops its event), a repeated report still gets the
// very response the first got, numbered as the store numbered it, and the
// snapshot is unchanged.
func TestCommittedRecordAnswersAsBefore(t *testing.T) {
	t.Parallel()
	p := resolve(t, nil)
	s := NewSession("s", base)
	req := &retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: 1, Provider: "p",
		Failure: &retrydv1.Failure{Code: "SERVER"}}
	out, err := s.Fail(env(0), Failure{Request: req, Policy: p})
	if err != nil || out.Scheduled == nil {
		t.Fatalf("Fail: %v, %+v", err, out)
	}
	out.Events[0].Sequence = 42 // as a store numbers it before Commit
	before := proto.Clone(s.Snapshot())
	s.Commit()
	if rec := s.record(retrydv1.Downstream_DOWNSTREAM_NOT_ASKED); rec == nil || rec.event != nil {
		t.Fatalf("record after Commit: %+v, want it compact", rec)
	}
	again, err := s.Fail(env(1), Failure{Request: req, Policy: p})
	if err != nil || len(again.Events) != 0 {
		t.Fatalf("replay: %v, %d events", err, len(again.Events))
	}
	if !proto.Equal(again.Response, out.Response) {
		t.Errorf("replay answered\n%v\nwant\n%v", again.Response, out.Response)
	}
	if got := s.Snapshot(); !proto.Equal(got, before) {
		t.Errorf("snapshot after Commit\n%v\nwant\n%v", got, before)
	}
}

// TestChainKeepsNewestAttempts: a chain remembers at most
// MaxChainAttempts traceparents, the newest, oldest first.
func TestChainKeepsNewestAttempts(t *testing.T) {
	t.Parallel()
	p := resolve(t, &retrydv1.RetryPolicy{MaxRetries: proto.Uint32(100)})
	s := NewSession("s", base)
	n := MaxChainAttempts + 5
	for i := range n {
		e := env(i)
		out, err := s.Fail(e, Failure{
			Request: &retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: uint64(i + 1), Provider: "p",
				Failure: &retrydv1.Failure{Code: "SERVER"}},
			Policy:       p,
			AttemptTrace: fmt.Sprintf("t%02d", i),
		})
		if err != nil {
			t.Fatalf("Fail %d: %v", i, err)
		}
		if out.Scheduled == nil {
			t.Fatalf("Fail %d: not scheduled: %v", i, out.Response)
		}
		want := min(i, MaxChainAttempts)
		if len(out.PreviousAttempts) != want {
			t.Fatalf("Fail %d: %d previous attempts, want %d", i, len(out.PreviousAttempts), want)
		}
		if want > 0 && out.PreviousAttempts[want-1] != fmt.Sprintf("t%02d", i-1) {
			t.Fatalf("Fail %d: newest previous attempt %s", i, out.PreviousAttempts[want-1])
		}
		s.Start(e, out.Scheduled)
		s.Commit()
	}
	if c := s.chains[0]; len(c.attemptList()) > MaxChainAttempts {
		t.Errorf("chain keeps %d attempts", len(c.attemptList()))
	}
}

// TestCompactRecordRebuildsEveryEventField guards stepRecord.compact: a
// compact record rebuilds an event from its sequence, session id, time and
// scheduled record. A field added to Event outside the kind oneof would be
// lost, so adding one must extend the compact record first.
func TestCompactRecordRebuildsEveryEventField(t *testing.T) {
	t.Parallel()
	fields := (&retrydv1.Event{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.ContainingOneof() != nil {
			continue
		}
		switch fd.Name() {
		case "sequence", "session_id", "time":
		default:
			t.Errorf("Event has field %s, which a compact step record does not keep (engine/engine.go stepRecord)", fd.Name())
		}
	}
}
