package service_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestScheduleAwaitStarted(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		before := time.Now()
		resp := h.fail(failure("s", 1, 1, "deepseek", "RATE_LIMIT", fast(40)))
		s := resp.GetDecision().GetSchedule()
		if s == nil {
			t.Fatalf("want schedule, got %v", resp.GetDecision())
		}
		if s.GetRetryNumber() != 1 || s.GetMaxRetries() != 2 || s.MaxRetries == nil {
			t.Errorf("retry %d of %v, want 1 of 2", s.GetRetryNumber(), s.MaxRetries)
		}
		if s.GetDelayMs() != 40 || s.GetDelaySource() != retrydv1.DelaySource_DELAY_SOURCE_BACKOFF {
			t.Errorf("delay %d from %v, want exactly 40 from backoff", s.GetDelayMs(), s.GetDelaySource())
		}
		if !strings.HasPrefix(s.GetPolicyKey(), "normal;max=2;") || s.GetMode() != retrydv1.Mode_MODE_NORMAL {
			t.Errorf("policy key %q mode %v", s.GetPolicyKey(), s.GetMode())
		}
		if ev := resp.GetEvent(); ev.GetScheduled().GetRetryId() != s.GetRetryId() || ev.GetSequence() == 0 {
			t.Errorf("event %v does not record the schedule", ev)
		}
		state, term := h.await(context.Background(), s.GetRetryId())
		if state.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			t.Errorf("first message status %v, want pending", state.GetStatus())
		}
		st := term.GetStarted()
		if st == nil {
			t.Fatalf("want started, got %v", term)
		}
		if st.GetRetryId() != s.GetRetryId() || st.GetTurn() != 1 || st.GetStep() != 1 || st.GetRetryNumber() != 1 {
			t.Errorf("started %v does not name the scheduled retry", st)
		}
		if got := st.GetStartedAt().AsTime(); got.Before(s.GetDueAt().AsTime()) || got.Sub(before) < 40*time.Millisecond {
			t.Errorf("started at %v, before due %v", got, s.GetDueAt().AsTime())
		}
		// Awaiting a terminal retry answers the recorded terminal at once.
		state, term = h.await(context.Background(), s.GetRetryId())
		if state.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_STARTED || !proto.Equal(term.GetStarted(), st) {
			t.Errorf("re-await: state %v terminal %v, want the recorded start %v", state.GetStatus(), term, st)
		}
	})
}

func TestDelegateReasons(t *testing.T) {
	t.Parallel()
	always := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS}
	tests := []struct {
		name   string
		req    *retrydv1.FailedStepRequest
		reason retrydv1.DelegateReason
	}{
		{"no provider", failure("s", 1, 1, "", "SERVER", nil), retrydv1.DelegateReason_DELEGATE_REASON_NO_PROVIDER},
		{"budget of zero", failure("s", 1, 1, "p", "SERVER", &retrydv1.RetryPolicy{MaxRetries: proto.Uint32(0)}),
			retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED},
		{"code not retryable", failure("s", 1, 1, "p", "INVALID_REQUEST", nil), retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE},
		{"aborted in always mode", failure("s", 1, 1, "p", "ABORTED", always), retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE},
		{"downstream first", failure("s", 1, 1, "p", "AUTH", always), retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST},
		{"downstream handled", func() *retrydv1.FailedStepRequest {
			r := failure("s", 1, 1, "p", "AUTH", always)
			r.Downstream = retrydv1.Downstream_DOWNSTREAM_HANDLED
			return r
		}(), retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED},
		{"retry-after over cap", func() *retrydv1.FailedStepRequest {
			r := failure("s", 1, 1, "p", "RATE_LIMIT", nil)
			r.Failure.ProviderRetryAfterMs = proto.Int64(60_000)
			return r
		}(), retrydv1.DelegateReason_DELEGATE_REASON_RETRY_AFTER_OVER_CAP},
		{"deadline", func() *retrydv1.FailedStepRequest {
			r := failure("s", 1, 1, "p", "SERVER", fast(500))
			r.Deadline = timestamppb.New(time.Now().Add(550 * time.Millisecond))
			return r
		}(), retrydv1.DelegateReason_DELEGATE_REASON_DEADLINE},
		{"replay unsafe", func() *retrydv1.FailedStepRequest {
			r := failure("s", 1, 1, "p", "SERVER", nil)
			r.Replay = retrydv1.Replay_REPLAY_UNSAFE
			return r
		}(), retrydv1.DelegateReason_DELEGATE_REASON_REPLAY_UNSAFE},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
				resp := h.fail(tt.req)
				d := resp.GetDecision().GetDelegate()
				if d.GetReason() != tt.reason || d.GetDetail() == "" {
					t.Fatalf("decision %v, want delegate %v with a detail", resp.GetDecision(), tt.reason)
				}
				if ev := resp.GetEvent().GetDelegated(); ev.GetReason() != tt.reason {
					t.Errorf("event %v does not record the delegation", resp.GetEvent())
				}
			})
		})
	}
}

