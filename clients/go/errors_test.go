package retryd_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestIsRetryPending reads the RETRY_PENDING refusal the server sends for
// a report made while the session's retry has not started.
func TestIsRetryPending(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := testContext(t)
	const session = "pending"
	resp, err := ts.client.FailedStep(ctx, failedStep(session, 1, 1, backoffPolicy(10_000, 2)))
	if err != nil {
		t.Fatalf("FailedStep: %v", err)
	}
	id := resp.GetDecision().GetSchedule().GetRetryId()

	_, err = ts.client.Recover(ctx, failedStep(session, 2, 2, backoffPolicy(10_000, 2)))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Recover while pending: %v, want FailedPrecondition", err)
	}
	for _, e := range []error{err, fmt.Errorf("agent: %w", err)} {
		if got, ok := retryd.IsRetryPending(e); !ok || got != id {
			t.Errorf("IsRetryPending(%v) = %q, %v; want %q, true", e, got, ok, id)
		}
		if got := retryd.ErrorReason(e); got != retryd.ReasonRetryPending {
			t.Errorf("ErrorReason(%v) = %q, want %q", e, got, retryd.ReasonRetryPending)
		}
	}
	_, err = ts.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: session, Turn: 2, Step: 2})
	if got, ok := retryd.IsRetryPending(err); !ok || got != id {
		t.Errorf("StepSucceeded while pending: IsRetryPending(%v) = %q, %v; want %q, true", err, got, ok, id)
	}

	// Cancelling the session clears the way; an older step is then stale,
	// which is not RETRY_PENDING.
	cancelled, err := ts.client.CancelSession(ctx, session)
	if err != nil {
		t.Fatalf("CancelSession: %v", err)
	}
	if len(cancelled.GetRetries()) != 1 || cancelled.GetRetries()[0].GetRetryId() != id ||
		cancelled.GetRetries()[0].GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
		t.Errorf("CancelSession = %v, want retry %s cancelled (requested)", cancelled, id)
	}
	_, err = ts.client.FailedStep(ctx, failedStep(session, 0, 5, backoffPolicy(10_000, 2)))
	if got := retryd.ErrorReason(err); got != retryd.ReasonStaleStep {
		t.Errorf("stale report: ErrorReason(%v) = %q, want %q", err, got, retryd.ReasonStaleStep)
	}
	if got, ok := retryd.IsRetryPending(err); ok {
		t.Errorf("IsRetryPending(stale step error) = %q, true; want false", got)
	}
	for _, e := range []error{nil, errors.New("plain"), status.Error(codes.FailedPrecondition, "no details")} {
		if got, ok := retryd.IsRetryPending(e); ok {
			t.Errorf("IsRetryPending(%v) = %q, true; want false", e, got)
		}
	}
	retrydtest.Verify(t, ts.conn)
}

// TestFieldViolations reads the google.rpc.BadRequest details of the
// server's INVALID_ARGUMENT errors.
func TestFieldViolations(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := testContext(t)

	_, err := ts.client.FailedStep(ctx, &retrydv1.FailedStepRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty FailedStep: %v, want InvalidArgument", err)
	}
	got := retryd.FieldViolations(err)
	if got["session_id"] != "required" || got["failure"] != "required" {
		t.Errorf("FieldViolations(empty report) = %v, want session_id and failure required", got)
	}

	bad := failedStep("violations", 1, 1, &retrydv1.RetryPolicy{
		MaxRetries: proto.Uint32(2),
		Backoff:    &retrydv1.Backoff{InitialDelayMs: proto.Uint64(0)},
	})
	bad.Failure.Code = "not upper snake"
	_, err = ts.client.Recover(ctx, bad)
	got = retryd.FieldViolations(err)
	if got["failure.code"] == "" || got["policy.backoff.initial_delay_ms"] == "" {
		t.Errorf("FieldViolations(bad code and policy) = %v, want failure.code and policy.backoff.initial_delay_ms", got)
	}

	// A malformed retry id is refused, not re-attached to.
	_, err = ts.client.AwaitRetry(ctx, "not a retry id")
	if status.Code(err) != codes.InvalidArgument || retryd.FieldViolations(err)["retry_id"] == "" {
		t.Errorf("AwaitRetry(malformed id) = %v, want InvalidArgument on retry_id", err)
	}
	// So is an unknown one.
	_, err = ts.client.AwaitRetry(ctx, strings.Repeat("A", 26))
	if status.Code(err) != codes.NotFound {
		t.Errorf("AwaitRetry(unknown id) = %v, want NotFound", err)
	}
	if got := retryd.FieldViolations(err); got != nil {
		t.Errorf("FieldViolations(NotFound) = %v, want nil", got)
	}
	if got := retryd.FieldViolations(nil); got != nil {
		t.Errorf("FieldViolations(nil) = %v, want nil", got)
	}
	retrydtest.Verify(t, ts.conn)
}

