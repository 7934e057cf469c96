package invariant_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
)

// Sessions, providers and policy keys of the valid log.
const (
	normalSession   = "s-normal"
	alwaysSession   = "s-always"
	scheduleSession = "s-schedule"

	normalKey   = "mode=normal;max=2;codes=RATE_LIMIT,SERVER,TIMEOUT;backoff=500,10000,2,0.1,symmetric"
	alwaysKey   = "mode=always;backoff=1000,30000,2,0.2,full"
	scheduleKey = "mode=schedule;schedule=1000,3000;tail=8000"
)

var logStart = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// validEvents returns a fresh copy of a log that breaks no invariant. It
// covers the three modes:
//
//   - s-normal: normal mode on openai with two retries (backoff, then the
//     provider's Retry-After) and an exhaustion close; then a new chain that
//     starts again at 1, a second provider (azure) with its own chain, and a
//     cancelled retry.
//   - s-always: always mode with the downstream handshake before each retry,
//     full jitter (a zero delay at its lower boundary), a handled step and a
//     cancelled open delegation.
//   - s-schedule: schedule mode running past its two-entry schedule into the
//     tail, then a provider Retry-After under the cap, and a success close.
//
// Sessions interleave and sequences increase across the whole log, as on
// the in-memory store.
func validEvents() []*retrydv1.Event {
	return stamp([]*retrydv1.Event{
		scheduledEvent(normalSession, normalRetry("r-n1", 1, 1, "openai", 1, 520, retrydv1.DelaySource_DELAY_SOURCE_BACKOFF, serverError())),
		delegatedEvent(alwaysSession, alwaysDelegation(1, 1, retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED)),
		startedEvent(normalSession, "r-n1", 1, 1, 1),
		scheduledEvent(alwaysSession, alwaysRetry("r-a1", 1, 1, 1, 0)),
		scheduledEvent(scheduleSession, scheduleRetry("r-s1", 1, 1, 1000, retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE, serverError())),
		startedEvent(alwaysSession, "r-a1", 1, 1, 1),
		startedEvent(scheduleSession, "r-s1", 1, 1, 1),
		scheduledEvent(normalSession, normalRetry("r-n2", 1, 2, "openai", 2, 3000, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER, rateLimit(3000))),
		startedEvent(normalSession, "r-n2", 1, 2, 2),
		delegatedEvent(alwaysSession, alwaysDelegation(1, 2, retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED)),
		scheduledEvent(alwaysSession, alwaysRetry("r-a2", 1, 2, 2, 1500)),
		scheduledEvent(scheduleSession, scheduleRetry("r-s2", 2, 2, 3000, retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE, serverError())),
		delegatedEvent(normalSession, &retrydv1.RetryDelegated{
			Turn: 1, Step: 3, Provider: "openai", PolicyKey: normalKey, Mode: retrydv1.Mode_MODE_NORMAL,
			Failure: serverError(), Reason: retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED,
			Detail: "retry budget of 2 used",
		}),
		closedEvent(normalSession, "openai", normalKey, retrydv1.CloseReason_CLOSE_REASON_EXHAUSTED, 2),
		startedEvent(alwaysSession, "r-a2", 1, 2, 2),
		startedEvent(scheduleSession, "r-s2", 1, 2, 2),
		scheduledEvent(scheduleSession, scheduleRetry("r-s3", 3, 3, 8000, retrydv1.DelaySource_DELAY_SOURCE_TAIL, serverError())),
		startedEvent(scheduleSession, "r-s3", 1, 3, 3),
		scheduledEvent(scheduleSession, scheduleRetry("r-s4", 4, 4, 6000, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER, rateLimit(6000))),
		delegatedEvent(alwaysSession, alwaysDelegation(1, 3, retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED)),
		delegatedEvent(alwaysSession, alwaysDelegation(1, 3, retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED, retrydv1.Downstream_DOWNSTREAM_HANDLED)),
		startedEvent(scheduleSession, "r-s4", 1, 4, 4),
		closedEvent(scheduleSession, "anthropic", scheduleKey, retrydv1.CloseReason_CLOSE_REASON_SUCCEEDED, 4),
		scheduledEvent(normalSession, normalRetry("r-n3", 2, 4, "openai", 1, 480, retrydv1.DelaySource_DELAY_SOURCE_BACKOFF, serverError())),
		startedEvent(normalSession, "r-n3", 2, 4, 1),
		scheduledEvent(normalSession, normalRetry("r-n4", 2, 5, "azure", 1, 545, retrydv1.DelaySource_DELAY_SOURCE_BACKOFF, serverError())),
		startedEvent(normalSession, "r-n4", 2, 5, 1),
		scheduledEvent(normalSession, normalRetry("r-n5", 2, 6, "openai", 2, 1100, retrydv1.DelaySource_DELAY_SOURCE_BACKOFF, serverError())),
		cancelledEvent(normalSession, "r-n5", 2, 6, 2),
		closedEvent(normalSession, "openai", normalKey, retrydv1.CloseReason_CLOSE_REASON_CANCELLED, 2),
		delegatedEvent(alwaysSession, alwaysDelegation(2, 4, retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED)),
		cancelledEvent(alwaysSession, "", 2, 4, 0),
		closedEvent(alwaysSession, "deepseek", alwaysKey, retrydv1.CloseReason_CLOSE_REASON_CANCELLED, 2),
	})
}