func TestChainNumbering(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		p := fast(5)
		// Retry 1 and 2 of the deepseek chain, each started before the next failure.
		s1 := h.schedule(failure("s", 1, 1, "deepseek", "SERVER", p))
		h.start(s1.GetRetryId())
		s2 := h.schedule(failure("s", 2, 2, "deepseek", "TIMEOUT", p))
		if s2.GetRetryNumber() != 2 || s2.GetDelayMs() != 10 {
			t.Errorf("second retry: number %d delay %d, want 2 and 10", s2.GetRetryNumber(), s2.GetDelayMs())
		}
		h.start(s2.GetRetryId())
		// Another provider, or another policy key, numbers on its own.
		o := h.schedule(failure("s", 3, 3, "openai", "SERVER", p))
		if o.GetRetryNumber() != 1 {
			t.Errorf("other provider starts at %d, want 1", o.GetRetryNumber())
		}
		h.start(o.GetRetryId())
		k := h.schedule(failure("s", 4, 4, "deepseek", "SERVER", fast(6)))
		if k.GetRetryNumber() != 1 || k.GetPolicyKey() == s1.GetPolicyKey() {
			t.Errorf("other policy key: number %d key %q, want 1 and a new key", k.GetRetryNumber(), k.GetPolicyKey())
		}
		h.start(k.GetRetryId())
		// The deepseek chain's budget of 2 is used: exhausted, and the chain closes.
		resp := h.fail(failure("s", 5, 5, "deepseek", "SERVER", p))
		if r := resp.GetDecision().GetDelegate().GetReason(); r != retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED {
			t.Fatalf("third failure: %v, want budget_exhausted", resp.GetDecision())
		}
		// A closed chain starts again at 1.
		again := h.schedule(failure("s", 6, 6, "deepseek", "SERVER", p))
		if again.GetRetryNumber() != 1 {
			t.Errorf("after exhaustion: retry %d, want 1", again.GetRetryNumber())
		}
		h.start(again.GetRetryId())
		// StepSucceeded closes every open chain of the session.
		succ, err := h.client.StepSucceeded(context.Background(), &retrydv1.StepSucceededRequest{SessionId: "s", Turn: 7, Step: 7, Provider: "deepseek"})
		if err != nil {
			t.Fatal(err)
		}
		if len(succ.GetClosed()) != 3 {
			t.Errorf("StepSucceeded closed %d chains, want 3 (deepseek x2 keys, openai): %v", len(succ.GetClosed()), succ.GetClosed())
		}
		after := h.schedule(failure("s", 8, 8, "openai", "SERVER", p))
		if after.GetRetryNumber() != 1 {
			t.Errorf("after success: retry %d, want 1", after.GetRetryNumber())
		}
		h.start(after.GetRetryId())

		chains, err := h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: "s"})
		if err != nil {
			t.Fatal(err)
		}
		if chains.GetTurn() != 8 || chains.GetStep() != 8 || len(chains.GetChains()) != 3 {
			t.Errorf("GetChains: turn %d step %d, %d chains; want 8, 8, 3", chains.GetTurn(), chains.GetStep(), len(chains.GetChains()))
		}
		for _, c := range chains.GetChains() {
			if open := c.GetProvider() == "openai"; c.GetOpen() != open {
				t.Errorf("chain %s %s open=%v", c.GetProvider(), c.GetPolicyKey(), c.GetOpen())
			}
		}
	})
}

