package retryd_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestServerShutdownCancelsAwaiters stops the server while Recover waits:
// the agent gets Cancelled (shutdown) instead of hanging, and the server
// exits cleanly within its shutdown timeout.
func TestServerShutdownCancelsAwaiters(t *testing.T) {
	t.Parallel()
	const shutdownTimeout = 5 * time.Second
	ts := startServer(t, "--shutdown-timeout", shutdownTimeout.String())
	const session = "shutdown"

	type result struct {
		out retryd.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := ts.client.Recover(testContext(t), failedStep(session, 1, 1, backoffPolicy(10_000, 2)))
		done <- result{out, err}
	}()
	waitAwaiters(t, ts.conn, session, 1)
	// Verify now: the server and its event log are gone after the signal.
	retrydtest.Verify(t, ts.conn)
	if err := ts.srv.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	res := <-done

	if res.err != nil {
		t.Fatalf("Recover: %v, want a shutdown cancellation", res.err)
	}
	if res.out.Retry || res.out.Started != nil {
		t.Errorf("Recover = %+v, want no retry", res.out)
	}
	if c := res.out.Cancelled; c.GetReason() != retrydv1.CancelReason_CANCEL_REASON_SHUTDOWN || c.GetRetryId() != res.out.Schedule.GetRetryId() {
		t.Errorf("Cancelled = %v, want retry %s cancelled (shutdown)", c, res.out.Schedule.GetRetryId())
	}
	if err := ts.srv.Wait(shutdownTimeout); err != nil {
		t.Errorf("retryd after SIGTERM: %v, want exit 0 within %v", err, shutdownTimeout)
	}
}

// TestWatchEvents reads the log to its end, then follows it until the loop
// breaks or the context ends.
func TestWatchEvents(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := testContext(t)
	const session = "watch"
	if _, err := ts.client.Recover(ctx, failedStep(session, 1, 1, backoffPolicy(10, 2))); err != nil {
		t.Fatalf("Recover: %v", err)
	}

	var kinds []string
	var last uint64
	for ev, err := range ts.client.WatchEvents(ctx, &retrydv1.WatchEventsRequest{SessionId: session, StopAtEnd: true}) {
		if err != nil {
			t.Fatalf("WatchEvents: %v", err)
		}
		if ev.GetSequence() <= last {
			t.Errorf("sequence %d after %d", ev.GetSequence(), last)
		}
		last = ev.GetSequence()
		kinds = append(kinds, kindOf(ev))
	}
	if len(kinds) != 2 || kinds[0] != "scheduled" || kinds[1] != "started" {
		t.Fatalf("events = %v, want [scheduled started]", kinds)
	}

	// Follow from the end: the next event arrives, and break closes the
	// stream.
	follow := make(chan string, 1)
	go func() {
		for ev, err := range ts.client.WatchEvents(ctx, &retrydv1.WatchEventsRequest{SessionId: session, AfterSequence: last}) {
			if err != nil {
				follow <- err.Error()
				return
			}
			follow <- kindOf(ev)
			break
		}
	}()
	if _, err := ts.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: session, Turn: 2, Step: 2}); err != nil {
		t.Fatalf("StepSucceeded: %v", err)
	}
	if got := <-follow; got != "closed" {
		t.Errorf("followed event = %v, want closed", got)
	}

	// A follower whose context ends gets ctx.Err() as its last pair.
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	var lastErr error
	for _, err := range ts.client.WatchEvents(wctx, &retrydv1.WatchEventsRequest{SessionId: session, AfterSequence: last + 1}) {
		lastErr = err
	}
	if !errors.Is(lastErr, context.DeadlineExceeded) {
		t.Errorf("follower's last error = %v, want context.DeadlineExceeded", lastErr)
	}
	retrydtest.Verify(t, ts.conn)
}

func kindOf(ev *retrydv1.Event) string {
	for k := range kindCounts([]*retrydv1.Event{ev}) {
		return k
	}
	return "none"
}