// stamp numbers the events 1..n in order and sets their times ten seconds
// apart, each scheduled retry due after its delay.
func stamp(events []*retrydv1.Event) []*retrydv1.Event {
	for i, ev := range events {
		at := logStart.Add(time.Duration(i) * 10 * time.Second)
		ev.Sequence = uint64(i + 1)
		ev.Time = timestamppb.New(at)
		if sc := ev.GetScheduled(); sc != nil {
			sc.DueAt = timestamppb.New(at.Add(time.Duration(sc.GetDelayMs()) * time.Millisecond))
		}
		if st := ev.GetStarted(); st != nil {
			st.StartedAt = timestamppb.New(at)
		}
	}
	return events
}

func normalPolicy() *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{
		Mode:           retrydv1.Mode_MODE_NORMAL,
		MaxRetries:     proto.Uint32(2),
		RetryableCodes: []string{"RATE_LIMIT", "SERVER", "TIMEOUT"},
		Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(500),
			MaxDelayMs:     proto.Uint64(10000),
			Multiplier:     proto.Float64(2),
			JitterRatio:    proto.Float64(0.1),
			Jitter:         retrydv1.Jitter_JITTER_SYMMETRIC,
		},
		RetryAfterOverCap: retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_DELEGATE,
		MinAttemptMs:      proto.Uint64(100),
	}
}

func alwaysPolicy() *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{
		Mode: retrydv1.Mode_MODE_ALWAYS,
		Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(1000),
			MaxDelayMs:     proto.Uint64(30000),
			Multiplier:     proto.Float64(2),
			JitterRatio:    proto.Float64(0.2),
			Jitter:         retrydv1.Jitter_JITTER_FULL,
		},
		RetryAfterOverCap: retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_LOCAL,
		MinAttemptMs:      proto.Uint64(100),
	}
}

func schedulePolicy() *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{
		Mode:              retrydv1.Mode_MODE_SCHEDULE,
		RetryableCodes:    []string{"RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT", "EMPTY_RESPONSE"},
		Schedule:          []uint64{1000, 3000},
		TailDelayMs:       proto.Uint64(8000),
		RetryAfterOverCap: retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_LOCAL,
		MinAttemptMs:      proto.Uint64(100),
	}
}

func serverError() *retrydv1.Failure {
	return &retrydv1.Failure{Code: "SERVER", Message: "503 Service Unavailable", HttpStatus: 503}
}

func rateLimit(retryAfterMs int64) *retrydv1.Failure {
	return &retrydv1.Failure{
		Code: "RATE_LIMIT", Message: "429 Too Many Requests", HttpStatus: 429,
		ProviderRetryAfterMs: proto.Int64(retryAfterMs),
	}
}

func normalRetry(id string, turn, step uint64, provider string, n uint32, delay uint64, source retrydv1.DelaySource, failure *retrydv1.Failure) *retrydv1.RetryScheduled {
	return &retrydv1.RetryScheduled{
		RetryId: id, Turn: turn, Step: step, LogicalTurnId: "lt-normal",
		Provider: provider, Mode: retrydv1.Mode_MODE_NORMAL, PolicyKey: normalKey, Failure: failure,
		RetryNumber: n, MaxRetries: proto.Uint32(2), DelayMs: delay, DelaySource: source,
		Policy: normalPolicy(),
	}
}

func alwaysRetry(id string, turn, step uint64, n uint32, delay uint64) *retrydv1.RetryScheduled {
	return &retrydv1.RetryScheduled{
		RetryId: id, Turn: turn, Step: step,
		Provider: "deepseek", Mode: retrydv1.Mode_MODE_ALWAYS, PolicyKey: alwaysKey, Failure: rateLimit(0),
		RetryNumber: n, DelayMs: delay, DelaySource: retrydv1.DelaySource_DELAY_SOURCE_BACKOFF,
		Policy: alwaysPolicy(),
	}
}

