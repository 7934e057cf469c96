package service_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/admission"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/memory"
	"github.com/retryd/retryd/tenant"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// startLimited starts a server with admission limits, as eachBackend
// does.
func startLimited(t *testing.T, open func(*testing.T, memory.Config) store.Backend, limits admission.Limits) (*harness, *service.Service) {
	t.Helper()
	return startHarness(t, open, harnessOpts{limits: &limits})
}

// admissionTenants are the tenants the admission tests call as.
var admissionTenants = []string{"team-a", "team-b", ""}

// tenantEvents is one tenant's event log.
func tenantEvents(t *testing.T, h *harness, id string) []*retrydv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(metadataCtx(context.Background(), id), 10*time.Second)
	defer cancel()
	evs, err := retrydtest.Events(ctx, h.conn, "")
	if err != nil {
		t.Fatalf("WatchEvents as %q: %v", id, err)
	}
	return evs
}

// allEvents is the whole event log: every test tenant's.
func allEvents(t *testing.T, h *harness) []*retrydv1.Event {
	t.Helper()
	var all []*retrydv1.Event
	for _, id := range admissionTenants {
		all = append(all, tenantEvents(t, h, id)...)
	}
	return all
}

// admissionCounts reads admission control's gauges and refusal counter.
func admissionCounts(t *testing.T, h *harness) (gauges map[string]int64, refused map[string]int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	gauges, refused = map[string]int64{}, map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					gauges[m.Name] += p.Value
				}
			case metricdata.Sum[int64]:
				if m.Name == "retryd.admission.refused" {
					for _, p := range d.DataPoints {
						v, _ := p.Attributes.Value("retryd.admission.bound")
						refused[v.AsString()] += p.Value
					}
				}
			}
		}
	}
	return gauges, refused
}

// settled waits until admission control's counts, which follow the event
// log, show pending retries and open chains: the log lags a start by a
// moment.
func settled(t *testing.T, h *harness, pending, chains int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, _ := admissionCounts(t, h)
		if g["retryd.admission.retries.pending"] == pending && g["retryd.admission.chains.open"] == chains {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("admission counts %v, want %d pending retries and %d open chains", g, pending, chains)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// eachBackendLimited is eachBackend with admission limits: fn runs once
// per store, in parallel, and the invariant checker runs over the log.
func eachBackendLimited(t *testing.T, limits admission.Limits, fn func(t *testing.T, h *harness)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			h, _ := startLimited(t, b.open, limits)
			fn(t, h)
			for _, id := range admissionTenants {
				for _, v := range invariant.Check(tenantEvents(t, h, id)) {
					t.Errorf("invariant violation in tenant %q: %s", id, v)
				}
			}
		})
	}
}

// wantRefused checks that err is admission control's refusal at bound
// (its id), naming subject and the limit, with a one-second RetryInfo.
func wantRefused(t *testing.T, what string, err error, bound, subject, description string, limit int) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Errorf("%s: %v, want RESOURCE_EXHAUSTED", what, err)
		return
	}
	var (
		quota *errdetails.QuotaFailure
		retry *errdetails.RetryInfo
		info  *errdetails.ErrorInfo
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.QuotaFailure:
			quota = d
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.ErrorInfo:
			info = d
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() != time.Second {
		t.Errorf("%s: RetryInfo %v, want a 1s delay", what, retry)
	}
	if n := len(quota.GetViolations()); n != 1 {
		t.Errorf("%s: QuotaFailure %v, want one violation", what, quota)
		return
	}
	v := quota.GetViolations()[0]
	wantDesc := fmt.Sprintf("%s: limit %d reached", description, limit)
	if v.GetSubject() != subject || v.GetDescription() != wantDesc || v.GetQuotaId() != bound || v.GetQuotaValue() != int64(limit) {
		t.Errorf("%s: violation %v, want subject %q, description %q, quota id %s, value %d",
			what, v, subject, wantDesc, bound, limit)
	}
	if info.GetReason() != "LIMIT_REACHED" || info.GetDomain() != "retryd.dev" ||
		info.GetMetadata()["bound"] != bound || info.GetMetadata()["limit"] != fmt.Sprint(limit) {
		t.Errorf("%s: ErrorInfo %v", what, info)
	}
}

// unchanged fails the test when the event log is not before.
func unchanged(t *testing.T, h *harness, what string, before []*retrydv1.Event) {
	t.Helper()
	if after := allEvents(t, h); !slices.EqualFunc(after, before, func(a, b *retrydv1.Event) bool { return proto.Equal(a, b) }) {
		t.Errorf("%s changed the event log: %d events, were %d", what, len(after), len(before))
	}
}

