package redis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/health" // the client side of healthCheckConfig
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// fleetClient is the Go client as a fleet's agents use it in front of
// several replicas: one target resolving to every replica's address (here
// a manual resolver; in Kubernetes dns:/// of a headless Service),
// round_robin over them, and gRPC client-side health checking, so that a
// replica that is gone or reports NOT_SERVING gets no new calls.
// AwaitRetry re-attaches on its own when a stream breaks.
func fleetClient(t *testing.T, servers ...*retrydtest.Server) *retryd.Client {
	t.Helper()
	r := manual.NewBuilderWithScheme("retryd-fleet")
	var addrs []resolver.Address
	for _, s := range servers {
		addrs = append(addrs, resolver.Address{Addr: s.Addr})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	c, err := retryd.New(r.Scheme()+":///replicas", retryd.WithInsecure(),
		retryd.WithDialOptions(grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(`{
			"loadBalancingConfig": [{"round_robin": {}}],
			"healthCheckConfig": {"serviceName": "retryd.v1.RetryService"}
		}`)),
		retryd.WithReattachBackoff(20*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// told is everything the agents of a load were told.
type told struct {
	mu sync.Mutex
	// last is each session's last FailedStep with its answer.
	last map[string]exchange
	// scheduled are the schedule decisions by retry id.
	scheduled map[string]*retrydv1.Schedule
	sessionOf map[string]string
	// started and cancelled are the terminal messages every awaiter (and
	// canceller) received, by retry id.
	started   map[string][]*retrydv1.RetryStarted
	cancelled map[string][]*retrydv1.RetryCancelled
	// pending are retries an agent left waiting (due long after the test).
	pending map[string]bool
}

type exchange struct {
	req  *retrydv1.FailedStepRequest
	resp *retrydv1.FailedStepResponse
}

// load is a fleet of agents running sessions against retryd through one
// client: FailedStep, then AwaitRetry of the retry by two awaiters at once,
// or CancelRetries (by retry id or session) while an awaiter waits, or
// leaving the retry pending. An agent repeats a call that failed
// UNAVAILABLE (every call is idempotent) until it is answered: what a
// fleet does while a replica or Redis is away.
type load struct {
	t      *testing.T
	client *retryd.Client
	// name starts its sessions' ids.
	name string
	told told
	// calls counts answered calls; repeats the calls repeated after
	// UNAVAILABLE.
	calls, repeats atomic.Int64
	stopping       atomic.Bool
	wg             sync.WaitGroup
}

// startLoad starts n agents.
func startLoad(t *testing.T, client *retryd.Client, n int) *load {
	return startNamedLoad(t, client, n, "agent")
}

// startNamedLoad starts n agents whose sessions' ids start with name, so
// that a second load does not run into the first one's sessions.
func startNamedLoad(t *testing.T, client *retryd.Client, n int, name string) *load {
	l := &load{t: t, client: client, name: name, told: told{
		last: map[string]exchange{}, scheduled: map[string]*retrydv1.Schedule{}, sessionOf: map[string]string{},
		started: map[string][]*retrydv1.RetryStarted{}, cancelled: map[string][]*retrydv1.RetryCancelled{},
		pending: map[string]bool{},
	}}
	for i := range n {
		l.wg.Go(func() { l.agent(i) })
	}
	return l
}

// stop lets every agent finish the session step it is in, and waits.
func (l *load) stop() {
	l.stopping.Store(true)
	l.wg.Wait()
}

// loadTimeout bounds one agent call with all its repetitions: generous, for
// a loaded machine and a Redis restart.
const loadTimeout = 2 * time.Minute

// repeat runs call until it is not UNAVAILABLE.
func repeat[R any](l *load, call func(context.Context) (R, error)) (R, error) {
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	defer cancel()
	for {
		r, err := call(ctx)
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			if err == nil {
				l.calls.Add(1)
			}
			return r, err
		}
		l.repeats.Add(1)
		time.Sleep(time.Duration(20+mrand.IntN(30)) * time.Millisecond)
	}
}

// agent runs sessions one after another until the load stops.
func (l *load) agent(n int) {
	rnd := mrand.New(mrand.NewPCG(uint64(n), 7))
	for k := 0; !l.stopping.Load(); k++ {
		session := fmt.Sprintf("%s%d-session%d", l.name, n, k)
		for step := uint64(1); step <= 4 && !l.stopping.Load(); step++ {
			action := rnd.IntN(10)
			if !l.step(session, step, action) {
				break
			}
		}
	}
}

// step reports one failed step and acts on its retry; false ends the
// session (its budget is exhausted, the retry was left pending, or the
// agent failed).
func (l *load) step(session string, step uint64, action int) bool {
	t := l.t
	delay := uint64(5 + action*3) // awaited: due at once
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
	resp, err := repeat(l, func(ctx context.Context) (*retrydv1.FailedStepResponse, error) {
		return l.client.FailedStep(ctx, req)
	})
	if err != nil {
		t.Errorf("session %s step %d: FailedStep: %v", session, step, err)
		return false
	}
	s := resp.GetDecision().GetSchedule()
	l.told.mu.Lock()
	l.told.last[session] = exchange{req, resp}
	if s != nil {
		l.told.scheduled[s.GetRetryId()] = s
		l.told.sessionOf[s.GetRetryId()] = session
	}
	l.told.mu.Unlock()
	switch {
	case s == nil:
		return false // exhausted: the next session
	case action < 6:
		return l.awaitBoth(s.GetRetryId())
	case action < 8:
		return l.cancelAwaited(session, s.GetRetryId(), action == 6)
	default:
		l.told.mu.Lock()
		l.told.pending[s.GetRetryId()] = true
		l.told.mu.Unlock()
		return false
	}
}

// awaitBoth awaits a retry with two awaiters at once (on different
// replicas, as round_robin places them); both must receive the one Started.
func (l *load) awaitBoth(id string) bool {
	var wg sync.WaitGroup
	terms := make([]*retrydv1.AwaitRetryResponse, 2)
	errs := make([]error, 2)
	for i := range terms {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
			defer cancel()
			terms[i], errs[i] = l.client.AwaitRetry(ctx, id)
		})
	}
	wg.Wait()
	for i := range terms {
		if errs[i] != nil || terms[i].GetStarted() == nil {
			l.t.Errorf("awaiter %d of retry %s: %v %v, want Started", i, id, terms[i], errs[i])
			return false
		}
		l.calls.Add(1)
	}
	l.told.mu.Lock()
	l.told.started[id] = append(l.told.started[id], terms[0].GetStarted(), terms[1].GetStarted())
	l.told.mu.Unlock()
	return true
}

// cancelAwaited cancels a retry (by its id or its session) while an
// awaiter waits for it; the awaiter must receive Cancelled (requested).
func (l *load) cancelAwaited(session, id string, byID bool) bool {
	t := l.t
	awaited := make(chan *retrydv1.AwaitRetryResponse, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
		defer cancel()
		term, err := l.client.AwaitRetry(ctx, id)
		if err != nil {
			t.Errorf("awaiter of cancelled retry %s: %v", id, err)
		}
		awaited <- term
	}()
	time.Sleep(time.Duration(mrand.IntN(20)) * time.Millisecond) // attached, or not yet: both must work
	resp, err := repeat(l, func(ctx context.Context) (*retrydv1.CancelRetriesResponse, error) {
		if byID {
			return l.client.CancelRetry(ctx, id)
		}
		return l.client.CancelSession(ctx, session)
	})
	if err != nil {
		t.Errorf("cancel %s: %v", id, err)
		return false
	}
	term := <-awaited
	got := term.GetCancelled()
	if got.GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
		t.Errorf("awaiter of cancelled retry %s: %v, want Cancelled (requested)", id, term)
		return false
	}
	// A repeated CancelSession (the first one's answer was lost) finds no
	// pending retry left, so only a CancelRetries answer names the retry.
	l.told.mu.Lock()
	l.told.cancelled[id] = append(l.told.cancelled[id], got)
	if rs := resp.GetRetries(); len(rs) == 1 && rs[0].GetRetryId() == id {
		l.told.cancelled[id] = append(l.told.cancelled[id], rs[0].GetCancelled())
	}
	l.told.mu.Unlock()
	return false // the chain is closed: the next session
}