func scheduleRetry(id string, step uint64, n uint32, delay uint64, source retrydv1.DelaySource, failure *retrydv1.Failure) *retrydv1.RetryScheduled {
	return &retrydv1.RetryScheduled{
		RetryId: id, Turn: 1, Step: step,
		Provider: "anthropic", Mode: retrydv1.Mode_MODE_SCHEDULE, PolicyKey: scheduleKey, Failure: failure,
		RetryNumber: n, DelayMs: delay, DelaySource: source,
		Policy: schedulePolicy(),
	}
}

func alwaysDelegation(turn, step uint64, reason retrydv1.DelegateReason, downstream retrydv1.Downstream) *retrydv1.RetryDelegated {
	return &retrydv1.RetryDelegated{
		Turn: turn, Step: step, Provider: "deepseek", PolicyKey: alwaysKey, Mode: retrydv1.Mode_MODE_ALWAYS,
		Failure: rateLimit(0), Reason: reason, Downstream: downstream,
	}
}

func scheduledEvent(session string, sc *retrydv1.RetryScheduled) *retrydv1.Event {
	return &retrydv1.Event{SessionId: session, Kind: &retrydv1.Event_Scheduled{Scheduled: sc}}
}

func delegatedEvent(session string, d *retrydv1.RetryDelegated) *retrydv1.Event {
	return &retrydv1.Event{SessionId: session, Kind: &retrydv1.Event_Delegated{Delegated: d}}
}

func startedEvent(session, id string, turn, step uint64, n uint32) *retrydv1.Event {
	return &retrydv1.Event{SessionId: session, Kind: &retrydv1.Event_Started{Started: &retrydv1.RetryStarted{
		RetryId: id, Turn: turn, Step: step, RetryNumber: n,
	}}}
}

func cancelledEvent(session, id string, turn, step uint64, n uint32) *retrydv1.Event {
	return &retrydv1.Event{SessionId: session, Kind: &retrydv1.Event_Cancelled{Cancelled: &retrydv1.RetryCancelled{
		RetryId: id, Reason: retrydv1.CancelReason_CANCEL_REASON_REQUESTED, Turn: turn, Step: step, RetryNumber: n,
	}}}
}

func closedEvent(session, provider, key string, reason retrydv1.CloseReason, retries uint32) *retrydv1.Event {
	return &retrydv1.Event{SessionId: session, Kind: &retrydv1.Event_Closed{Closed: &retrydv1.ChainClosed{
		Provider: provider, PolicyKey: key, Reason: reason, Retries: retries,
	}}}
}

// scheduledIn returns the scheduled retry with the given id.
func scheduledIn(t *testing.T, events []*retrydv1.Event, id string) *retrydv1.RetryScheduled {
	t.Helper()
	for _, ev := range events {
		if sc := ev.GetScheduled(); sc != nil && sc.GetRetryId() == id {
			return sc
		}
	}
	t.Fatalf("no scheduled retry %q in the log", id)
	return nil
}

// indexOf returns the index of the first event that match accepts.
func indexOf(t *testing.T, events []*retrydv1.Event, match func(*retrydv1.Event) bool) int {
	t.Helper()
	i := slices.IndexFunc(events, match)
	if i < 0 {
		t.Fatal("no matching event in the log")
	}
	return i
}

func isStarted(id string) func(*retrydv1.Event) bool {
	return func(ev *retrydv1.Event) bool { return ev.GetStarted() != nil && ev.GetStarted().GetRetryId() == id }
}

func isCancelled(id string) func(*retrydv1.Event) bool {
	return func(ev *retrydv1.Event) bool { return ev.GetCancelled() != nil && ev.GetCancelled().GetRetryId() == id }
}

func isClosed(session string, reason retrydv1.CloseReason) func(*retrydv1.Event) bool {
	return func(ev *retrydv1.Event) bool {
		return ev.GetSessionId() == session && ev.GetClosed() != nil && ev.GetClosed().GetReason() == reason
	}
}

func isDelegated(session string, downstream retrydv1.Downstream) func(*retrydv1.Event) bool {
	return func(ev *retrydv1.Event) bool {
		return ev.GetSessionId() == session && ev.GetDelegated() != nil && ev.GetDelegated().GetDownstream() == downstream
	}
}