// slow schedules a retry that stays pending for the test's length.
func slow(session string, step uint64) *retrydv1.FailedStepRequest {
	return failure(session, 1, step, "deepseek", "RATE_LIMIT", fast(9_000))
}

// scheduleAs schedules as the given tenant.
func scheduleAs(t *testing.T, h *harness, ctx context.Context, req *retrydv1.FailedStepRequest) *retrydv1.Schedule {
	t.Helper()
	resp, err := h.client.FailedStep(ctx, req)
	if err != nil {
		t.Fatalf("FailedStep(%s turn %d step %d): %v", req.GetSessionId(), req.GetTurn(), req.GetStep(), err)
	}
	s := resp.GetDecision().GetSchedule()
	if s == nil {
		t.Fatalf("FailedStep(%s): want schedule, got %v", req.GetSessionId(), resp.GetDecision())
	}
	return s
}

// openChain schedules a short retry and waits for its start: the chain
// stays open, nothing is pending.
func openChain(t *testing.T, h *harness, ctx context.Context, session, provider string, step uint64) {
	t.Helper()
	s := scheduleAs(t, h, ctx, failure(session, 1, step, provider, "RATE_LIMIT", fast(1)))
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := h.client.AwaitRetry(actx, &retrydv1.AwaitRetryRequest{RetryId: s.GetRetryId()})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("awaiting %s: %v", s.GetRetryId(), err)
		}
		if m.GetStarted() != nil {
			return
		}
	}
}

