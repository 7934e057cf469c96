package file_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// received is what the agents were told, as the crash test records it.
type received struct {
	mu sync.Mutex
	// last is each session's last answered FailedStep, unless a later
	// report of the session was left unanswered by the crash.
	last map[string]answered
	// scheduled are the schedule decisions by retry id.
	scheduled map[string]*retrydv1.Schedule
	sessionOf map[string]string
	// started and cancelled are the terminal messages agents received.
	started   map[string]*retrydv1.RetryStarted
	cancelled map[string]*retrydv1.RetryCancelled
	// pending are retries an agent left waiting (due long after the crash).
	pending map[string]bool
}

type answered struct {
	req  *retrydv1.FailedStepRequest
	resp *retrydv1.FailedStepResponse
	ok   bool // no later report of the session is unanswered
}

func (r *received) decided(req *retrydv1.FailedStepRequest, resp *retrydv1.FailedStepResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[req.GetSessionId()] = answered{req: req, resp: resp, ok: true}
	if s := resp.GetDecision().GetSchedule(); s != nil {
		r.scheduled[s.GetRetryId()] = s
		r.sessionOf[s.GetRetryId()] = req.GetSessionId()
	}
}

func (r *received) unanswered(session string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.last[session]
	a.ok = false
	r.last[session] = a
}

// agent is one goroutine of the load: sessions one after another, each a
// few failed steps whose retries it awaits, cancels (by id or by session),
// or leaves pending.
func agent(ctx context.Context, t *testing.T, client retrydv1.RetryServiceClient, n int, rec *received, killed *atomic.Bool, ops *atomic.Int64) {
	rnd := mrand.New(mrand.NewPCG(uint64(n), 42))
	check := func(what string, err error) bool {
		if err == nil {
			return true
		}
		if !killed.Load() && ctx.Err() == nil {
			t.Errorf("agent %d: %s: %v", n, what, err)
		}
		return false
	}
	for k := 0; ; k++ {
		session := fmt.Sprintf("agent%d-session%d", n, k)
		for step := uint64(1); step <= 4; step++ {
			if ctx.Err() != nil {
				return
			}
			action := rnd.IntN(10)
			delay := uint64(5 + rnd.IntN(20)) // awaited: due within the test
			if action >= 6 {
				delay = 600_000 // cancelled or left pending: due long after the test
			}
			req := &retrydv1.FailedStepRequest{
				SessionId: session, Turn: 1, Step: step, Provider: "p",
				Failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429},
				PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
					MaxRetries: proto.Uint32(3),
					Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(delay), MaxDelayMs: proto.Uint64(delay),
						JitterRatio: proto.Float64(0.1)},
				}},
			}
			rec.unanswered(session)
			resp, err := client.FailedStep(ctx, req)
			if !check("FailedStep", err) {
				return
			}
			ops.Add(1)
			rec.decided(req, resp)
			s := resp.GetDecision().GetSchedule()
			if s == nil {
				break // exhausted: the next session
			}
			switch {
			case action < 6:
				st, term, err := await(ctx, client, s.GetRetryId())
				if !check("AwaitRetry", err) {
					return
				}
				if st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING || term.GetStarted() == nil {
					t.Errorf("agent %d: await %s: %v then %v", n, s.GetRetryId(), st, term)
					return
				}
				rec.mu.Lock()
				rec.started[s.GetRetryId()] = term.GetStarted()
				rec.mu.Unlock()
			case action < 8:
				var target *retrydv1.CancelRetriesRequest
				if action == 6 {
					target = &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: s.GetRetryId()}}
				} else {
					target = &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: session}}
				}
				resp, err := client.CancelRetries(ctx, target)
				if !check("CancelRetries", err) {
					return
				}
				ops.Add(1)
				if len(resp.GetRetries()) != 1 || resp.GetRetries()[0].GetCancelled() == nil {
					t.Errorf("agent %d: cancel %s: %v", n, s.GetRetryId(), resp)
					return
				}
				rec.mu.Lock()
				rec.cancelled[s.GetRetryId()] = resp.GetRetries()[0].GetCancelled()
				rec.mu.Unlock()
			default:
				rec.mu.Lock()
				rec.pending[s.GetRetryId()] = true
				rec.mu.Unlock()
				step = 99 // leave it: the next session
			}
		}
	}
}

// await reads an AwaitRetry stream to its end.
func await(ctx context.Context, client retrydv1.RetryServiceClient, id string) (*retrydv1.RetryState, *retrydv1.AwaitRetryResponse, error) {
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id})
	if err != nil {
		return nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	term, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("after the terminal message: %v", err)
	}
	return first.GetState(), term, nil
}

// stateOf reads only the state message of AwaitRetry, then leaves, so a
// pending retry is not started by the look.
func stateOf(t *testing.T, client retrydv1.RetryServiceClient, id string) *retrydv1.RetryState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id})
	if err != nil {
		t.Fatalf("AwaitRetry %s: %v", id, err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("AwaitRetry %s after the restart: %v", id, err)
	}
	return first.GetState()
}