// insertAfter inserts ev after index i and renumbers the log.
func insertAfter(events []*retrydv1.Event, i int, ev *retrydv1.Event) []*retrydv1.Event {
	return stamp(slices.Insert(events, i+1, ev))
}

// remove deletes the event at index i and renumbers the log.
func remove(events []*retrydv1.Event, i int) []*retrydv1.Event {
	return stamp(slices.Delete(events, i, i+1))
}

func rules(vs []invariant.Violation) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.Rule
	}
	return out
}

func TestCheckValidLog(t *testing.T) {
	t.Parallel()
	if vs := invariant.Check(validEvents()); len(vs) != 0 {
		for _, v := range vs {
			t.Error(v)
		}
	}
}

// TestCheckAcceptsVariants mutates the valid log in ways that must stay
// valid: boundary delays, defaults and per-session numbering.
func TestCheckAcceptsVariants(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event
	}{
		{"sequences numbered per session", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			next := map[string]uint64{}
			for _, ev := range events {
				next[ev.GetSessionId()]++
				ev.Sequence = next[ev.GetSessionId()]
			}
			return events
		}},
		{"symmetric jitter at the lower bound less 1 ms of rounding", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			scheduledIn(t, events, "r-n1").DelayMs = 449 // base 500, ratio 0.1: floor(450) - 1
			return events
		}},
		{"symmetric jitter at the upper bound plus 1 ms of rounding", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			scheduledIn(t, events, "r-n1").DelayMs = 551 // ceil(550) + 1
			return events
		}},
		{"symmetric jitter at max_delay_ms", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			sc := scheduledIn(t, events, "r-n3")
			sc.Policy.Backoff.MaxDelayMs = proto.Uint64(500)
			sc.DelayMs = 500
			return events
		}},
		{"full jitter at its base", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			scheduledIn(t, events, "r-a2").DelayMs = 2000 // retry 2: 1000 * 2
			return events
		}},
		{"full jitter with a fractional base rounds up", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			sc := scheduledIn(t, events, "r-a2")
			sc.Policy.Backoff.Multiplier = proto.Float64(1.0005) // base 1000.5
			sc.DelayMs = 1001
			return events
		}},
		{"backoff with the documented defaults omitted", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			scheduledIn(t, events, "r-n5").Policy.Backoff = nil // 500 * 2 = 1000, ratio 0.1
			return events
		}},
		{"schedule and tail with the documented defaults omitted", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			sc := scheduledIn(t, events, "r-s2")
			sc.Policy.Schedule = nil // [2000, 5000, 5000, 5000, 10000]
			sc.DelayMs = 5000
			return events
		}},
		{"unspecified mode counts as normal", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			sc := scheduledIn(t, events, "r-n1")
			sc.Mode = retrydv1.Mode_MODE_UNSPECIFIED
			sc.Policy.Mode = retrydv1.Mode_MODE_UNSPECIFIED
			return events
		}},
		{"unspecified jitter counts as symmetric", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			scheduledIn(t, events, "r-n1").Policy.Backoff.Jitter = retrydv1.Jitter_JITTER_UNSPECIFIED
			return events
		}},
		{"provider retry-after over the cap when the policy honours it", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			sc := scheduledIn(t, events, "r-n2")
			sc.Policy.RetryAfterOverCap = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_HONOR
			sc.DelayMs = 60000
			return events
		}},
		{"schedule mode within max_retries", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			for _, id := range []string{"r-s1", "r-s2", "r-s3", "r-s4"} {
				scheduledIn(t, events, id).MaxRetries = proto.Uint32(4)
			}
			return events
		}},
		{"normal mode at max_retries", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			scheduledIn(t, events, "r-n2").MaxRetries = proto.Uint32(2)
			return events
		}},
		{"provider retry-after at the schedule mode cap", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			scheduledIn(t, events, "r-s4").DelayMs = 8000 // tail 8000 > schedule entries
			return events
		}},
		{"same retry numbers in another session", func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
			// Retry ids are unique across the log, so the copy renames them.
			var copied []*retrydv1.Event
			for _, ev := range events {
				if ev.GetSessionId() != normalSession {
					continue
				}
				ev.SessionId = "s-normal-2"
				switch {
				case ev.GetScheduled() != nil:
					ev.GetScheduled().RetryId += "-2"
				case ev.GetStarted() != nil:
					ev.GetStarted().RetryId += "-2"
				case ev.GetCancelled() != nil:
					ev.GetCancelled().RetryId += "-2"
				}
				copied = append(copied, ev)
			}
			return stamp(slices.Concat(validEvents(), copied))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			events := tt.mutate(t, validEvents())
			for _, v := range invariant.Check(events) {
				t.Error(v)
			}
		})
	}
}