// TestAdmissionBounds: each bound refuses the call that would pass it with
// RESOURCE_EXHAUSTED, RetryInfo and a QuotaFailure naming the bound, its
// value and its subject, and the refusal records nothing.
func TestAdmissionBounds(t *testing.T) {
	t.Parallel()
	a, b := as("team-a"), as("team-b")
	tests := []struct {
		name   string
		limits admission.Limits
		run    func(t *testing.T, h *harness)
	}{
		{"pending retries per tenant", admission.Limits{PendingRetriesPerTenant: 2}, func(t *testing.T, h *harness) {
			scheduleAs(t, h, a, slow("s1", 1))
			scheduleAs(t, h, a, slow("s2", 1))
			before := allEvents(t, h)
			_, err := h.client.FailedStep(a, slow("s3", 1))
			wantRefused(t, "team-a's third", err, "pending_retries_per_tenant", "tenant:team-a", "pending retries per tenant", 2)
			unchanged(t, h, "the refusal", before)
			if _, err := h.client.GetChains(a, &retrydv1.GetChainsRequest{SessionId: "s3"}); status.Code(err) != codes.NotFound {
				t.Errorf("the refused session exists: %v", err)
			}
			scheduleAs(t, h, b, slow("s3", 1)) // another tenant's own limit
		}},
		{"pending retries", admission.Limits{PendingRetriesPerTenant: 2, PendingRetries: 3}, func(t *testing.T, h *harness) {
			scheduleAs(t, h, a, slow("s1", 1))
			scheduleAs(t, h, a, slow("s2", 1))
			scheduleAs(t, h, b, slow("s1", 1))
			before := allEvents(t, h)
			_, err := h.client.FailedStep(b, slow("s2", 1))
			wantRefused(t, "the server's fourth", err, "pending_retries", "server", "pending retries", 3)
			unchanged(t, h, "the refusal", before)
		}},
		{"open chains per tenant", admission.Limits{OpenChainsPerTenant: 2}, func(t *testing.T, h *harness) {
			openChain(t, h, a, "s1", "deepseek", 1)
			openChain(t, h, a, "s2", "deepseek", 1)
			settled(t, h, 0, 2)
			before := allEvents(t, h)
			_, err := h.client.FailedStep(a, slow("s3", 1))
			wantRefused(t, "a third chain", err, "open_chains_per_tenant", "tenant:team-a", "open chains per tenant", 2)
			_, err = h.client.FailedStep(a, failure("s1", 1, 2, "openai", "RATE_LIMIT", fast(9_000)))
			wantRefused(t, "a second chain in s1", err, "open_chains_per_tenant", "tenant:team-a", "open chains per tenant", 2)
			unchanged(t, h, "the refusals", before)
			// The open chain itself goes on: its retry 2 adds no chain.
			if s := scheduleAs(t, h, a, failure("s1", 1, 2, "deepseek", "RATE_LIMIT", fast(1))); s.GetRetryNumber() != 2 {
				t.Errorf("retry %d in the open chain, want 2", s.GetRetryNumber())
			}
		}},
		{"open chains", admission.Limits{OpenChainsPerTenant: 5, OpenChains: 2}, func(t *testing.T, h *harness) {
			openChain(t, h, a, "s1", "deepseek", 1)
			openChain(t, h, b, "s1", "deepseek", 1)
			before := allEvents(t, h)
			_, err := h.client.FailedStep(b, slow("s2", 1))
			wantRefused(t, "the server's third chain", err, "open_chains", "server", "open chains", 2)
			unchanged(t, h, "the refusal", before)
		}},
		{"active sessions per tenant", admission.Limits{ActiveSessionsPerTenant: 1}, func(t *testing.T, h *harness) {
			openChain(t, h, a, "s1", "deepseek", 1)
			before := allEvents(t, h)
			_, err := h.client.FailedStep(a, slow("s2", 1))
			wantRefused(t, "a second session", err, "active_sessions_per_tenant", "tenant:team-a", "active sessions per tenant", 1)
			unchanged(t, h, "the refusal", before)
			// The active session adds a chain: it is no new session.
			scheduleAs(t, h, a, failure("s1", 1, 2, "openai", "RATE_LIMIT", fast(9_000)))
		}},
		{"awaiters per retry", admission.Limits{AwaitersPerRetry: 1}, func(t *testing.T, h *harness) {
			s := scheduleAs(t, h, a, slow("s1", 1))
			ctx, cancel := context.WithTimeout(a, 20*time.Second)
			defer cancel()
			first := awaitState(t, h, ctx, s.GetRetryId())
			before := allEvents(t, h)
			_, err := awaitOnce(h, ctx, s.GetRetryId())
			wantRefused(t, "a second awaiter", err, "awaiters_per_retry", "retry:"+s.GetRetryId(), "awaiters per retry", 1)
			unchanged(t, h, "the refusal", before)
			if n := latestAwaiters(t, h, a, "s1"); n != 1 {
				t.Errorf("%d awaiters after the refusal, want 1", n)
			}
			// Another tenant's await of that id is the unknown id's
			// NOT_FOUND: the bound does not reveal that the retry exists.
			if _, err := awaitOnce(h, b, s.GetRetryId()); status.Code(err) != codes.NotFound {
				t.Errorf("team-b awaiting team-a's retry: %v, want NotFound", err)
			}
			// Once the first awaiter leaves, another may come.
			cancel()
			first.Recv() //nolint:errcheck // ends with the cancellation
			deadline := time.Now().Add(10 * time.Second)
			for {
				actx, acancel := context.WithTimeout(a, 5*time.Second)
				_, err := awaitOnce(h, actx, s.GetRetryId())
				acancel()
				if err == nil {
					break
				}
				if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
					t.Fatalf("awaiting after the first left: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}},
		{"awaiters", admission.Limits{AwaitersPerRetry: 4, Awaiters: 2}, func(t *testing.T, h *harness) {
			s1 := scheduleAs(t, h, a, slow("s1", 1))
			s2 := scheduleAs(t, h, b, slow("s2", 1))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			awaitState(t, h, metadataCtx(ctx, "team-a"), s1.GetRetryId())
			awaitState(t, h, metadataCtx(ctx, "team-b"), s2.GetRetryId())
			_, err := awaitOnce(h, metadataCtx(ctx, "team-a"), s1.GetRetryId())
			wantRefused(t, "a third awaiter", err, "awaiters", "server", "awaiters", 2)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachBackendLimited(t, tc.limits, tc.run)
		})
	}
}

func metadataCtx(ctx context.Context, tenantID string) context.Context {
	if tenantID == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, testTenantKey, tenantID)
}

// awaitState opens an AwaitRetry stream and reads its state message; the
// stream stays open (an awaiter) until ctx ends.
func awaitState(t *testing.T, h *harness, ctx context.Context, retryID string) retrydv1.RetryService_AwaitRetryClient {
	t.Helper()
	stream, err := h.client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: retryID})
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || m.GetState() == nil {
		t.Fatalf("AwaitRetry(%s): %v %v", retryID, m, err)
	}
	return stream
}

// awaitOnce opens an AwaitRetry stream and returns its first message.
func awaitOnce(h *harness, ctx context.Context, retryID string) (*retrydv1.AwaitRetryResponse, error) {
	stream, err := h.client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: retryID})
	if err != nil {
		return nil, err
	}
	return stream.Recv()
}

