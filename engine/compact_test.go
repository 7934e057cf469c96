package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
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
		s.Start(e, out.Scheduled, nil)
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

// TestRetryMessagesMatchTheirEvents: a retry keeps its decision as fields
// and builds its RetryScheduled, RetryStarted and RetryCancelled when
// asked; what it builds equals what its events said, with every optional
// field set and unset, before and after a snapshot round trip.
func TestRetryMessagesMatchTheirEvents(t *testing.T) {
	t.Parallel()
	bounded := resolve(t, &retrydv1.RetryPolicy{MaxRetries: proto.Uint32(3)})
	unbounded := resolve(t, &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE})
	for _, tc := range []struct {
		name   string
		f      Failure
		cancel bool
	}{
		{name: "plain, started", f: Failure{Policy: bounded}},
		{name: "plain, cancelled", f: Failure{Policy: bounded}, cancel: true},
		{name: "every text, unbounded, started", f: Failure{Policy: unbounded, BackoffTrace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Fleet: &Fleet{Key: "p", Config: fleet.DefaultConfig()}}},
		{name: "every text, unbounded, cancelled", f: Failure{Policy: unbounded, BackoffTrace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Fleet: &Fleet{Key: "p", Config: fleet.DefaultConfig()}}, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSession("s", base)
			tc.f.Request = &retrydv1.FailedStepRequest{SessionId: "s", Turn: 2, Step: 3, Provider: "p",
				LogicalTurnId: "lt", Failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429}}
			if tc.f.Fleet == nil {
				tc.f.Request.LogicalTurnId = ""
			} else {
				// A budget five tokens short paces the schedule-mode retry
				// past its policy's 2 s, and says so.
				fl := *tc.f.Fleet
				fl.State = fleet.ProviderState{Tokens: -5, TokensAt: env(0).Now}
				tc.f.Fleet = &fl
			}
			out, err := s.Fail(env(0), tc.f)
			if err != nil || out.Scheduled == nil {
				t.Fatalf("Fail: %v, %v", err, out.Response)
			}
			r := out.Scheduled
			if got, want := r.Scheduled(), out.Events[0].GetScheduled(); !proto.Equal(got, want) {
				t.Fatalf("Scheduled()\n%v\nwant the event's\n%v", got, want)
			}
			req, sc := tc.f.Request, r.Scheduled()
			want := &retrydv1.RetryScheduled{RetryId: r.ID, Turn: 2, Step: 3, LogicalTurnId: req.LogicalTurnId,
				Provider: "p", Mode: tc.f.Policy.Mode, PolicyKey: tc.f.Policy.Key, Failure: req.Failure, RetryNumber: 1,
				DelayMs: sc.GetDelayMs(), DelaySource: sc.GetDelaySource(), DueAt: timestamppb.New(env(0).Now.Add(time.Duration(sc.GetDelayMs()) * time.Millisecond)),
				Policy: tc.f.Policy.SharedProto(), Traceparent: tc.f.BackoffTrace}
			if tc.f.Policy.Bounded {
				want.MaxRetries = proto.Uint32(tc.f.Policy.MaxRetries)
			}
			if tc.f.Fleet != nil {
				want.Detail = "retry budget empty: paced to the next token at 12:00:06.000 (refill 1/s)"
			}
			if !proto.Equal(sc, want) || sc.GetDelayMs() == 0 || sc.GetDelaySource() == retrydv1.DelaySource_DELAY_SOURCE_UNSPECIFIED {
				t.Fatalf("Scheduled()\n%v\nwant\n%v", sc, want)
			}
			s.Commit()
			if tc.cancel {
				ev := s.Cancel(env(1), r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil).Events[0]
				want := &retrydv1.RetryCancelled{RetryId: r.ID, Reason: retrydv1.CancelReason_CANCEL_REASON_REQUESTED,
					Turn: sc.GetTurn(), Step: sc.GetStep(), RetryNumber: sc.GetRetryNumber()}
				if !proto.Equal(ev.GetCancelled(), want) || !proto.Equal(r.Cancelled(), want) || r.Started() != nil {
					t.Fatalf("cancelled: event %v, Cancelled() %v, Started() %v; want %v", ev.GetCancelled(), r.Cancelled(), r.Started(), want)
				}
			} else {
				st := s.Start(env(1), r, nil)
				ev, ok := st.Event, st.Event != nil
				want := &retrydv1.RetryStarted{RetryId: r.ID, Turn: sc.GetTurn(), Step: sc.GetStep(), RetryNumber: sc.GetRetryNumber(),
					StartedAt: timestamppb.New(env(1).Now), Traceparent: sc.GetTraceparent()}
				if !ok || !proto.Equal(ev.GetStarted(), want) || !proto.Equal(r.Started(), want) || r.Cancelled() != nil {
					t.Fatalf("started %t: event %v, Started() %v, Cancelled() %v; want %v", ok, ev.GetStarted(), r.Started(), r.Cancelled(), want)
				}
			}
			s.Commit()
			restored := roundTrip(t, s).Retry(r.ID)
			if got, want := restored.State(), r.State(); !proto.Equal(got, want) {
				t.Fatalf("restored State()\n%v\nwant\n%v", got, want)
			}
			if got, want := restored.Terminal(), r.Terminal(); !proto.Equal(got, want) {
				t.Fatalf("restored Terminal()\n%v\nwant\n%v", got, want)
			}
		})
	}
}

// TestCompactRetryKeepsEveryField guards Retry's fields: it builds
// RetryScheduled, RetryStarted and RetryCancelled from what it keeps, so a
// field added to one of them is lost unless Retry keeps it too.
func TestCompactRetryKeepsEveryField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		msg  proto.Message
		kept string
	}{
		{&retrydv1.RetryScheduled{}, "retry_id turn step logical_turn_id provider mode policy_key failure retry_number max_retries delay_ms delay_source due_at policy traceparent detail"},
		{&retrydv1.RetryStarted{}, "retry_id turn step retry_number started_at traceparent"},
		{&retrydv1.RetryCancelled{}, "retry_id reason turn step retry_number"},
	} {
		fields := tc.msg.ProtoReflect().Descriptor().Fields()
		kept := strings.Fields(tc.kept)
		for i := range fields.Len() {
			if name := string(fields.Get(i).Name()); !slices.Contains(kept, name) {
				t.Errorf("%s has field %s, which engine.Retry does not keep (engine/engine.go)", tc.msg.ProtoReflect().Descriptor().Name(), name)
			}
		}
		if fields.Len() != len(kept) {
			t.Errorf("%s has %d fields, the test lists %d", tc.msg.ProtoReflect().Descriptor().Name(), fields.Len(), len(kept))
		}
	}
}