func TestUniqueStepRecords(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		req := failure("s", 3, 7, "deepseek", "SERVER", fast(5_000))
		first := h.fail(req)
		again := h.fail(proto.Clone(req).(*retrydv1.FailedStepRequest))
		if !proto.Equal(first, again) {
			t.Errorf("re-report answered differently:\n%v\n%v", first, again)
		}
		retryID := first.GetDecision().GetSchedule().GetRetryId()

		changed := proto.Clone(req).(*retrydv1.FailedStepRequest)
		changed.Failure.Code = "TIMEOUT"
		_, err := h.client.FailedStep(context.Background(), changed)
		if code, info := errorInfo(t, err); code != codes.FailedPrecondition || info.GetReason() != "STEP_RECORD_CONFLICT" {
			t.Errorf("same step, other content: %v %v, want FAILED_PRECONDITION STEP_RECORD_CONFLICT", code, info)
		}
		_, err = h.client.FailedStep(context.Background(), failure("s", 4, 8, "deepseek", "SERVER", nil))
		if code, info := errorInfo(t, err); code != codes.FailedPrecondition || info.GetReason() != "RETRY_PENDING" ||
			info.GetMetadata()["retry_id"] != retryID || !strings.Contains(status.Convert(err).Message(), retryID) {
			t.Errorf("new failure while pending: %v %v, want RETRY_PENDING naming %s", code, info, retryID)
		}
		if _, err := h.client.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: retryID}}); err != nil {
			t.Fatal(err)
		}
		_, err = h.client.FailedStep(context.Background(), failure("s", 3, 6, "deepseek", "SERVER", nil))
		if code, info := errorInfo(t, err); code != codes.FailedPrecondition || info.GetReason() != "STALE_STEP" {
			t.Errorf("older step: %v %v, want FAILED_PRECONDITION STALE_STEP", code, info)
		}
		_, err = h.client.StepSucceeded(context.Background(), &retrydv1.StepSucceededRequest{SessionId: "s", Turn: 2, Step: 9})
		if code, info := errorInfo(t, err); code != codes.FailedPrecondition || info.GetReason() != "STALE_STEP" {
			t.Errorf("older success: %v %v, want STALE_STEP", code, info)
		}
		// The refused reports left no trace in the log.
		evs := h.events("s")
		if len(evs) != 3 { // scheduled, cancelled, closed
			t.Errorf("event log has %d events, want 3: %v", len(evs), evs)
		}
	})
}

func TestAlwaysModeDownstreamHandshake(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		p := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS, Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(5), JitterRatio: proto.Float64(0)}}
		for step := uint64(1); step <= 4; step++ {
			req := failure("s", step, step, "deepseek", "AUTH", p)
			if d := h.fail(req).GetDecision().GetDelegate(); d.GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST {
				t.Fatalf("step %d not asked: %v, want downstream_first", step, d)
			}
			req.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
			s := h.schedule(req)
			if s.GetRetryNumber() != uint32(step) || s.MaxRetries != nil || s.GetDelayMs() != 5<<(step-1) {
				t.Errorf("step %d: retry %d max %v delay %d; want %d, unlimited, %d",
					step, s.GetRetryNumber(), s.MaxRetries, s.GetDelayMs(), step, 5<<(step-1))
			}
			h.start(s.GetRetryId())
		}
		handled := failure("s", 5, 5, "deepseek", "AUTH", p)
		handled.Downstream = retrydv1.Downstream_DOWNSTREAM_HANDLED
		if d := h.fail(handled).GetDecision().GetDelegate(); d.GetReason() != retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED {
			t.Errorf("handled: %v", d)
		}
		// An open delegation is cancelled with the session; its follow-up is refused.
		open := failure("s", 6, 6, "deepseek", "AUTH", p)
		h.fail(open)
		resp, err := h.client.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "s"}})
		if err != nil || resp.GetDelegationsCancelled() != 1 {
			t.Fatalf("CancelRetries(session): %v %v, want one delegation cancelled", resp, err)
		}
		open.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
		_, err = h.client.FailedStep(context.Background(), open)
		if code, info := errorInfo(t, err); code != codes.FailedPrecondition || info.GetReason() != "DELEGATION_CANCELLED" {
			t.Errorf("declined after cancel: %v %v, want DELEGATION_CANCELLED", code, info)
		}
	})
}