// TestCheckRules breaks one invariant of the valid log per case and wants
// exactly the listed rules, each message naming mention (the retry id).
func TestCheckRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mutate  func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event
		want    []string
		mention string
	}{
		// 1. sequence and session id
		{
			name: "empty session id",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				events[indexOf(t, events, isCancelled("r-n5"))].SessionId = ""
				return events
			},
			// The retry is not known in the empty session either.
			want:    []string{invariant.RuleEmptySessionID, invariant.RuleCancelledUnknownRetry},
			mention: "r-n5",
		},
		{
			name: "repeated sequence",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				events[indexOf(t, events, isStarted("r-n1"))].Sequence = 1 // as r-n1's scheduled event
				return events
			},
			want:    []string{invariant.RuleSequenceNotIncreasing},
			mention: "r-n1",
		},
		{
			name: "decreasing sequence",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				events[indexOf(t, events, isStarted("r-s1"))].Sequence = 2
				return events
			},
			want:    []string{invariant.RuleSequenceNotIncreasing},
			mention: "r-s1",
		},
		{
			name: "event without kind",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				return insertAfter(events, 0, &retrydv1.Event{SessionId: normalSession})
			},
			want:    []string{invariant.RuleMissingKind},
			mention: "event 2",
		},
		// 2. current turn and step
		{
			name: "scheduled retry names an older turn",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				// (0, 9) is lower than (1, 3) even though step 9 is higher.
				sc := scheduledIn(t, events, "r-n3")
				sc.Turn, sc.Step = 0, 9
				st := events[indexOf(t, events, isStarted("r-n3"))].GetStarted()
				st.Turn, st.Step = 0, 9
				return events
			},
			want:    []string{invariant.RuleScheduledStaleStep},
			mention: "r-n3",
		},
		{
			name: "scheduled retry names an older step than a delegation",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isDelegated(alwaysSession, retrydv1.Downstream_DOWNSTREAM_HANDLED))
				return insertAfter(events, i, scheduledEvent(alwaysSession, alwaysRetry("r-a3", 1, 2, 3, 0)))
			},
			// Step 2 already has r-a2, too.
			want:    []string{invariant.RuleScheduledStaleStep, invariant.RuleDuplicateStepRecord},
			mention: "r-a3",
		},
		// 3. required fields
		{
			name: "missing provider",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n4").Provider = ""
				return events
			},
			want:    []string{invariant.RuleScheduledMissingField},
			mention: "r-n4",
		},
		{
			name: "missing policy key",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n4").PolicyKey = ""
				return events
			},
			want:    []string{invariant.RuleScheduledMissingField},
			mention: "r-n4",
		},
		{
			name: "missing retry id",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n4").RetryId = ""
				return remove(events, indexOf(t, events, isStarted("r-n4")))
			},
			want:    []string{invariant.RuleScheduledMissingField},
			mention: "retry_id",
		},
		{
			name: "missing resolved policy",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").Policy = nil
				return events
			},
			want:    []string{invariant.RuleScheduledMissingField},
			mention: "r-n1",
		},
		{
			name: "missing failure",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").Failure = nil
				return events
			},
			want:    []string{invariant.RuleScheduledMissingField},
			mention: "r-n1",
		},
		{
			name: "missing failure code",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").Failure.Code = ""
				return events
			},
			want:    []string{invariant.RuleScheduledMissingField},
			mention: "r-n1",
		},
		// 4. unique step record and retry id
		{
			name: "second retry of one step",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n2").Step = 1
				events[indexOf(t, events, isStarted("r-n2"))].GetStarted().Step = 1
				return events
			},
			want:    []string{invariant.RuleDuplicateStepRecord},
			mention: "r-n2",
		},
		{
			name: "retry of a step whose downstream recovery handled it",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isDelegated(alwaysSession, retrydv1.Downstream_DOWNSTREAM_HANDLED))
				return insertAfter(events, i, scheduledEvent(alwaysSession, alwaysRetry("r-a3", 1, 3, 3, 0)))
			},
			want:    []string{invariant.RuleDuplicateStepRecord},
			mention: "r-a3",
		},
		{
			name: "retry id reused in another session",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s1").RetryId = "r-n1"
				events[indexOf(t, events, isStarted("r-s1"))].GetStarted().RetryId = "r-n1"
				return events
			},
			want:    []string{invariant.RuleDuplicateRetryID},
			mention: "r-n1",
		},
		{
			name: "retry id reused in the same session",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n4").RetryId = "r-n3"
				events[indexOf(t, events, isStarted("r-n4"))].GetStarted().RetryId = "r-n3"
				return events
			},
			// The second start of r-n3 names the first record's step.
			want:    []string{invariant.RuleDuplicateRetryID, invariant.RuleStartedRepeated, invariant.RuleStartedMismatch},
			mention: "r-n3",
		},
		// 5. mode-specific bounds
		{
			name: "unknown mode",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").Mode = retrydv1.Mode(9)
				return events
			},
			want:    []string{invariant.RuleModeInvalid},
			mention: "r-n1",
		},
		{
			name: "mode differs from the policy's",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s1").Policy.Mode = retrydv1.Mode_MODE_NORMAL
				return events
			},
			want:    []string{invariant.RuleModeInvalid},
			mention: "r-s1",
		},
		{
			name: "normal mode without max_retries",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").MaxRetries = nil
				return events
			},
			want:    []string{invariant.RuleMaxRetriesBound},
			mention: "r-n1",
		},
		{
			name: "normal mode over max_retries",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n2").MaxRetries = proto.Uint32(1)
				return events
			},
			want:    []string{invariant.RuleMaxRetriesBound},
			mention: "r-n2",
		},
		{
			name: "always mode with max_retries",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-a1").MaxRetries = proto.Uint32(5)
				return events
			},
			want:    []string{invariant.RuleMaxRetriesBound},
			mention: "r-a1",
		},
		{
			name: "schedule mode over max_retries",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s3").MaxRetries = proto.Uint32(2)
				return events
			},
			want:    []string{invariant.RuleMaxRetriesBound},
			mention: "r-s3",
		},
		{
			name: "delay over the timer limit",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				sc := scheduledIn(t, events, "r-s4")
				sc.Policy.RetryAfterOverCap = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_HONOR
				sc.DelayMs = 2147483648
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-s4",
		},
		{
			name: "symmetric jitter below its range",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").DelayMs = 448
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-n1",
		},
		{
			name: "symmetric jitter above its range",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n5").DelayMs = 1102 // retry 2: base 1000, up to ceil(1100) + 1
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-n5",
		},
		{
			name: "symmetric jitter over max_delay_ms",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				sc := scheduledIn(t, events, "r-n3")
				sc.Policy.Backoff.MaxDelayMs = proto.Uint64(500)
				sc.DelayMs = 501
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-n3",
		},
		{
			name: "full jitter over its base",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-a1").DelayMs = 1001
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-a1",
		},
		{
			name: "provider retry-after over max_delay_ms",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n2").DelayMs = 10001
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-n2",
		},
		{
			name: "provider retry-after over the schedule mode cap",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s4").DelayMs = 8001
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-s4",
		},
		{
			name: "delay differs from its schedule entry",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s2").DelayMs = 2999
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-s2",
		},
		{
			name: "delay differs from the tail delay",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s3").DelayMs = 7999
				return events
			},
			want:    []string{invariant.RuleDelayOutOfBounds},
			mention: "r-s3",
		},
		{
			name: "schedule source past the schedule",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s3").DelaySource = retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE
				return events
			},
			want:    []string{invariant.RuleDelaySourceInvalid},
			mention: "r-s3",
		},
		{
			name: "tail source within the schedule",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s2").DelaySource = retrydv1.DelaySource_DELAY_SOURCE_TAIL
				return events
			},
			want:    []string{invariant.RuleDelaySourceInvalid},
			mention: "r-s2",
		},
		{
			name: "unspecified delay source",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").DelaySource = retrydv1.DelaySource_DELAY_SOURCE_UNSPECIFIED
				return events
			},
			want:    []string{invariant.RuleDelaySourceInvalid},
			mention: "r-n1",
		},
		{
			name: "backoff source in schedule mode",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s1").DelaySource = retrydv1.DelaySource_DELAY_SOURCE_BACKOFF
				return events
			},
			want:    []string{invariant.RuleDelaySourceInvalid},
			mention: "r-s1",
		},
		{
			name: "schedule source in normal mode",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n1").DelaySource = retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE
				return events
			},
			want:    []string{invariant.RuleDelaySourceInvalid},
			mention: "r-n1",
		},
		{
			name: "tail source in always mode",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-a2").DelaySource = retrydv1.DelaySource_DELAY_SOURCE_TAIL
				return events
			},
			want:    []string{invariant.RuleDelaySourceInvalid},
			mention: "r-a2",
		},
		// 6. per-chain retry number
		{
			name: "chain not restarted without a close",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				return remove(events, indexOf(t, events, isClosed(normalSession, retrydv1.CloseReason_CLOSE_REASON_EXHAUSTED)))
			},
			want:    []string{invariant.RuleRetryNumber},
			mention: "r-n3",
		},
		{
			name: "provider shares another provider's chain",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-n4").Provider = "openai"
				return events
			},
			want:    []string{invariant.RuleRetryNumber},
			mention: "r-n4",
		},
		{
			name: "policy key shares another key's chain",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				sc := scheduledIn(t, events, "r-n4")
				sc.Provider = "openai"
				sc.PolicyKey = normalKey + ";v2"
				return events
			},
			// A different policy key is its own chain: r-n4 is its retry 1.
			want: nil,
		},
		{
			name: "retry number skipped",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-a2").RetryNumber = 3
				events[indexOf(t, events, isStarted("r-a2"))].GetStarted().RetryNumber = 3
				return events
			},
			want:    []string{invariant.RuleRetryNumber},
			mention: "r-a2",
		},
		{
			name: "first retry numbered 0",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				scheduledIn(t, events, "r-s1").RetryNumber = 0
				events[indexOf(t, events, isStarted("r-s1"))].GetStarted().RetryNumber = 0
				return events
			},
			// r-s2 then follows 0 as retry 2 instead of 1.
			want:    []string{invariant.RuleRetryNumber, invariant.RuleRetryNumber},
			mention: "want 1",
		},
		// 7. started and cancelled
		{
			name: "started names no scheduled retry",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				return insertAfter(events, 0, startedEvent(normalSession, "r-ghost", 1, 1, 1))
			},
			want:    []string{invariant.RuleStartedUnknownRetry},
			mention: "r-ghost",
		},
		{
			name: "started names another session's retry",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isStarted("r-s1"))
				return insertAfter(events, i, startedEvent(normalSession, "r-s1", 1, 1, 1))
			},
			want:    []string{invariant.RuleStartedUnknownRetry},
			mention: "r-s1",
		},
		{
			name: "started before its retry was scheduled",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isStarted("r-n1"))
				events[0], events[i] = events[i], events[0]
				return stamp(events)
			},
			// The later scheduled retry stays pending, so r-n2 is scheduled
			// while r-n1 is.
			want:    []string{invariant.RuleStartedUnknownRetry, invariant.RuleScheduledWhilePending, invariant.RuleScheduledWhilePending, invariant.RuleScheduledWhilePending, invariant.RuleScheduledWhilePending},
			mention: "r-n1",
		},
		{
			name: "started names another step",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				events[indexOf(t, events, isStarted("r-n1"))].GetStarted().Step = 9
				return events
			},
			want:    []string{invariant.RuleStartedMismatch},
			mention: "r-n1",
		},
		{
			name: "started names another turn",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				events[indexOf(t, events, isStarted("r-s3"))].GetStarted().Turn = 2
				return events
			},
			want:    []string{invariant.RuleStartedMismatch},
			mention: "r-s3",
		},
		{
			name: "started names another retry number",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				events[indexOf(t, events, isStarted("r-n2"))].GetStarted().RetryNumber = 1
				return events
			},
			want:    []string{invariant.RuleStartedMismatch},
			mention: "r-n2",
		},
		{
			name: "started twice",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isStarted("r-n1"))
				return insertAfter(events, i, startedEvent(normalSession, "r-n1", 1, 1, 1))
			},
			want:    []string{invariant.RuleStartedRepeated},
			mention: "r-n1",
		},
		{
			name: "started after cancel",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isCancelled("r-n5"))
				return insertAfter(events, i, startedEvent(normalSession, "r-n5", 2, 6, 2))
			},
			want:    []string{invariant.RuleStartedAfterCancel},
			mention: "r-n5",
		},
		{
			name: "cancelled after start",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isStarted("r-n1"))
				return insertAfter(events, i, cancelledEvent(normalSession, "r-n1", 1, 1, 1))
			},
			want:    []string{invariant.RuleCancelledAfterStart},
			mention: "r-n1",
		},
		{
			name: "cancelled names no scheduled retry",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				return insertAfter(events, 0, cancelledEvent(normalSession, "r-ghost", 1, 1, 1))
			},
			want:    []string{invariant.RuleCancelledUnknownRetry},
			mention: "r-ghost",
		},
		{
			name: "cancelled twice",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				i := indexOf(t, events, isCancelled("r-n5"))
				return insertAfter(events, i, cancelledEvent(normalSession, "r-n5", 2, 6, 2))
			},
			want:    []string{invariant.RuleCancelledRepeated},
			mention: "r-n5",
		},
		{
			name: "cancelled names another retry number",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				events[indexOf(t, events, isCancelled("r-n5"))].GetCancelled().RetryNumber = 3
				return events
			},
			want:    []string{invariant.RuleCancelledMismatch},
			mention: "r-n5",
		},
		// 8. one pending retry per session
		{
			name: "scheduled while another retry is pending",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				return remove(events, indexOf(t, events, isStarted("r-n4")))
			},
			want:    []string{invariant.RuleScheduledWhilePending},
			mention: "r-n4",
		},
		{
			name: "scheduled while a retry of another provider is pending",
			mutate: func(t *testing.T, events []*retrydv1.Event) []*retrydv1.Event {
				return remove(events, indexOf(t, events, isStarted("r-n3")))
			},
			want:    []string{invariant.RuleScheduledWhilePending, invariant.RuleScheduledWhilePending},
			mention: "r-n3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			events := tt.mutate(t, validEvents())
			got := invariant.Check(events)
			if !slices.Equal(rules(got), tt.want) {
				t.Errorf("rules = %q, want %q", rules(got), tt.want)
			}
			for _, v := range got {
				if !strings.Contains(v.Message, tt.mention) {
					t.Errorf("message %q does not name %q", v.Message, tt.mention)
				}
				if v.SessionID != events[v.Sequence-1].GetSessionId() && v.Rule != invariant.RuleSequenceNotIncreasing {
					t.Errorf("violation %v: session %q, but event %d is in session %q",
						v, v.SessionID, v.Sequence, events[v.Sequence-1].GetSessionId())
				}
			}
		})
	}
}