// latestAwaiters is the awaiters count the store reports for the
// session's latest retry.
func latestAwaiters(t *testing.T, h *harness, ctx context.Context, session string) uint32 {
	t.Helper()
	chains, err := h.client.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: session})
	if err != nil || len(chains.GetChains()) == 0 {
		t.Fatalf("GetChains(%s): %v %v", session, chains, err)
	}
	return chains.GetChains()[0].GetLatest().GetAwaiters()
}

// TestAdmissionPassesWhatAddsNothing: at the bounds, a call that cannot
// add work is answered as without them: repeats, the engine's own
// refusals, failures the policy delegates — among them the follow-up that
// closes a chain whose budget is used — and StepSucceeded.
func TestAdmissionPassesWhatAddsNothing(t *testing.T) {
	t.Parallel()
	limits := admission.Limits{PendingRetriesPerTenant: 1, OpenChainsPerTenant: 3, ActiveSessionsPerTenant: 2}
	eachBackendLimited(t, limits, func(t *testing.T, h *harness) {
		a := as("team-a")
		oneRetry := fast(1)
		oneRetry.MaxRetries = proto.Uint32(1)
		// s1's chain used its one retry; s0 holds the one pending retry.
		openChain(t, h, a, "s1", "deepseek", 1)
		settled(t, h, 0, 1)
		s1sched := scheduleAs(t, h, a, failure("s1", 2, 1, "openai", "RATE_LIMIT", oneRetry))
		startedAs(t, h, a, s1sched.GetRetryId())
		settled(t, h, 0, 2)
		s0 := slow("s0", 1)
		s0resp, err := h.client.FailedStep(a, s0)
		if err != nil || s0resp.GetDecision().GetSchedule() == nil {
			t.Fatalf("s0: %v %v", s0resp, err)
		}
		// Every bound of team-a is full now: a new session's retryable
		// failure is refused.
		_, err = h.client.FailedStep(a, slow("s2", 1))
		wantRefused(t, "new work", err, "pending_retries_per_tenant", "tenant:team-a", "pending retries per tenant", 1)

		answered := func(what string, req *retrydv1.FailedStepRequest, want retrydv1.DelegateReason) {
			t.Helper()
			resp, err := h.client.FailedStep(a, req)
			if err != nil {
				t.Errorf("%s: %v, want an answer", what, err)
				return
			}
			if got := resp.GetDecision().GetDelegate().GetReason(); got != want {
				t.Errorf("%s: %v, want delegate %v", what, resp.GetDecision(), want)
			}
		}
		// The chain whose budget is used: delegated, and its chain closes.
		answered("s1's follow-up over its budget", failure("s1", 2, 2, "openai", "RATE_LIMIT", oneRetry),
			retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED)
		answered("no provider", failure("s2", 1, 1, "", "SERVER", nil), retrydv1.DelegateReason_DELEGATE_REASON_NO_PROVIDER)
		answered("a code not retried", failure("s3", 1, 1, "deepseek", "INVALID_REQUEST", nil),
			retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE)
		always := failure("s4", 1, 1, "deepseek", "AUTH", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS})
		answered("always mode's first report", always, retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST)
		handled := proto.CloneOf(always)
		handled.Downstream = retrydv1.Downstream_DOWNSTREAM_HANDLED
		answered("always mode, handled downstream", handled, retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED)
		unsafe := slow("s5", 1)
		unsafe.Replay = retrydv1.Replay_REPLAY_UNSAFE
		answered("unsafe to replay", unsafe, retrydv1.DelegateReason_DELEGATE_REASON_REPLAY_UNSAFE)
		late := slow("s6", 1)
		late.Deadline = timestamppb.New(time.Now().Add(time.Second)) // 9 s delay: cannot fit
		answered("past the deadline", late, retrydv1.DelegateReason_DELEGATE_REASON_DEADLINE)
		// The always-mode follow-up that may schedule is new work.
		declined := proto.CloneOf(always)
		declined.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
		_, err = h.client.FailedStep(a, declined)
		wantRefused(t, "always mode, declined", err, "pending_retries_per_tenant", "tenant:team-a", "pending retries per tenant", 1)

		// The pending retry's session: the repeat gets its answer again,
		// a new report the engine's RETRY_PENDING.
		again, err := h.client.FailedStep(a, s0)
		if err != nil || !proto.Equal(again, s0resp) {
			t.Errorf("repeating s0's report: %v %v, want the recorded answer", again, err)
		}
		_, err = h.client.FailedStep(a, slow("s0", 2))
		if code, info := errorInfo(t, err); code != codes.FailedPrecondition || info.GetReason() != "RETRY_PENDING" {
			t.Errorf("a new report in s0: %v, want RETRY_PENDING", err)
		}
		// A success is never refused.
		if _, err := h.client.StepSucceeded(a, &retrydv1.StepSucceededRequest{SessionId: "s1", Turn: 3, Step: 1, Provider: "deepseek"}); err != nil {
			t.Errorf("StepSucceeded: %v", err)
		}
		// Another tenant is not bound by team-a's limits.
		scheduleAs(t, h, as("team-b"), slow("s2", 1))
	})
}