// check proves that everything the agents were told is what retryd
// holds, reading it through conn (one replica): the event log passes the
// invariant checker and holds every retry an agent was told of with the
// same id, number and due time, at most one Started per retry, equal to
// what every awaiter received, and each cancellation as received; each
// retry's state agrees; each session's last report, repeated, gets the
// very same answer.
func (l *load) check(conn *grpc.ClientConn) []*retrydv1.Event {
	t := l.t
	t.Helper()
	tl := &l.told
	if len(tl.started) == 0 || len(tl.cancelled) == 0 || len(tl.pending) == 0 {
		t.Fatalf("the load did not exercise starts (%d), cancellations (%d) and pending retries (%d)",
			len(tl.started), len(tl.cancelled), len(tl.pending))
	}
	events := retrydtest.Verify(t, conn)
	scheduled := map[string]*retrydv1.RetryScheduled{}
	started := map[string]*retrydv1.RetryStarted{}
	cancelled := map[string]*retrydv1.RetryCancelled{}
	for _, ev := range events {
		switch {
		case ev.GetScheduled() != nil:
			scheduled[ev.GetScheduled().GetRetryId()] = ev.GetScheduled()
		case ev.GetStarted() != nil:
			id := ev.GetStarted().GetRetryId()
			if started[id] != nil {
				t.Errorf("retry %s started twice: %v and %v", id, started[id], ev.GetStarted())
			}
			started[id] = ev.GetStarted()
		case ev.GetCancelled() != nil && ev.GetCancelled().GetRetryId() != "":
			cancelled[ev.GetCancelled().GetRetryId()] = ev.GetCancelled()
		}
	}
	for id, want := range tl.scheduled {
		got := scheduled[id]
		if got == nil {
			t.Errorf("retry %s (session %s) an agent was told of is not in the log", id, tl.sessionOf[id])
			continue
		}
		if got.GetRetryNumber() != want.GetRetryNumber() || !proto.Equal(got.GetDueAt(), want.GetDueAt()) {
			t.Errorf("retry %s: logged number %d due %v, the agent was told %d due %v", id,
				got.GetRetryNumber(), got.GetDueAt().AsTime(), want.GetRetryNumber(), want.GetDueAt().AsTime())
		}
	}
	for id, rs := range tl.started {
		for _, r := range rs {
			if !proto.Equal(r, started[id]) {
				t.Errorf("retry %s: an awaiter received %v, the log holds %v", id, r, started[id])
			}
		}
		if cancelled[id] != nil {
			t.Errorf("retry %s started and was cancelled", id)
		}
	}
	for id, cs := range tl.cancelled {
		for _, c := range cs {
			if !proto.Equal(c, cancelled[id]) {
				t.Errorf("retry %s: an agent received %v, the log holds %v", id, c, cancelled[id])
			}
		}
	}
	client := retrydv1.NewRetryServiceClient(conn)
	for id := range tl.scheduled {
		st := stateOf(t, client, id)
		switch {
		case tl.pending[id]:
			if st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
				t.Errorf("retry %s an agent left pending is %s", id, st.GetStatus())
			}
		case tl.started[id] != nil:
			if !proto.Equal(st.GetStarted(), started[id]) {
				t.Errorf("retry %s: state %v, want started %v", id, st, started[id])
			}
		case tl.cancelled[id] != nil:
			if !proto.Equal(st.GetCancelled(), cancelled[id]) {
				t.Errorf("retry %s: state %v, want cancelled %v", id, st, cancelled[id])
			}
		}
	}
	for session, x := range tl.last {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := client.FailedStep(ctx, x.req)
		cancel()
		if err != nil {
			t.Errorf("session %s: repeating step %d: %v", session, x.req.GetStep(), err)
		} else if !proto.Equal(resp, x.resp) {
			t.Errorf("session %s: step %d answered\n%v\nnow, the agent received\n%v", session, x.req.GetStep(), resp, x.resp)
		}
	}
	return events
}

// stateOf reads only the state message of AwaitRetry, then leaves, so a
// pending retry is not started by the look.
func stateOf(t *testing.T, client retrydv1.RetryServiceClient, id string) *retrydv1.RetryState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id})
	if err != nil {
		t.Fatalf("AwaitRetry %s: %v", id, err)
	}
	first, err := stream.Recv()
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("AwaitRetry %s: %v", id, err)
	}
	return first.GetState()
}