// TestKillNineKeepsEveryDecision runs concurrent FailedStep, AwaitRetry and
// CancelRetries traffic against the real binary on a file store, kills it
// with SIGKILL in the middle, restarts it on the same directory and checks
// that every answer an agent received is still there, unchanged.
func TestKillNineKeepsEveryDecision(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs the binary under load for seconds")
	}
	t.Parallel()
	dir := t.TempDir()
	srv := retrydtest.Start(t, "--store", "file:"+dir)
	client := retrydv1.NewRetryServiceClient(srv.Conn(t))

	rec := &received{
		last: map[string]answered{}, scheduled: map[string]*retrydv1.Schedule{}, sessionOf: map[string]string{},
		started: map[string]*retrydv1.RetryStarted{}, cancelled: map[string]*retrydv1.RetryCancelled{},
		pending: map[string]bool{},
	}
	var killed atomic.Bool
	var ops atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for n := range 12 {
		wg.Go(func() { agent(ctx, t, client, n, rec, &killed, &ops) })
	}
	time.Sleep(2 * time.Second)
	killed.Store(true)
	if err := srv.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = srv.Wait(10 * time.Second)
	stop()
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	inFlight := 0
	for _, a := range rec.last {
		if !a.ok {
			inFlight++
		}
	}
	t.Logf("before the kill: %d calls answered; %d retries scheduled, %d started, %d cancelled, %d left pending; %d reports unanswered",
		ops.Load(), len(rec.scheduled), len(rec.started), len(rec.cancelled), len(rec.pending), inFlight)
	if len(rec.started) == 0 || len(rec.cancelled) == 0 || len(rec.pending) == 0 {
		t.Fatal("the load did not exercise starts, cancellations and pending retries")
	}

	srv2 := retrydtest.Start(t, "--store", "file:"+dir)
	conn2 := srv2.Conn(t)
	client2 := retrydv1.NewRetryServiceClient(conn2)
	events := retrydtest.Verify(t, conn2) // the invariant checker over the whole log

	// Every scheduled retry an agent was told of is in the log with the
	// same id, number, step and due time; none started twice.
	scheduled := map[string]*retrydv1.RetryScheduled{}
	startedEvents := map[string]int{}
	var lastSeq uint64
	for _, ev := range events {
		if ev.GetSequence() <= lastSeq {
			t.Errorf("event %d follows event %d", ev.GetSequence(), lastSeq)
		}
		lastSeq = ev.GetSequence()
		if s := ev.GetScheduled(); s != nil {
			scheduled[s.GetRetryId()] = s
		}
		if s := ev.GetStarted(); s != nil {
			if startedEvents[s.GetRetryId()]++; startedEvents[s.GetRetryId()] > 1 {
				t.Errorf("retry %s started twice", s.GetRetryId())
			}
		}
	}
	for id, want := range rec.scheduled {
		got := scheduled[id]
		if got == nil {
			t.Errorf("retry %s (session %s) an agent was told of is not in the log", id, rec.sessionOf[id])
			continue
		}
		if got.GetRetryNumber() != want.GetRetryNumber() || !proto.Equal(got.GetDueAt(), want.GetDueAt()) {
			t.Errorf("retry %s: logged number %d due %v, the agent was told %d due %v",
				id, got.GetRetryNumber(), got.GetDueAt().AsTime(), want.GetRetryNumber(), want.GetDueAt().AsTime())
		}
	}

	// Every retry's state is what its agents were told.
	for id, want := range rec.scheduled {
		st := stateOf(t, client2, id)
		if st.GetScheduled().GetRetryNumber() != want.GetRetryNumber() || !proto.Equal(st.GetScheduled().GetDueAt(), want.GetDueAt()) {
			t.Errorf("retry %s after the restart: %v, the agent was told %v", id, st.GetScheduled(), want)
		}
		switch {
		case rec.started[id] != nil:
			if !proto.Equal(st.GetStarted(), rec.started[id]) {
				t.Errorf("retry %s: started %v after the restart, the agent received %v", id, st.GetStarted(), rec.started[id])
			}
		case rec.cancelled[id] != nil:
			if !proto.Equal(st.GetCancelled(), rec.cancelled[id]) {
				t.Errorf("retry %s: cancelled %v after the restart, the agent received %v", id, st.GetCancelled(), rec.cancelled[id])
			}
		case rec.pending[id]:
			if st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
				t.Errorf("retry %s an agent left pending is %s after the restart", id, st.GetStatus())
			}
		}
	}

	// Every session's last answered report, repeated, gets the very same
	// answer: the step records survived.
	for session, a := range rec.last {
		if !a.ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client2.FailedStep(ctx, a.req)
		cancel()
		if err != nil {
			t.Errorf("session %s: repeating step %d after the restart: %v", session, a.req.GetStep(), err)
			continue
		}
		if !proto.Equal(resp, a.resp) {
			t.Errorf("session %s: step %d answered\n%v\nafter the restart, the agent received\n%v", session, a.req.GetStep(), resp, a.resp)
		}
	}

	// A session with a pending retry still refuses a new failure, naming it;
	// cancelling it works; new decisions number on after the log.
	for id := range rec.pending {
		session := rec.sessionOf[id]
		_, err := client2.FailedStep(context.Background(), &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 2, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("session %s with pending retry %s: a new failure got %v, want RETRY_PENDING", session, id, err)
		}
		if _, err := client2.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: id}}); err != nil {
			t.Errorf("cancel %s after the restart: %v", id, err)
		}
		break
	}
	resp, err := client2.FailedStep(context.Background(), &retrydv1.FailedStepRequest{
		SessionId: "after-restart", Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
	if err != nil {
		t.Fatal(err)
	}
	if seq := resp.GetEvent().GetSequence(); seq <= lastSeq {
		t.Errorf("a new decision has sequence %d, not after the restored log's %d", seq, lastSeq)
	}
	retrydtest.Verify(t, conn2)
}