// startedAs awaits a retry's start as ctx's tenant.
func startedAs(t *testing.T, h *harness, ctx context.Context, retryID string) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream := awaitState(t, h, actx, retryID)
	m, err := stream.Recv()
	if err != nil || m.GetStarted() == nil {
		t.Fatalf("awaiting %s: %v %v", retryID, m, err)
	}
}

// TestAdmissionFairness: tenant A floods fresh sessions concurrently; it
// is held at exactly its own limit, every refusal names its tenant bound,
// and tenant B's decisions, made at the same time, all succeed.
func TestAdmissionFairness(t *testing.T) {
	t.Parallel()
	const perTenant, flood, others = 20, 300, 20
	limits := admission.Limits{PendingRetriesPerTenant: perTenant, PendingRetries: 2 * perTenant}
	eachBackendLimited(t, limits, func(t *testing.T, h *harness) {
		a, b := as("team-a"), as("team-b")
		var (
			scheduled, refused atomic.Int64
			wg                 sync.WaitGroup
			next               atomic.Int64
			errs               = make(chan error, 2*flood)
		)
		for range 8 {
			wg.Go(func() {
				for i := next.Add(1); i <= flood; i = next.Add(1) {
					resp, err := h.client.FailedStep(a, slow(fmt.Sprint("a-", i), 1))
					switch {
					case err == nil && resp.GetDecision().GetSchedule() != nil:
						scheduled.Add(1)
					case status.Code(err) == codes.ResourceExhausted:
						refused.Add(1)
						if q := quotaSubject(err); q != "tenant:team-a" {
							errs <- fmt.Errorf("team-a refused for %q, want its own bound", q)
						}
					default:
						errs <- fmt.Errorf("team-a: %v %v", resp, err)
					}
				}
			})
		}
		var bDone atomic.Int64
		wg.Go(func() {
			for i := range others {
				resp, err := h.client.FailedStep(b, slow(fmt.Sprint("b-", i), 1))
				if err != nil || resp.GetDecision().GetSchedule() == nil {
					errs <- fmt.Errorf("team-b's decision %d: %v %v", i, resp, err)
					continue
				}
				bDone.Add(1)
			}
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if scheduled.Load() != perTenant || refused.Load() != flood-perTenant {
			t.Errorf("team-a: %d scheduled, %d refused; want exactly %d and %d", scheduled.Load(), refused.Load(), perTenant, flood-perTenant)
		}
		if bDone.Load() != others {
			t.Errorf("team-b: %d of %d decisions", bDone.Load(), others)
		}
		if _, refusals := admissionCounts(t, h); refusals["pending_retries_per_tenant"] != flood-perTenant || len(refusals) != 1 {
			t.Errorf("retryd.admission.refused by bound: %v, want %d at pending_retries_per_tenant", refusals, flood-perTenant)
		}
		if n := len(allEvents(t, h)); n != perTenant+others {
			t.Errorf("%d events, want one per admitted decision (%d)", n, perTenant+others)
		}
	})
}

func quotaSubject(err error) string {
	for _, d := range status.Convert(err).Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.GetViolations()) > 0 {
			return q.GetViolations()[0].GetSubject()
		}
	}
	return ""
}

// heapLive is the live heap once it has settled: the bytes of the
// objects a full collection kept (runtime.GC returns once they are
// swept). Not HeapInuse, the bytes of spans with any object in them:
// objects that earlier tests left scattered over spans keep those spans
// in use, and new objects then fill the free slots between them without
// growing it. It collects until two readings in a row agree within
// 64 KiB, so that what the previous test's goroutines still held while
// they wound down is gone from this reading, not from the next one (as
// far as 200 ms of waiting can tell).
func heapLive() uint64 {
	const settled = 64 << 10
	read := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	last := read()
	for range 20 {
		time.Sleep(10 * time.Millisecond)
		now := read()
		if max(now, last)-min(now, last) < settled {
			return now
		}
		last = now
	}
	return last
}

