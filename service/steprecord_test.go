package service_test

import (
	"context"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// TestStepRecordOneRetryPerStep: a step answered with a retry, reported
// again with downstream DECLINED after that retry started or was
// cancelled, gets the recorded answer in normal and schedule modes, on
// every store; the invariant checker passes over the log (eachBackend).
func TestStepRecordOneRetryPerStep(t *testing.T) {
	t.Parallel()
	modes := []struct {
		name string
		p    *retrydv1.RetryPolicy
	}{
		{"normal", &retrydv1.RetryPolicy{MaxRetries: proto.Uint32(2), Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(2), MaxDelayMs: proto.Uint64(4), JitterRatio: proto.Float64(0)}}},
		{"schedule", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{2, 4}}},
	}
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		for i, m := range modes {
			for j, started := range []bool{true, false} {
				req := failure("s", uint64(1+2*i+j), 1, "p", "SERVER", m.p)
				first := h.schedule(req)
				if started {
					h.start(first.GetRetryId())
				} else {
					h.cancelRetry(first.GetRetryId())
				}
				declined := proto.Clone(req).(*retrydv1.FailedStepRequest)
				declined.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
				again := h.fail(declined).GetDecision().GetSchedule()
				if again.GetRetryId() != first.GetRetryId() || again.GetRetryNumber() != first.GetRetryNumber() {
					t.Errorf("%s, first retry started=%t: the report with downstream DECLINED answered retry %s (%d), want the recorded %s (%d)",
						m.name, started, again.GetRetryId(), again.GetRetryNumber(), first.GetRetryId(), first.GetRetryNumber())
				}
			}
		}
	})
}

// TestStepRecordEquivalentReports: reports that mean the same get the
// recorded answer, whichever way they spell it: downstream and replay
// unset or set to their defaults, the policy inline with its defaults
// left out or written out, or by the name of a configured policy with the
// same canonical key. A report that differs in meaning is a conflict.
func TestStepRecordEquivalentReports(t *testing.T) {
	t.Parallel()
	const file = `
policies:
  fast:
    mode: normal
    maxRetries: 3
    backoff: {initialDelayMs: 5000, maxDelayMs: 10000, multiplier: 2, jitterRatio: 0}
`
	short := &retrydv1.RetryPolicy{MaxRetries: proto.Uint32(3), Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(5000), MaxDelayMs: proto.Uint64(10_000), JitterRatio: proto.Float64(0)}}
	long := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(3),
		RetryableCodes: []string{"TRANSPORT", "SERVER", "RATE_LIMIT", "TIMEOUT", "EMPTY_RESPONSE"},
		Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(5000), MaxDelayMs: proto.Uint64(10_000),
			Multiplier: proto.Float64(2), JitterRatio: proto.Float64(0), Jitter: retrydv1.Jitter_JITTER_SYMMETRIC}}
	eachBackend(t, harnessOpts{policies: file}, func(t *testing.T, h *harness) {
		req := failure("s", 1, 1, "p", "SERVER", short)
		first := h.fail(req)
		if first.GetDecision().GetSchedule() == nil {
			t.Fatalf("first report: %v, want a schedule", first.GetDecision())
		}
		spellings := map[string]func(r *retrydv1.FailedStepRequest){
			"downstream NOT_ASKED": func(r *retrydv1.FailedStepRequest) { r.Downstream = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED },
			"replay SAFE":          func(r *retrydv1.FailedStepRequest) { r.Replay = retrydv1.Replay_REPLAY_SAFE },
			"policy written out": func(r *retrydv1.FailedStepRequest) {
				r.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: long}
			},
			"policy by name": func(r *retrydv1.FailedStepRequest) {
				r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "fast"}
			},
		}
		for name, spell := range spellings {
			again := proto.Clone(req).(*retrydv1.FailedStepRequest)
			spell(again)
			resp, err := h.client.FailedStep(context.Background(), again)
			if err != nil || !proto.Equal(resp, first) {
				t.Errorf("%s: %v %v, want the recorded answer %v", name, resp, err, first)
			}
		}
		unsafe := proto.Clone(req).(*retrydv1.FailedStepRequest)
		unsafe.Replay = retrydv1.Replay_REPLAY_UNSAFE
		_, err := h.client.FailedStep(context.Background(), unsafe)
		if code, info := errorInfo(t, err); code != codes.FailedPrecondition || info.GetReason() != "STEP_RECORD_CONFLICT" {
			t.Errorf("replay UNSAFE: %v %v, want FAILED_PRECONDITION STEP_RECORD_CONFLICT", code, info)
		}
		h.cancelRetry(first.GetDecision().GetSchedule().GetRetryId())
	})
}
