package retryd_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestRecoverRetriesUntilExhausted walks one chain through its budget: two
// scheduled retries that each start no earlier than their exact (jitter 0)
// delay, then a budget_exhausted delegation; StepSucceeded then closes the
// reopened chain so the next failure is retry 1 again.
func TestRecoverRetriesUntilExhausted(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := testContext(t)
	const session = "recover-happy"
	p := backoffPolicy(50, 2)

	// recoverRetry reports a failure and checks that the retry starts
	// after its whole delay.
	recoverRetry := func(turn, step uint64, wantNumber uint32, wantDelay time.Duration) {
		t.Helper()
		begin := time.Now()
		out, err := ts.client.Recover(ctx, failedStep(session, turn, step, p))
		if err != nil {
			t.Fatalf("turn %d step %d: Recover: %v", turn, step, err)
		}
		waited := time.Since(begin)
		if !out.Retry || out.Started == nil || out.Delegate != nil || out.Cancelled != nil {
			t.Fatalf("turn %d step %d: want a started retry, got %+v", turn, step, out)
		}
		sc := out.Schedule
		if sc.GetRetryNumber() != wantNumber || sc.GetDelayMs() != uint64(wantDelay/time.Millisecond) ||
			sc.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_BACKOFF || sc.GetMaxRetries() != 2 {
			t.Errorf("turn %d step %d: schedule %v, want retry %d after %v of backoff (of 2)", turn, step, sc, wantNumber, wantDelay)
		}
		if waited < wantDelay {
			t.Errorf("turn %d step %d: Recover returned after %v, before the %v delay", turn, step, waited, wantDelay)
		}
		st := out.Started
		if st.GetRetryId() != sc.GetRetryId() || st.GetRetryNumber() != wantNumber || st.GetTurn() != turn || st.GetStep() != step {
			t.Errorf("turn %d step %d: started %v does not match schedule %v", turn, step, st, sc)
		}
		if st.GetStartedAt().AsTime().Before(sc.GetDueAt().AsTime()) {
			t.Errorf("turn %d step %d: started at %v, before due %v", turn, step, st.GetStartedAt().AsTime(), sc.GetDueAt().AsTime())
		}
		if got := out.Event.GetScheduled(); got.GetRetryId() != sc.GetRetryId() || got.GetRetryNumber() != wantNumber {
			t.Errorf("turn %d step %d: event %v is not the scheduled record of %s", turn, step, out.Event, sc.GetRetryId())
		}
	}

	// The agent fails, waits, starts the retry (a new turn and step), and
	// fails again on the same provider and policy: one chain.
	recoverRetry(1, 1, 1, 50*time.Millisecond)
	recoverRetry(2, 2, 2, 100*time.Millisecond)

	out, err := ts.client.Recover(ctx, failedStep(session, 3, 3, p))
	if err != nil {
		t.Fatalf("third failure: %v", err)
	}
	if out.Retry || out.Schedule != nil || out.Delegate.GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED {
		t.Fatalf("third failure: want delegate budget_exhausted, got %+v", out)
	}
	if d := out.Event.GetDelegated(); d.GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED || d.GetStep() != 3 {
		t.Errorf("third failure: event %v is not the delegated record", out.Event)
	}

	// The exhausted chain closed: the next failure opens it again at 1.
	recoverRetry(4, 4, 1, 50*time.Millisecond)
	succ, err := ts.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: session, Turn: 5, Step: 5, Provider: "anthropic"})
	if err != nil {
		t.Fatalf("StepSucceeded: %v", err)
	}
	if len(succ.GetClosed()) != 1 || succ.GetClosed()[0].GetReason() != retrydv1.CloseReason_CLOSE_REASON_SUCCEEDED || succ.GetClosed()[0].GetRetries() != 1 {
		t.Errorf("StepSucceeded closed %v, want one chain closed as succeeded after 1 retry", succ.GetClosed())
	}
	recoverRetry(6, 6, 1, 50*time.Millisecond)

	chains, err := ts.client.GetChains(ctx, session)
	if err != nil {
		t.Fatalf("GetChains: %v", err)
	}
	if len(chains.GetChains()) != 1 || !chains.GetChains()[0].GetOpen() || chains.GetChains()[0].GetRetries() != 1 ||
		chains.GetChains()[0].GetLatest().GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_STARTED {
		t.Errorf("GetChains = %v, want one open chain whose retry 1 started", chains)
	}
	got := kindCounts(sessionEvents(t, ts.conn, session))
	want := map[string]int{"scheduled": 4, "started": 4, "delegated": 1, "closed": 2}
	if !maps.Equal(got, want) {
		t.Errorf("session events by kind = %v, want %v", got, want)
	}
	retrydtest.Verify(t, ts.conn)
}

// TestRecoverDelegates checks each delegate reason a single report can
// produce, through Recover.
func TestRecoverDelegates(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	p := backoffPolicy(50, 2)
	tests := []struct {
		name   string
		modify func(*retrydv1.FailedStepRequest)
		want   retrydv1.DelegateReason
	}{
		{
			name:   "no provider",
			modify: func(r *retrydv1.FailedStepRequest) { r.Provider = "" },
			want:   retrydv1.DelegateReason_DELEGATE_REASON_NO_PROVIDER,
		},
		{
			name:   "code not retryable",
			modify: func(r *retrydv1.FailedStepRequest) { r.Failure = &retrydv1.Failure{Code: "HTTP_404", HttpStatus: 404} },
			want:   retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE,
		},
		{
			name:   "aborted",
			modify: func(r *retrydv1.FailedStepRequest) { r.Failure = &retrydv1.Failure{Code: "ABORTED"} },
			want:   retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE,
		},
		{
			name:   "replay unsafe",
			modify: func(r *retrydv1.FailedStepRequest) { r.Replay = retrydv1.Replay_REPLAY_UNSAFE },
			want:   retrydv1.DelegateReason_DELEGATE_REASON_REPLAY_UNSAFE,
		},
		{
			// 50 ms of delay plus the default 100 ms minimum attempt do
			// not fit in 20 ms.
			name: "deadline",
			modify: func(r *retrydv1.FailedStepRequest) {
				r.Deadline = timestamppb.New(time.Now().Add(20 * time.Millisecond))
			},
			want: retrydv1.DelegateReason_DELEGATE_REASON_DEADLINE,
		},
	}
	t.Run("reasons", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				session := "delegate-" + t.Name()
				req := failedStep(session, 1, 1, p)
				tt.modify(req)
				out, err := ts.client.Recover(testContext(t), req)
				if err != nil {
					t.Fatalf("Recover: %v", err)
				}
				if out.Retry || out.Schedule != nil || out.Started != nil || out.Cancelled != nil {
					t.Errorf("want only a delegation, got %+v", out)
				}
				if out.Delegate.GetReason() != tt.want || out.Delegate.GetDetail() == "" {
					t.Errorf("delegate = %v, want reason %v with a detail", out.Delegate, tt.want)
				}
				if d := out.Event.GetDelegated(); d.GetReason() != tt.want || out.Event.GetSessionId() != session {
					t.Errorf("event = %v, want the delegated record with reason %v", out.Event, tt.want)
				}
			})
		}
	})
	retrydtest.Verify(t, ts.conn)
}

// TestRecoverCancelsWhenContextEnds ends the caller's context during the
// backoff, by cancelling it or by its deadline: Recover must cancel the
// retry on the server, which then never starts.
func TestRecoverCancelsWhenContextEnds(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	tests := []struct {
		name string
		// end makes ctx end once Recover waits.
		end  func(ctx context.Context, session string) (context.Context, func())
		want error
	}{
		{
			name: "cancelled",
			end: func(ctx context.Context, session string) (context.Context, func()) {
				ctx, cancel := context.WithCancel(ctx)
				return ctx, func() { waitAwaiters(t, ts.conn, session, 1); cancel() }
			},
			want: context.Canceled,
		},
		{
			name: "deadline",
			end: func(ctx context.Context, _ string) (context.Context, func()) {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				t.Cleanup(cancel)
				return ctx, func() {}
			},
			want: context.DeadlineExceeded,
		},
	}
	t.Run("by", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				session := "cancel-" + tt.name
				ctx, end := tt.end(testContext(t), session)
				type result struct {
					out retryd.Outcome
					err error
				}
				done := make(chan result, 1)
				go func() {
					out, err := ts.client.Recover(ctx, failedStep(session, 1, 1, backoffPolicy(10_000, 2)))
					done <- result{out, err}
				}()
				end()
				res := <-done

				if !errors.Is(res.err, tt.want) {
					t.Fatalf("Recover error = %v, want %v", res.err, tt.want)
				}
				if res.out.Retry || res.out.Started != nil {
					t.Errorf("Recover = %+v, want no retry", res.out)
				}
				id := res.out.Schedule.GetRetryId()
				if id == "" || res.out.Cancelled.GetRetryId() != id || res.out.Cancelled.GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
					t.Errorf("Recover = %+v, want the schedule and its requested cancellation", res.out)
				}

				// The server agrees: the retry is cancelled (requested) and
				// its chain closed, AwaitRetry answers cancelled at once, and
				// nothing started.
				chains, err := ts.client.GetChains(testContext(t), session)
				if err != nil {
					t.Fatalf("GetChains: %v", err)
				}
				if len(chains.GetChains()) != 1 {
					t.Fatalf("GetChains = %v, want one chain", chains)
				}
				c := chains.GetChains()[0]
				if c.GetOpen() || c.GetLatest().GetRetryId() != id || c.GetLatest().GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_CANCELLED ||
					c.GetLatest().GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
					t.Errorf("chain = %v, want closed with retry %s cancelled as requested", c, id)
				}
				term, err := ts.client.AwaitRetry(testContext(t), id)
				if err != nil {
					t.Fatalf("AwaitRetry after cancel: %v", err)
				}
				if term.GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
					t.Errorf("AwaitRetry after cancel = %v, want cancelled (requested)", term)
				}
				got := kindCounts(sessionEvents(t, ts.conn, session))
				if want := map[string]int{"scheduled": 1, "cancelled": 1, "closed": 1}; !maps.Equal(got, want) {
					t.Errorf("session events by kind = %v, want %v (no started)", got, want)
				}
			})
		}
	})
	retrydtest.Verify(t, ts.conn)
}

// TestRecoverReattachesAfterBrokenStream severs the TCP connection under a
// waiting Recover: it must re-attach to AwaitRetry and still return the
// retry's single Started.
func TestRecoverReattachesAfterBrokenStream(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	proxy := startProxy(t, ts.srv.Addr)
	client, err := retryd.New(proxy.Addr(), retryd.WithInsecure(), retryd.WithReattachBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const session = "recover-reattach"

	type result struct {
		out retryd.Outcome
		err error
	}
	done := make(chan result, 1)
	begin := time.Now()
	go func() {
		out, err := client.Recover(testContext(t), failedStep(session, 1, 1, backoffPolicy(2000, 2)))
		done <- result{out, err}
	}()
	waitAwaiters(t, ts.conn, session, 1)
	proxy.sever()
	res := <-done
	waited := time.Since(begin)

	if res.err != nil {
		t.Fatalf("Recover: %v", res.err)
	}
	if !res.out.Retry || res.out.Started.GetRetryId() != res.out.Schedule.GetRetryId() || res.out.Started.GetRetryNumber() != 1 {
		t.Fatalf("Recover = %+v, want retry 1 started", res.out)
	}
	if waited < 2*time.Second {
		t.Errorf("Recover returned after %v, before the 2s delay", waited)
	}
	if n := proxy.Accepted(); n < 2 {
		t.Errorf("the proxy forwarded %d connections; the client did not reconnect after the sever", n)
	}
	events := sessionEvents(t, ts.conn, session)
	if got, want := kindCounts(events), map[string]int{"scheduled": 1, "started": 1}; !maps.Equal(got, want) {
		t.Errorf("session events by kind = %v, want %v", got, want)
	}
	for _, ev := range events {
		if st := ev.GetStarted(); st != nil && !proto.Equal(st, res.out.Started) {
			t.Errorf("started event %v differs from what Recover returned %v", st, res.out.Started)
		}
	}
	retrydtest.Verify(t, ts.conn)
}

// TestRecoverReportsAbandonedRetry keeps Recover disconnected past the
// retry's due time and the server's abandon grace: once it can re-attach,
// it gets the retry's Cancelled (abandoned) with no error.
func TestRecoverReportsAbandonedRetry(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "--abandon-grace", "200ms")
	proxy := startProxy(t, ts.srv.Addr)
	client, err := retryd.New(proxy.Addr(), retryd.WithInsecure(), retryd.WithReattachBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const session = "recover-abandoned"

	type result struct {
		out retryd.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := client.Recover(testContext(t), failedStep(session, 1, 1, backoffPolicy(300, 2)))
		done <- result{out, err}
	}()
	waitAwaiters(t, ts.conn, session, 1)
	proxy.refuse(true)
	proxy.sever()
	waitRetryStatus(t, ts.conn, session, retrydv1.RetryStatus_RETRY_STATUS_CANCELLED)
	proxy.refuse(false)
	res := <-done

	if res.err != nil {
		t.Fatalf("Recover: %v, want the abandoned cancellation", res.err)
	}
	if res.out.Retry || res.out.Started != nil {
		t.Errorf("Recover = %+v, want no retry", res.out)
	}
	if c := res.out.Cancelled; c.GetReason() != retrydv1.CancelReason_CANCEL_REASON_ABANDONED || c.GetRetryId() != res.out.Schedule.GetRetryId() {
		t.Errorf("Cancelled = %v, want retry %s cancelled (abandoned)", c, res.out.Schedule.GetRetryId())
	}
	if got, want := kindCounts(sessionEvents(t, ts.conn, session)), map[string]int{"scheduled": 1, "cancelled": 1, "closed": 1}; !maps.Equal(got, want) {
		t.Errorf("session events by kind = %v, want %v", got, want)
	}
	retrydtest.Verify(t, ts.conn)
}

// TestAwaitRetryManyAwaiters attaches five awaiters to one retry: all see
// the same single Started.
func TestAwaitRetryManyAwaiters(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := testContext(t)
	const session = "await-many"
	resp, err := ts.client.FailedStep(ctx, failedStep(session, 1, 1, backoffPolicy(300, 2)))
	if err != nil {
		t.Fatalf("FailedStep: %v", err)
	}
	id := resp.GetDecision().GetSchedule().GetRetryId()
	if id == "" {
		t.Fatalf("FailedStep = %v, want a schedule", resp)
	}

	const n = 5
	var wg sync.WaitGroup
	terms := make([]*retrydv1.AwaitRetryResponse, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { terms[i], errs[i] = ts.client.AwaitRetry(ctx, id) })
	}
	wg.Wait()

	for i := range n {
		if errs[i] != nil {
			t.Fatalf("awaiter %d: %v", i, errs[i])
		}
		st := terms[i].GetStarted()
		if st == nil || st.GetRetryId() != id || st.GetStartedAt() == nil {
			t.Fatalf("awaiter %d got %v, want started", i, terms[i])
		}
		if !proto.Equal(st, terms[0].GetStarted()) {
			t.Errorf("awaiter %d got %v, awaiter 0 got %v: want the same Started", i, st, terms[0].GetStarted())
		}
	}
	if got, want := kindCounts(sessionEvents(t, ts.conn, session)), map[string]int{"scheduled": 1, "started": 1}; !maps.Equal(got, want) {
		t.Errorf("session events by kind = %v, want %v", got, want)
	}
	retrydtest.Verify(t, ts.conn)
}

// TestRecoverCancelsUnderDeadlinePressure runs many Recovers whose
// deadlines end during the backoff. Whichever side notices the deadline
// first (the client's timer or the server's propagated deadline), every
// scheduled retry must be cancelled on the server.
func TestRecoverCancelsUnderDeadlinePressure(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	const n = 100
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		scheduled = make(map[string]bool) // retry ids the clients learned
	)
	for i := range n {
		wg.Go(func() {
			session := fmt.Sprintf("pressure-%d", i)
			timeout := 100*time.Millisecond + time.Duration(i)*2*time.Millisecond
			ctx, cancel := context.WithTimeout(t.Context(), timeout)
			defer cancel()
			out, err := ts.client.Recover(ctx, failedStep(session, 1, 1, backoffPolicy(10_000, 2)))
			if out.Schedule == nil {
				return // the deadline ended the report itself: nothing was awaited
			}
			if !out.Local {
				// A retry decided locally (the server did not answer
				// in time under this load) never reached the server:
				// only the server's own retries must be cancelled there.
				mu.Lock()
				scheduled[out.Schedule.GetRetryId()] = true
				mu.Unlock()
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: Recover error = %v, want context.DeadlineExceeded", session, err)
			}
			if out.Cancelled.GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
				t.Errorf("%s: Cancelled = %v, want the requested cancellation (err %v)", session, out.Cancelled, err)
			}
		})
	}
	wg.Wait()
	for _, ev := range retrydtest.Verify(t, ts.conn) {
		if st := ev.GetStarted(); st != nil {
			t.Errorf("retry %s started", st.GetRetryId())
		}
		if c := ev.GetCancelled(); c.GetReason() == retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
			delete(scheduled, c.GetRetryId())
		}
	}
	for id := range scheduled {
		t.Errorf("retry %s was scheduled and awaited but never cancelled", id)
	}
}