// TestAdmissionFlood drives 50 000 FailedSteps over fresh sessions (5 000
// with -short) against a bound of 2 000 pending retries: exactly 2 000 are
// decided, every other call is RESOURCE_EXHAUSTED and records nothing,
// and the heap stays flat while the refusals go on. Not parallel: the heap
// is measured for the whole process, so nothing else may run meanwhile.
func TestAdmissionFlood(t *testing.T) {
	const bound = 2_000
	total := 50_000
	if testing.Short() {
		total = 5_000
	}
	const maxGrowth = 10 << 20
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			h, svc := startLimited(t, b.open, admission.Limits{PendingRetriesPerTenant: bound, PendingRetries: 2 * bound})
			// The calls go to the service in this process: what is
			// measured is the service and its store, not gRPC's buffers.
			ctx := tenant.NewContext(context.Background(), &tenant.Tenant{ID: "team-a"})
			var next, scheduled, refused atomic.Int64
			var failed atomic.Value
			drive := func(upto int64) {
				var wg sync.WaitGroup
				for range 8 {
					wg.Go(func() {
						for i := next.Add(1); i <= upto; i = next.Add(1) {
							resp, err := svc.FailedStep(ctx, slow(fmt.Sprint("flood-", i), 1))
							switch {
							case err == nil && resp.GetDecision().GetSchedule() != nil:
								scheduled.Add(1)
							case status.Code(err) == codes.ResourceExhausted:
								refused.Add(1)
							default:
								failed.CompareAndSwap(nil, fmt.Errorf("call %d: %v %v", i, resp, err))
							}
						}
					})
				}
				wg.Wait()
				next.Store(upto)
			}
			// Warm up the connection, the policy cache and the pools with
			// the calls that fill the bound, in quarters. What one held
			// retry costs is the largest growth of the last three quarters
			// (the first carries the warm-up). Memory that earlier tests
			// still held can be freed during any quarter, even after a
			// settled reading (in CI, 1.5 and 3.5 MiB went while the bound
			// filled), and a free only lowers a quarter's growth.
			base := heapLive()
			quarters := make([]int64, 4)
			last := base
			for q := range int64(4) {
				drive((q + 1) * bound / 4)
				now := heapLive()
				quarters[q] = int64(now) - int64(last)
				last = now
			}
			filled := last
			perHeld := slices.Max(quarters[1:]) / (bound / 4)
			start := time.Now()
			drive(int64(total))
			took := time.Since(start)
			after := heapLive()
			if err, _ := failed.Load().(error); err != nil {
				t.Fatal(err)
			}
			if scheduled.Load() != bound || refused.Load() != int64(total-bound) {
				t.Fatalf("%d scheduled, %d refused; want exactly %d and %d", scheduled.Load(), refused.Load(), bound, total-bound)
			}
			if n := len(allEvents(t, h)); n != bound {
				t.Errorf("%d events, want %d: a refusal recorded something", n, bound)
			}
			growth := int64(after) - int64(filled)
			t.Logf("%s: %d refusals in %v; heap %.1f MiB → %.1f MiB holding %d retries (quarters %v B: ≈ %d B each, so unbounded, %d sessions would hold ≈ %.0f MiB) → %.1f MiB after the refusals (%+.2f MiB)",
				b.name, total-bound, took.Round(time.Millisecond), mib(base), mib(filled), bound, quarters, perHeld, total, float64(perHeld)*float64(total)/(1<<20), mib(after), float64(growth)/(1<<20))
			if growth > maxGrowth {
				t.Errorf("heap grew by %.1f MiB during %d refusals, want < %d MiB", float64(growth)/(1<<20), total-bound, maxGrowth>>20)
			}
			// The bound is one a leak breaks: holding what was refused
			// would have grown the heap far beyond it.
			if !testing.Short() && perHeld*int64(total-bound) < 2*maxGrowth {
				t.Errorf("holding the %d refused calls would take only ≈ %d MiB: the heap bound would not catch it", total-bound, perHeld*int64(total-bound)>>20)
			}
			if _, refusals := admissionCounts(t, h); refusals["pending_retries_per_tenant"] != int64(total-bound) {
				t.Errorf("retryd.admission.refused: %v, want %d at pending_retries_per_tenant", refusals, total-bound)
			}
		})
	}
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }
