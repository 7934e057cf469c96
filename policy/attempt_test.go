package policy

import (
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestAttemptOf: a report reads as one Attempt wherever it is decided: an
// unset phase is NOT_ASKED, an unset replay SAFE, the deadline is set
// exactly when the report has one (the Unix epoch included), and the
// chain's retries and the provider's delay pass through.
func TestAttemptOf(t *testing.T) {
	t.Parallel()
	deadline := time.Date(2026, time.March, 1, 12, 0, 30, 5, time.UTC)
	ra := RetryAfter{Valid: true, Ms: 1500}
	tests := []struct {
		name string
		req  *retrydv1.FailedStepRequest
		// retries and ra are AttemptOf's other arguments.
		retries uint32
		ra      RetryAfter
		want    Attempt
	}{
		{
			name: "nil report",
			want: Attempt{Downstream: retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, Replay: retrydv1.Replay_REPLAY_SAFE},
		},
		{
			name:    "everything unset",
			req:     &retrydv1.FailedStepRequest{Failure: &retrydv1.Failure{Code: "SERVER"}},
			retries: 2,
			want: Attempt{Retries: 2, Code: "SERVER",
				Downstream: retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, Replay: retrydv1.Replay_REPLAY_SAFE},
		},
		{
			name: "everything set",
			req: &retrydv1.FailedStepRequest{
				Failure:    &retrydv1.Failure{Code: "RATE_LIMIT"},
				Downstream: retrydv1.Downstream_DOWNSTREAM_DECLINED,
				Replay:     retrydv1.Replay_REPLAY_UNSAFE,
				Deadline:   timestamppb.New(deadline),
			},
			retries: 7,
			ra:      ra,
			want: Attempt{Retries: 7, Code: "RATE_LIMIT", RetryAfter: ra,
				Downstream: retrydv1.Downstream_DOWNSTREAM_DECLINED, Replay: retrydv1.Replay_REPLAY_UNSAFE,
				Deadline: deadline, HasDeadline: true},
		},
		{
			name:    "not asked and safe as sent",
			req:     &retrydv1.FailedStepRequest{Downstream: retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, Replay: retrydv1.Replay_REPLAY_SAFE},
			retries: 1,
			want: Attempt{Retries: 1,
				Downstream: retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, Replay: retrydv1.Replay_REPLAY_SAFE},
		},
		{
			name: "handled",
			req:  &retrydv1.FailedStepRequest{Downstream: retrydv1.Downstream_DOWNSTREAM_HANDLED},
			want: Attempt{Downstream: retrydv1.Downstream_DOWNSTREAM_HANDLED, Replay: retrydv1.Replay_REPLAY_SAFE},
		},
		{
			name: "a zero deadline is a deadline",
			req:  &retrydv1.FailedStepRequest{Deadline: &timestamppb.Timestamp{}},
			want: Attempt{Downstream: retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, Replay: retrydv1.Replay_REPLAY_SAFE,
				Deadline: time.Unix(0, 0).UTC(), HasDeadline: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := AttemptOf(tt.req, tt.retries, tt.ra)
			if got.Retries != tt.want.Retries || got.Code != tt.want.Code || got.RetryAfter != tt.want.RetryAfter {
				t.Errorf("retries, code, retry-after = %d, %q, %+v; want %d, %q, %+v",
					got.Retries, got.Code, got.RetryAfter, tt.want.Retries, tt.want.Code, tt.want.RetryAfter)
			}
			if got.Downstream != tt.want.Downstream || got.Replay != tt.want.Replay {
				t.Errorf("downstream, replay = %v, %v; want %v, %v", got.Downstream, got.Replay, tt.want.Downstream, tt.want.Replay)
			}
			if got.HasDeadline != tt.want.HasDeadline || !got.Deadline.Equal(tt.want.Deadline) {
				t.Errorf("deadline = %v (set %v), want %v (set %v)", got.Deadline, got.HasDeadline, tt.want.Deadline, tt.want.HasDeadline)
			}
		})
	}
}

// TestPhaseOf: unset is the first phase; every other phase is itself.
func TestPhaseOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want retrydv1.Downstream }{
		{retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED},
		{retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED},
		{retrydv1.Downstream_DOWNSTREAM_DECLINED, retrydv1.Downstream_DOWNSTREAM_DECLINED},
		{retrydv1.Downstream_DOWNSTREAM_HANDLED, retrydv1.Downstream_DOWNSTREAM_HANDLED},
	} {
		t.Run(tt.in.String(), func(t *testing.T) {
			t.Parallel()
			if got := PhaseOf(tt.in); got != tt.want {
				t.Errorf("PhaseOf(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestReplayOf: unset is safe; every other value is itself.
func TestReplayOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want retrydv1.Replay }{
		{retrydv1.Replay_REPLAY_UNSPECIFIED, retrydv1.Replay_REPLAY_SAFE},
		{retrydv1.Replay_REPLAY_SAFE, retrydv1.Replay_REPLAY_SAFE},
		{retrydv1.Replay_REPLAY_UNSAFE, retrydv1.Replay_REPLAY_UNSAFE},
	} {
		t.Run(tt.in.String(), func(t *testing.T) {
			t.Parallel()
			if got := ReplayOf(tt.in); got != tt.want {
				t.Errorf("ReplayOf(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestDecidingPhase: only always mode reads the phase; elsewhere, and
// without a policy, every phase means the same.
func TestDecidingPhase(t *testing.T) {
	t.Parallel()
	resolve := func(mode retrydv1.Mode) *Policy {
		p, err := Resolve(&retrydv1.RetryPolicy{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	always := resolve(retrydv1.Mode_MODE_ALWAYS)
	const (
		unset    = retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED
		notAsked = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
		declined = retrydv1.Downstream_DOWNSTREAM_DECLINED
		handled  = retrydv1.Downstream_DOWNSTREAM_HANDLED
	)
	tests := []struct {
		name string
		p    *Policy
		in   retrydv1.Downstream
		want retrydv1.Downstream
	}{
		{"always unset", always, unset, notAsked},
		{"always not asked", always, notAsked, notAsked},
		{"always declined", always, declined, declined},
		{"always handled", always, handled, handled},
		{"normal declined", resolve(retrydv1.Mode_MODE_NORMAL), declined, unset},
		{"normal unset", resolve(retrydv1.Mode_MODE_NORMAL), unset, unset},
		{"schedule handled", resolve(retrydv1.Mode_MODE_SCHEDULE), handled, unset},
		{"no policy", nil, declined, unset},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.p.DecidingPhase(tt.in); got != tt.want {
				t.Errorf("DecidingPhase(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}