// TestCheckerAdd feeds a broken log one event at a time, as a live stream
// would, and wants each violation from the event that causes it.
func TestCheckerAdd(t *testing.T) {
	t.Parallel()
	events := validEvents()
	scheduledIn(t, events, "r-n1").DelayMs = 9999
	events = insertAfter(events, indexOf(t, events, isStarted("r-a1")), startedEvent(alwaysSession, "r-a1", 1, 1, 1))

	c := invariant.New()
	var fromAdd []invariant.Violation
	for _, ev := range events {
		vs := c.Add(ev)
		for _, v := range vs {
			if v.Sequence != ev.GetSequence() || v.SessionID != ev.GetSessionId() {
				t.Errorf("Add(event %d of %q) returned %v", ev.GetSequence(), ev.GetSessionId(), v)
			}
		}
		fromAdd = append(fromAdd, vs...)
	}
	want := []invariant.Violation{
		{Sequence: 1, SessionID: normalSession, Rule: invariant.RuleDelayOutOfBounds},
		{Sequence: 7, SessionID: alwaysSession, Rule: invariant.RuleStartedRepeated},
	}
	all := c.Violations()
	if len(all) != len(want) {
		t.Fatalf("Violations() = %v, want %d", all, len(want))
	}
	for i, v := range all {
		if v.Sequence != want[i].Sequence || v.SessionID != want[i].SessionID || v.Rule != want[i].Rule {
			t.Errorf("violation %d = %v, want sequence %d, session %q, rule %s",
				i, v, want[i].Sequence, want[i].SessionID, want[i].Rule)
		}
	}
	if !slices.Equal(fromAdd, all) {
		t.Errorf("Add returned %v, Violations() = %v", fromAdd, all)
	}
	if got := invariant.Check(events); !slices.Equal(got, all) {
		t.Errorf("Check = %v, want %v", got, all)
	}

	all[0].Rule = "changed"
	if c.Violations()[0].Rule != invariant.RuleDelayOutOfBounds {
		t.Error("Violations() returned the checker's own slice")
	}
}

func TestCheckerAddNilEvent(t *testing.T) {
	t.Parallel()
	got := rules(invariant.New().Add(nil))
	want := []string{invariant.RuleEmptySessionID, invariant.RuleMissingKind}
	if !slices.Equal(got, want) {
		t.Errorf("Add(nil) rules = %q, want %q", got, want)
	}
}

func TestViolationString(t *testing.T) {
	t.Parallel()
	v := invariant.Violation{
		Sequence:  42,
		SessionID: "s-1",
		Rule:      invariant.RuleStartedUnknownRetry,
		Message:   `started retry "r-9" names no retry scheduled earlier in the session`,
	}
	want := `session "s-1" sequence 42: started-unknown-retry: started retry "r-9" names no retry scheduled earlier in the session`
	if got := v.String(); got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
}