func TestScheduleModeAndTail(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		p := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{3, 6, 9}, TailDelayMs: proto.Uint64(12)}
		want := []struct {
			delay  uint64
			source retrydv1.DelaySource
		}{
			{3, retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE}, {6, retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE},
			{9, retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE}, {12, retrydv1.DelaySource_DELAY_SOURCE_TAIL},
			{12, retrydv1.DelaySource_DELAY_SOURCE_TAIL},
		}
		for i, w := range want {
			step := uint64(i + 1)
			s := h.schedule(failure("s", step, step, "relay", "HTTP_404", p))
			if s.GetRetryNumber() != uint32(step) || s.GetDelayMs() != w.delay || s.GetDelaySource() != w.source || s.MaxRetries != nil {
				t.Errorf("retry %d: %d ms from %v (max %v), want %d ms from %v, unlimited",
					s.GetRetryNumber(), s.GetDelayMs(), s.GetDelaySource(), s.MaxRetries, w.delay, w.source)
			}
			h.start(s.GetRetryId())
		}
	})
}

func TestProviderRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		ms      *int64
		header  func() *string
		wantMin uint64
		wantMax uint64
		source  retrydv1.DelaySource
	}{
		{"milliseconds", proto.Int64(1500), nil, 1500, 1500, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER},
		{"delta seconds header", nil, constant("2"), 2000, 2000, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER},
		{"http date header", nil, func() *string {
			return proto.String(time.Now().Add(5 * time.Second).UTC().Format(http.TimeFormat))
		}, 3000, 5000, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER},
		{"malformed header is ignored", nil, constant("soon"), 100, 100, retrydv1.DelaySource_DELAY_SOURCE_BACKOFF},
		{"negative ms is ignored", proto.Int64(-5), nil, 100, 100, retrydv1.DelaySource_DELAY_SOURCE_BACKOFF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
				req := failure("s", 1, 1, "p", "RATE_LIMIT", fast(100))
				req.Failure.ProviderRetryAfterMs = tt.ms
				if tt.header != nil {
					req.Failure.RetryAfter = tt.header()
				}
				s := h.schedule(req)
				if s.GetDelayMs() < tt.wantMin || s.GetDelayMs() > tt.wantMax || s.GetDelaySource() != tt.source {
					t.Errorf("delay %d from %v, want [%d, %d] from %v", s.GetDelayMs(), s.GetDelaySource(), tt.wantMin, tt.wantMax, tt.source)
				}
				h.cancelRetry(s.GetRetryId())
			})
		})
	}
}

func constant(s string) func() *string { return func() *string { return &s } }

func (h *harness) cancelRetry(id string) *retrydv1.RetryState {
	h.t.Helper()
	resp, err := h.client.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{
		Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: id}})
	if err != nil {
		h.t.Fatalf("CancelRetries(%s): %v", id, err)
	}
	if len(resp.GetRetries()) != 1 {
		h.t.Fatalf("CancelRetries(%s): %d states", id, len(resp.GetRetries()))
	}
	return resp.GetRetries()[0]
}

func TestCancel(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		s := h.schedule(failure("s", 1, 1, "p", "SERVER", fast(10_000)))
		got := make(chan *retrydv1.AwaitRetryResponse, 3)
		for range 3 {
			go func() {
				_, term := h.await(context.Background(), s.GetRetryId())
				got <- term
			}()
		}
		waitAwaiters(t, h, s.GetRetryId(), 3)
		st := h.cancelRetry(s.GetRetryId())
		if st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_CANCELLED ||
			st.GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
			t.Errorf("cancel: %v", st)
		}
		for range 3 {
			if c := (<-got).GetCancelled(); c.GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED || c.GetRetryId() != s.GetRetryId() {
				t.Errorf("awaiter got %v, want cancelled(requested)", c)
			}
		}
		again := h.cancelRetry(s.GetRetryId())
		again.Awaiters, st.Awaiters = 0, 0 // awaiters come and go; the rest must not change
		if !proto.Equal(again, st) {
			t.Errorf("second cancel changed the state: %v vs %v", again, st)
		}
		// Cancelling a started retry is a no-op that reports it started.
		s2 := h.schedule(failure("s", 2, 2, "p", "SERVER", fast(5)))
		started := h.start(s2.GetRetryId())
		if st := h.cancelRetry(s2.GetRetryId()); st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_STARTED || !proto.Equal(st.GetStarted(), started) {
			t.Errorf("cancel after start: %v", st)
		}
		_, err := h.client.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: "NOSUCHRETRY"}})
		if status.Code(err) != codes.NotFound {
			t.Errorf("unknown retry: %v, want NOT_FOUND", err)
		}
		stream, err := h.client.AwaitRetry(context.Background(), &retrydv1.AwaitRetryRequest{RetryId: "NOSUCHRETRY"})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.NotFound {
			t.Errorf("await unknown retry: %v, want NOT_FOUND", err)
		}
	})
}

// waitAwaiters polls GetChains until the retry has n connected awaiters.
func waitAwaiters(t *testing.T, h *harness, retryID string, n uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		chains, err := h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: "s"})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chains.GetChains() {
			if l := c.GetLatest(); l.GetRetryId() == retryID && l.GetAwaiters() >= n {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("retry %s never had %d awaiters", retryID, n)
}

func TestAbandoned(t *testing.T) {
	t.Parallel()
	// The grace must cover a durable store's commit between the second
	// decision and its await, or the second retry is abandoned too.
	eachBackend(t, harnessOpts{abandonGrace: 300 * time.Millisecond}, func(t *testing.T, h *harness) {
		s := h.schedule(failure("s", 1, 1, "p", "SERVER", fast(10)))
		deadline := time.Now().Add(10 * time.Second)
		for {
			chains, err := h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: "s"})
			if err != nil {
				t.Fatal(err)
			}
			if l := chains.GetChains()[0].GetLatest(); l.GetStatus() == retrydv1.RetryStatus_RETRY_STATUS_CANCELLED {
				if l.GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_ABANDONED {
					t.Fatalf("cancelled for %v, want abandoned", l.GetCancelled().GetReason())
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("retry never abandoned")
			}
			time.Sleep(10 * time.Millisecond)
		}
		state, term := h.await(context.Background(), s.GetRetryId())
		if state.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_CANCELLED || term.GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_ABANDONED {
			t.Errorf("await after abandon: %v %v", state, term)
		}
		// The abandoned chain closed: the next failure starts at retry 1.
		if s2 := h.schedule(failure("s", 2, 2, "p", "SERVER", fast(10))); s2.GetRetryNumber() != 1 {
			t.Errorf("after abandon: retry %d, want 1", s2.GetRetryNumber())
		} else {
			h.start(s2.GetRetryId())
		}
	})
}

func TestSeveralAwaitersShareOneStart(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		s := h.schedule(failure("s", 1, 1, "p", "SERVER", fast(100)))
		var wg sync.WaitGroup
		starts := make([]*retrydv1.RetryStarted, 8)
		for i := range starts {
			wg.Go(func() { starts[i] = h.start(s.GetRetryId()) })
		}
		wg.Wait()
		for i, st := range starts[1:] {
			if !proto.Equal(st, starts[0]) {
				t.Errorf("awaiter %d got %v, awaiter 0 got %v", i+1, st, starts[0])
			}
		}
		n := 0
		for _, ev := range h.events("s") {
			if ev.GetStarted() != nil {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d started events, want exactly 1", n)
		}
	})
}

func TestCancelRacingStart(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		for i := range 40 {
			session := fmt.Sprintf("race-%d", i)
			s := h.schedule(failure(session, 1, 1, "p", "SERVER", fast(2)))
			var wg sync.WaitGroup
			terms := make([]*retrydv1.AwaitRetryResponse, 3)
			for j := range terms {
				wg.Go(func() { _, terms[j] = h.await(context.Background(), s.GetRetryId()) })
			}
			var final *retrydv1.RetryState
			wg.Go(func() {
				time.Sleep(time.Duration(i%4) * time.Millisecond)
				final = h.cancelRetry(s.GetRetryId())
			})
			wg.Wait()
			for j, term := range terms {
				if (term.GetStarted() != nil) != (final.GetStatus() == retrydv1.RetryStatus_RETRY_STATUS_STARTED) {
					t.Errorf("session %s awaiter %d got %v but the retry ended %v", session, j, term, final.GetStatus())
				}
			}
		}
	})
}

func TestManySessionsInParallel(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Go(func() {
				session := fmt.Sprintf("par-%d", i)
				p := fast(1)
				for step := uint64(1); step <= 6; step++ {
					resp, err := h.client.FailedStep(context.Background(), failure(session, step, step, "p", "SERVER", p))
					if err != nil {
						t.Errorf("%s step %d: %v", session, step, err)
						return
					}
					if s := resp.GetDecision().GetSchedule(); s != nil {
						want := uint32(step)
						if step > 3 {
							want = uint32(step - 3)
						}
						if s.GetRetryNumber() != want {
							t.Errorf("%s step %d: retry %d, want %d", session, step, s.GetRetryNumber(), want)
						}
						h.start(s.GetRetryId())
					}
				}
			})
		}
		wg.Wait()
	})
}

func TestWatchEvents(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		a := h.schedule(failure("a", 1, 1, "p", "SERVER", fast(1)))
		h.start(a.GetRetryId())
		h.fail(failure("b", 1, 1, "", "SERVER", nil))
		all := h.events("")
		if len(all) != 3 {
			t.Fatalf("%d events, want 3 (scheduled, started, delegated)", len(all))
		}
		for i, ev := range all {
			switch {
			case h.gapless && ev.GetSequence() != uint64(i+1):
				t.Errorf("event %d has sequence %d, want %d", i, ev.GetSequence(), i+1)
			case i > 0 && ev.GetSequence() <= all[i-1].GetSequence():
				t.Errorf("event %d has sequence %d, after %d", i, ev.GetSequence(), all[i-1].GetSequence())
			}
		}
		if only := h.events("b"); len(only) != 1 || only[0].GetDelegated() == nil {
			t.Errorf("session filter: %v", only)
		}
		// Resume after a sequence, and follow new events as they happen.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stream, err := h.client.WatchEvents(ctx, &retrydv1.WatchEventsRequest{AfterSequence: all[1].GetSequence()})
		if err != nil {
			t.Fatal(err)
		}
		first, err := stream.Recv()
		if err != nil || !proto.Equal(first.GetEvent(), all[2]) {
			t.Fatalf("resume after the second event: %v %v, want %v", first, err, all[2])
		}
		h.fail(failure("c", 1, 1, "", "SERVER", nil))
		next, err := stream.Recv()
		if err != nil || next.GetEvent().GetSequence() <= all[2].GetSequence() || next.GetEvent().GetSessionId() != "c" {
			t.Fatalf("follow: %v %v", next, err)
		}
	})
}

func TestNamedAndProviderPolicies(t *testing.T) {
	t.Parallel()
	const file = `
policies:
  relay:
    mode: schedule
    schedule: [7, 8]
    tailDelayMs: 9
providers:
  deepseek:
    retryPolicy:
      mode: always
      backoff: {initialDelayMs: 11, maxDelayMs: 30000, jitterRatio: 0}
`
	eachBackend(t, harnessOpts{policies: file}, func(t *testing.T, h *harness) {
		named := failure("s", 1, 1, "any", "HTTP_429", nil)
		named.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "relay"}
		s := h.schedule(named)
		if s.GetMode() != retrydv1.Mode_MODE_SCHEDULE || s.GetDelayMs() != 7 {
			t.Errorf("named policy: %v", s)
		}
		h.start(s.GetRetryId())
		prov := failure("s", 2, 2, "deepseek", "AUTH", nil)
		prov.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
		if s := h.schedule(prov); s.GetMode() != retrydv1.Mode_MODE_ALWAYS || s.GetDelayMs() != 11 {
			t.Errorf("provider policy: %v", s)
		} else {
			h.start(s.GetRetryId())
		}
		// The inline policy wins over the provider's.
		inline := failure("s", 3, 3, "deepseek", "SERVER", fast(13))
		if s := h.schedule(inline); s.GetMode() != retrydv1.Mode_MODE_NORMAL || s.GetDelayMs() != 13 {
			t.Errorf("inline policy: %v", s)
		} else {
			h.start(s.GetRetryId())
		}
		unknown := failure("s", 4, 4, "p", "SERVER", nil)
		unknown.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "nope"}
		_, err := h.client.FailedStep(context.Background(), unknown)
		if status.Code(err) != codes.InvalidArgument || badFields(err)["policy_name"] == "" {
			t.Errorf("unknown policy name: %v", err)
		}
	})
}