// TestClose checks that Close closes only a connection New created.
func TestClose(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := testContext(t)

	borrowed := retryd.NewFromConn(ts.conn, retryd.WithCancelTimeout(time.Second))
	if err := borrowed.Close(); err != nil {
		t.Fatalf("Close of a NewFromConn client: %v", err)
	}
	if _, err := borrowed.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "close", Turn: 1, Step: 1}); err != nil {
		t.Errorf("the caller's connection stopped working after Close: %v", err)
	}

	owned, err := retryd.New(ts.srv.Addr, retryd.WithInsecure(), retryd.WithReattachBackoff(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owned.GetChains(ctx, "close"); status.Code(err) != codes.NotFound {
		t.Errorf("GetChains(unknown session) = %v, want NotFound", err)
	}
	if err := owned.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := owned.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := owned.GetChains(ctx, "close"); status.Code(err) != codes.Canceled {
		t.Errorf("GetChains after Close = %v, want Canceled (connection closing)", err)
	}
	retrydtest.Verify(t, ts.conn)
}

// TestProviderState reads a provider's fleet protection through
// ProviderState, from a server whose policy file protects deepseek only:
// its budget and circuit, a scheduled retry taking a token and queueing;
// an unprotected provider answers zeros; an empty provider is refused.
func TestProviderState(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "config.yaml")
	// A refill so slow that the test cannot see it: the budget only
	// changes by the retry it schedules.
	body := "providers:\n  deepseek:\n    fleet: {capacity: 3, refillPerSecond: 0.0001, successCredit: 0.1}\n"
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, "--config", config)
	ctx := testContext(t)

	st, err := ts.client.ProviderState(ctx, "deepseek")
	if err != nil || !st.GetProtected() || st.GetProvider() != "deepseek" || st.GetBudgetCapacity() != 3 || st.GetBudgetTokens() != 3 ||
		st.GetCircuit() != retrydv1.CircuitState_CIRCUIT_STATE_CLOSED || st.GetQueuedRetries() != 0 {
		t.Fatalf("ProviderState(deepseek) = %v, %v; want protected, 3 of 3 tokens, circuit closed, nothing queued", st, err)
	}
	req := failedStep("provider-state", 1, 1, backoffPolicy(10_000, 2))
	req.Provider = "deepseek"
	resp, err := ts.client.FailedStep(ctx, req)
	if err != nil || resp.GetDecision().GetSchedule() == nil {
		t.Fatalf("FailedStep = %v, %v; want a scheduled retry", resp.GetDecision(), err)
	}
	st, err = ts.client.ProviderState(ctx, "deepseek")
	if err != nil || st.GetBudgetTokens() < 2 || st.GetBudgetTokens() >= 2.5 || st.GetQueuedRetries() != 1 || st.GetWindowSamples() != 1 || st.GetFailureRate() != 1 {
		t.Errorf("ProviderState(deepseek) after one retry = %v, %v; want 2 tokens (one taken), 1 queued, 1 failure in the window", st, err)
	}

	st, err = ts.client.ProviderState(ctx, "openai")
	if err != nil || st.GetProtected() || st.GetProvider() != "openai" || st.GetBudgetCapacity() != 0 || st.GetCircuit() != retrydv1.CircuitState_CIRCUIT_STATE_UNSPECIFIED {
		t.Errorf("ProviderState(openai) = %v, %v; want unprotected, zeros", st, err)
	}
	_, err = ts.client.ProviderState(ctx, "")
	if status.Code(err) != codes.InvalidArgument || retryd.FieldViolations(err)["provider"] == "" {
		t.Errorf("ProviderState(\"\") = %v, want InvalidArgument on provider", err)
	}
	if _, err := ts.client.CancelSession(ctx, "provider-state"); err != nil {
		t.Errorf("CancelSession: %v", err)
	}
	retrydtest.Verify(t, ts.conn)
}