// TestLimitReached reads admission control's refusal from a server whose
// tenant may hold one pending retry: the second session's report is
// RESOURCE_EXHAUSTED with the full bound and a RetryInfo of 1 s, recorded
// nothing, and is admitted once the first retry is cancelled.
func TestLimitReached(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "--max-pending-retries-per-tenant", "1")
	ctx := testContext(t)
	first, err := ts.client.FailedStep(ctx, failedStep("limit-1", 1, 1, backoffPolicy(10_000, 2)))
	if err != nil || first.GetDecision().GetSchedule() == nil {
		t.Fatalf("FailedStep = %v, %v; want a scheduled retry", first.GetDecision(), err)
	}

	_, err = ts.client.Recover(ctx, failedStep("limit-2", 1, 1, backoffPolicy(10_000, 2)))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Recover over the bound: %v, want ResourceExhausted", err)
	}
	for _, e := range []error{err, fmt.Errorf("agent: %w", err)} {
		if got, ok := retryd.IsLimitReached(e); !ok || got != "pending_retries_per_tenant" {
			t.Errorf("IsLimitReached(%v) = %q, %v; want pending_retries_per_tenant, true", e, got, ok)
		}
		if got, ok := retryd.RetryDelay(e); !ok || got != time.Second {
			t.Errorf("RetryDelay(%v) = %v, %v; want 1s, true", e, got, ok)
		}
		if got := retryd.ErrorReason(e); got != retryd.ReasonLimitReached {
			t.Errorf("ErrorReason(%v) = %q, want %s", e, got, retryd.ReasonLimitReached)
		}
	}
	if _, err := ts.client.GetChains(ctx, "limit-2"); status.Code(err) != codes.NotFound {
		t.Errorf("GetChains of the refused session = %v, want NotFound (nothing recorded)", err)
	}

	// Other errors are not a full bound and carry no delay.
	_, pending := ts.client.FailedStep(ctx, failedStep("limit-1", 2, 2, backoffPolicy(10_000, 2)))
	if _, ok := retryd.IsRetryPending(pending); !ok {
		t.Fatalf("a second report of limit-1 = %v, want RETRY_PENDING", pending)
	}
	for _, e := range []error{nil, errors.New("plain"), pending, status.Error(codes.ResourceExhausted, "message too large")} {
		if got, ok := retryd.IsLimitReached(e); ok {
			t.Errorf("IsLimitReached(%v) = %q, true; want false", e, got)
		}
		if got, ok := retryd.RetryDelay(e); ok {
			t.Errorf("RetryDelay(%v) = %v, true; want false", e, got)
		}
	}

	// Nothing was recorded, so the same report may be sent again: after
	// the first retry ends, it is admitted (the counts follow the event
	// log, so it may take a delay or two).
	if _, err := ts.client.CancelRetry(ctx, first.GetDecision().GetSchedule().GetRetryId()); err != nil {
		t.Fatalf("CancelRetry: %v", err)
	}
	for {
		resp, err := ts.client.FailedStep(ctx, failedStep("limit-2", 1, 1, backoffPolicy(10_000, 2)))
		if err == nil {
			if resp.GetDecision().GetSchedule() == nil {
				t.Errorf("FailedStep after the bound freed = %v, want a scheduled retry", resp.GetDecision())
			}
			break
		}
		delay, ok := retryd.RetryDelay(err)
		if _, full := retryd.IsLimitReached(err); !full || !ok {
			t.Fatalf("FailedStep after the first retry was cancelled: %v, want admitted or LIMIT_REACHED", err)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			t.Fatalf("still refused when the test's context ended: %v", err)
		}
	}
	if _, err := ts.client.CancelSession(ctx, "limit-2"); err != nil {
		t.Errorf("CancelSession: %v", err)
	}
	retrydtest.Verify(t, ts.conn)
}
