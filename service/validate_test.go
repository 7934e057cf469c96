package service_test

import (
	"context"
	"strings"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestBadRequests sends invalid requests to every RPC and checks each gets
// INVALID_ARGUMENT naming the bad field, and that the event log and the
// session's chains are exactly as before.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	ok := func() *retrydv1.FailedStepRequest { return failure("s", 5, 5, "p", "SERVER", nil) }
	with := func(mut func(r *retrydv1.FailedStepRequest)) *retrydv1.FailedStepRequest {
		r := ok()
		mut(r)
		return r
	}
	withPolicy := func(p *retrydv1.RetryPolicy) *retrydv1.FailedStepRequest {
		return with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: p}
		})
	}
	failed := []struct {
		name  string
		req   *retrydv1.FailedStepRequest
		field string
	}{
		{"no session", with(func(r *retrydv1.FailedStepRequest) { r.SessionId = "" }), "session_id"},
		{"long session", with(func(r *retrydv1.FailedStepRequest) { r.SessionId = strings.Repeat("x", 257) }), "session_id"},
		{"control char session", with(func(r *retrydv1.FailedStepRequest) { r.SessionId = "a\x00b" }), "session_id"},
		{"control char provider", with(func(r *retrydv1.FailedStepRequest) { r.Provider = "deep\nseek" }), "provider"},
		{"no failure", with(func(r *retrydv1.FailedStepRequest) { r.Failure = nil }), "failure"},
		{"no code", with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "" }), "failure.code"},
		{"lowercase code", with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "rate_limit" }), "failure.code"},
		{"code with space", with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "RATE LIMIT" }), "failure.code"},
		{"message over 4 KiB", with(func(r *retrydv1.FailedStepRequest) { r.Failure.Message = strings.Repeat("m", 4097) }), "failure.message"},
		{"http status", with(func(r *retrydv1.FailedStepRequest) { r.Failure.HttpStatus = 1000 }), "failure.http_status"},
		{"unknown downstream", with(func(r *retrydv1.FailedStepRequest) { r.Downstream = 9 }), "downstream"},
		{"unknown replay", with(func(r *retrydv1.FailedStepRequest) { r.Replay = 9 }), "replay"},
		{"invalid deadline", with(func(r *retrydv1.FailedStepRequest) { r.Deadline = &timestamppb.Timestamp{Nanos: -1} }), "deadline"},
		{"empty policy name", with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{}
		}), "policy_name"},
		{"initial 0", withPolicy(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(0)}}), "policy.backoff.initial_delay_ms"},
		{"max over int32", withPolicy(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{MaxDelayMs: proto.Uint64(1 << 31)}}), "policy.backoff.max_delay_ms"},
		{"max below initial", withPolicy(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(900), MaxDelayMs: proto.Uint64(800)}}), "policy.backoff.max_delay_ms"},
		{"multiplier below 1", withPolicy(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: proto.Float64(0.5)}}), "policy.backoff.multiplier"},
		{"jitter ratio over 1", withPolicy(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: proto.Float64(1.5)}}), "policy.backoff.jitter_ratio"},
		{"bare star", withPolicy(&retrydv1.RetryPolicy{RetryableCodes: []string{"*"}}), "policy.retryable_codes[0]"},
		{"duplicate code", withPolicy(&retrydv1.RetryPolicy{RetryableCodes: []string{"SERVER", "SERVER"}}), "policy.retryable_codes[1]"},
		{"unknown mode", withPolicy(&retrydv1.RetryPolicy{Mode: 7}), "policy.mode"},
		{"max in always mode", withPolicy(&retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS, MaxRetries: proto.Uint32(3)}), "policy.max_retries"},
		{"schedule entry 0", withPolicy(&retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{1000, 0}}), "policy.schedule[1]"},
		{"schedule of 10000 entries", withPolicy(&retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: make([]uint64, 10_000)}), "policy.schedule"},
	}
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		// Some state to protect: a started retry on session s at turn 1.
		s := h.schedule(failure("s", 1, 1, "p", "SERVER", fast(1)))
		h.start(s.GetRetryId())
		before := h.events("")
		chains, err := h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: "s"})
		if err != nil {
			t.Fatal(err)
		}
		check := func(name string, err error, field string) {
			t.Helper()
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
				return
			}
			if _, ok := badFields(err)[field]; !ok {
				t.Errorf("%s: BadRequest names %v, want %s", name, badFields(err), field)
			}
		}
		for _, tt := range failed {
			_, err := h.client.FailedStep(context.Background(), tt.req)
			check(tt.name, err, tt.field)
		}
		_, err = h.client.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{})
		check("cancel without target", err, "target")
		_, err = h.client.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: "not a retry id!"}})
		check("cancel malformed id", err, "retry_id")
		_, err = h.client.StepSucceeded(context.Background(), &retrydv1.StepSucceededRequest{})
		check("success without session", err, "session_id")
		_, err = h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{})
		check("chains without session", err, "session_id")
		stream, err := h.client.AwaitRetry(context.Background(), &retrydv1.AwaitRetryRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		check("await without id", err, "retry_id")

		if after := h.events(""); len(after) != len(before) {
			t.Errorf("bad requests changed the event log: %d events, was %d", len(after), len(before))
		}
		again, err := h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: "s"})
		if err != nil || !proto.Equal(again, chains) {
			t.Errorf("bad requests changed the session:\n%v\n%v", chains, again)
		}
		if _, err := h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: "a\x00b"}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("chains of control-char session: %v", err)
		}
	})
}
