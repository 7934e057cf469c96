package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// netBound is the store URL's unavailable_after in the network fault
// tests, and slack what a call may take beyond it (a retried commit, the
// race detector, two shared cores).
const (
	netBound = 500 * time.Millisecond
	netSlack = 700 * time.Millisecond
)

// startOverPath runs the retryd binary over path i of srv, with a health
// port.
func startOverPath(t *testing.T, srv *redistest.NetServer, i int) *retrydtest.Server {
	t.Helper()
	return retrydtest.Start(t, "--store", srv.URL(i, 0)+"?unavailable_after="+netBound.String(),
		"--health-listen", "127.0.0.1:0")
}

// netCall is one FailedStep of a netLoad.
type netCall struct {
	session    string
	code       codes.Code
	start, end time.Time
}

// netLoad runs FailedStep calls of new sessions on c from workers
// goroutines until stop, each with an agent's deadline of a few seconds.
type netLoad struct {
	mu    sync.Mutex
	calls []netCall
	stop  func()
}

func startNetLoad(c retrydv1.RetryServiceClient, workers int) *netLoad {
	l := &netLoad{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				session := fmt.Sprintf("net-w%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				start := time.Now()
				_, err := c.FailedStep(ctx, &retrydv1.FailedStepRequest{SessionId: session, Turn: 1, Step: 1,
					Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
				end := time.Now()
				cancel()
				l.mu.Lock()
				l.calls = append(l.calls, netCall{session, status.Code(err), start, end})
				l.mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	l.stop = func() { close(done); wg.Wait() }
	return l
}

// healthLog polls a replica's gRPC health every 20 ms until stop and
// records when its status changed.
type healthLog struct {
	mu      sync.Mutex
	changes []healthChange
	stop    func()
}

type healthChange struct {
	at     time.Time
	status healthpb.HealthCheckResponse_ServingStatus
}

func watchHealth(t *testing.T, s *retrydtest.Server) *healthLog {
	h := &healthLog{}
	hc := healthpb.NewHealthClient(s.HealthConn(t))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		last := healthpb.HealthCheckResponse_UNKNOWN
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "retryd.v1.RetryService"})
			cancel()
			if err == nil && resp.GetStatus() != last {
				last = resp.GetStatus()
				h.mu.Lock()
				h.changes = append(h.changes, healthChange{time.Now(), last})
				h.mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	h.stop = func() { close(done); wg.Wait() }
	return h
}

// first returns when the status first became want at or after from, and
// whether it did.
func (h *healthLog) first(want healthpb.HealthCheckResponse_ServingStatus, from time.Time) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.changes {
		if c.status == want && !c.at.Before(from) {
			return c.at, true
		}
	}
	return time.Time{}, false
}

// TestBlackholedReplica: one replica's path to Redis drops every packet
// silently (no reset, no ICMP error) for 4 s, under a small load on that
// replica and the fleet load through the Go client over both replicas
// (proveBlackholed).
func TestBlackholedReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts a path to Redis for seconds")
	}
	srv := redistest.StartInNamespace(t, 2)
	cut, healthy := startOverPath(t, srv, 0), startOverPath(t, srv, 1)
	proveBlackholed(t, cut, healthy, func() { srv.Cut(t, 0) }, func() { srv.Heal(t, 0) })
}

// proveBlackholed cuts the path of replica cut to Redis with cutPath for
// 4 s, then heals it with healPath, under a small load on that replica
// (FailedStep of new sessions, straight to it) and the fleet load through
// the Go client over both replicas. Every call made straight to the cut
// replica during the cut fails UNAVAILABLE within about unavailable_after
// instead of being held until the path heals, and every one made from 2 s
// after the heal is answered OK; gRPC health reports NOT_SERVING within
// about a second plus the bound and SERVING again soon after the heal;
// every call acknowledged is in Redis (read through the healthy replica),
// and everything the fleet's agents were told is what the log holds, no
// retry started twice, with the invariant checker passing.
func proveBlackholed(t *testing.T, cut, healthy *retrydtest.Server, cutPath, healPath func()) {
	t.Helper()
	health := watchHealth(t, cut)
	l := startNetLoad(retrydv1.NewRetryServiceClient(cut.Conn(t)), 4)
	fleet := startLoad(t, fleetClient(t, cut, healthy), 4)
	defer fleet.stop() // a test that ends early stops its agents first

	time.Sleep(1500 * time.Millisecond)
	cutPath()
	cutAt := time.Now()
	time.Sleep(4 * time.Second)
	healPath()
	healedAt := time.Now()
	time.Sleep(3 * time.Second)
	l.stop()
	health.stop()

	var during []time.Duration
	var acked []string
	after := 0
	for _, c := range l.calls {
		took := c.end.Sub(c.start)
		switch {
		case c.start.After(cutAt) && c.start.Add(netBound+netSlack).Before(healedAt):
			// Made during the cut, with time to fail before the heal.
			during = append(during, took)
			if c.code != codes.Unavailable || took > netBound+netSlack {
				t.Errorf("%s during the cut: %v after %v, want UNAVAILABLE within %v", c.session, c.code, took, netBound+netSlack)
			}
		case c.start.After(healedAt.Add(2 * time.Second)):
			after++
			if c.code != codes.OK {
				t.Errorf("%s %v after the heal: %v after %v, want OK", c.session, c.start.Sub(healedAt).Round(time.Millisecond), c.code, took)
			}
		}
		if c.code == codes.OK {
			acked = append(acked, c.session)
		}
	}
	slices.Sort(during)
	t.Logf("%d calls during the cut, answered in %s; %d from 2 s after the heal; %d acknowledged in all",
		len(during), quantiles(during), after, len(acked))
	if len(during) == 0 {
		t.Fatal("no call made during the cut was answered before the heal: calls are held")
	}
	if after == 0 {
		t.Error("no call made from 2 s after the heal was answered before the load stopped")
	}

	notServing, ok := health.first(healthpb.HealthCheckResponse_NOT_SERVING, cutAt)
	if !ok || notServing.After(healedAt) {
		t.Error("health never reported NOT_SERVING during the cut")
	} else {
		t.Logf("NOT_SERVING %v after the cut", notServing.Sub(cutAt).Round(time.Millisecond))
		// The server probes about once a second, each probe bounded; the
		// probe's timer and the health watch each wait for a core on a
		// loaded machine (1.9 s was seen with this slack's half), while a
		// held probe would report only at the heal, 4 s after the cut.
		if d, within := notServing.Sub(cutAt), time.Second+netBound+2*netSlack; d > within {
			t.Errorf("NOT_SERVING %v after the cut, want within %v", d, within)
		}
	}
	serving, ok := health.first(healthpb.HealthCheckResponse_SERVING, healedAt)
	if !ok {
		t.Error("health did not report SERVING within 3 s of the heal")
	} else {
		t.Logf("SERVING %v after the heal", serving.Sub(healedAt).Round(time.Millisecond))
	}

	readAcked(t, healthy, acked)
	runLoad(fleet)
	t.Logf("the fleet's agents: %d calls answered, %d repeated after UNAVAILABLE", fleet.calls.Load(), fleet.repeats.Load())
	fleet.check(healthy.Conn(t))
}

// readAcked reads every session of acked through replica s and fails the
// test for each that has no chain. A read that fails UNAVAILABLE (a store
// round trip past the bound, on a loaded machine) is repeated, as an
// agent would.
func readAcked(t *testing.T, s *retrydtest.Server, acked []string) {
	t.Helper()
	c := retrydv1.NewRetryServiceClient(s.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, session := range acked {
		for {
			resp, err := c.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: session})
			if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err != nil || len(resp.GetChains()) == 0 {
				t.Errorf("acknowledged session %s read through replica %s: %v %v", session, s.Addr, resp, err)
			}
			break
		}
	}
}

// quantiles names the median, p90 and maximum of sorted durations.
func quantiles(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	at := func(q float64) time.Duration { return d[int(q*float64(len(d)-1))].Round(time.Millisecond) }
	return fmt.Sprintf("min %v, p50 %v, p90 %v, max %v", d[0].Round(time.Millisecond), at(0.5), at(0.9), d[len(d)-1].Round(time.Millisecond))
}

// TestBlackholedAwaiters: AwaitRetry streams on a replica whose path to
// Redis drops every packet (proveBlackholedAwaiters).
func TestBlackholedAwaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts a path to Redis for seconds")
	}
	srv := redistest.StartInNamespace(t, 2)
	cut, healthy := startOverPath(t, srv, 0), startOverPath(t, srv, 1)
	proveBlackholedAwaiters(t, cut, healthy, func() { srv.Cut(t, 0) }, func() { srv.Heal(t, 0) })
}

// proveBlackholedAwaiters cuts the path of replica cut to Redis with
// cutPath while awaiters wait, and heals it with healPath once they are
// answered. AwaitRetry streams on the cut replica end UNAVAILABLE within
// about a second plus the bound (a waiting stream reads its retry at least
// once a second), so agents re-attach to a replica that can reach Redis. A
// stream opened directly on the cut replica ends UNAVAILABLE; awaiters of
// the Go client over both replicas (round_robin, health-checked) re-attach
// to the healthy one and each gets its retry's one Started close to its
// due time, although the path stays cut past the due time; the invariant
// checker passes.
func proveBlackholedAwaiters(t *testing.T, cut, healthy *retrydtest.Server, cutPath, healPath func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := retrydv1.NewRetryServiceClient(healthy.Conn(t))
	client := fleetClient(t, cut, healthy)

	const delay = 5 * time.Second
	const awaiters = 6
	type awaited struct {
		retryID string
		due     time.Time
		term    *retrydv1.AwaitRetryResponse
		err     error
		at      time.Time
	}
	all := make([]*awaited, awaiters)
	for i := range all {
		due := time.Now().Add(delay)
		all[i] = &awaited{retryID: scheduleFixed(ctx, t, hc, fmt.Sprintf("await-%d", i), uint64(delay.Milliseconds())), due: due}
	}
	direct := awaitStream(ctx, t, retrydv1.NewRetryServiceClient(cut.Conn(t)), all[0].retryID)
	var wg sync.WaitGroup
	for _, a := range all {
		wg.Go(func() {
			a.term, a.err = client.AwaitRetry(ctx, a.retryID)
			a.at = time.Now()
		})
	}
	time.Sleep(500 * time.Millisecond) // every awaiter attached

	cutPath()
	cutAt := time.Now()
	_, err := terminal(direct)
	ended := time.Since(cutAt)
	t.Logf("the stream on the cut replica ended %v after the cut: %v", ended.Round(time.Millisecond), err)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the stream on the cut replica: %v, want UNAVAILABLE", err)
	}
	if ended > time.Second+netBound+netSlack {
		t.Errorf("the stream on the cut replica ended %v after the cut, want within %v", ended, time.Second+netBound+netSlack)
	}
	wg.Wait()
	healPath()

	var late []time.Duration
	for _, a := range all {
		if a.err != nil || a.term.GetStarted() == nil {
			t.Errorf("awaiter of %s: %v %v, want Started", a.retryID, a.term, a.err)
			continue
		}
		late = append(late, a.at.Sub(a.due))
	}
	slices.Sort(late)
	t.Logf("awaiters got Started after their due time: %s", quantiles(late))
	// Started is due within the awaiters' recheck (a second) of the due
	// time, plus a re-attach.
	if len(late) > 0 && late[len(late)-1] > 2*time.Second {
		t.Errorf("an awaiter got Started %v after its due time, want within 2s", late[len(late)-1])
	}
	events := retrydtest.Verify(t, healthy.Conn(t))
	started := map[string]int{}
	for _, ev := range events {
		if s := ev.GetStarted(); s != nil {
			started[s.GetRetryId()]++
		}
	}
	for _, a := range all {
		if started[a.retryID] != 1 {
			t.Errorf("retry %s started %d times, want once", a.retryID, started[a.retryID])
		}
	}
}

// TestFlappingPath: one replica's path to Redis goes down and up every
// 500 ms for 5 s (down: every packet dropped silently) under a small load
// on that replica (proveFlapping).
func TestFlappingPath(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: flaps a path to Redis for seconds")
	}
	srv := redistest.StartInNamespace(t, 2)
	flapping, steady := startOverPath(t, srv, 0), startOverPath(t, srv, 1)
	proveFlapping(t, flapping, steady, func() { srv.Cut(t, 0) }, func() { srv.Heal(t, 0) })
}

// proveFlapping cuts the path of replica flapping to Redis with cutPath
// and heals it with healPath every 500 ms for 5 s, under a small load
// straight to that replica. Every call either succeeds or fails
// UNAVAILABLE within about the bound, none is held for the length of the
// flapping; every call acknowledged is in Redis (read through the steady
// replica), and the invariant checker passes.
func proveFlapping(t *testing.T, flapping, steady *retrydtest.Server, cutPath, healPath func()) {
	t.Helper()
	l := startNetLoad(retrydv1.NewRetryServiceClient(flapping.Conn(t)), 4)

	time.Sleep(time.Second)
	for range 5 {
		cutPath()
		time.Sleep(500 * time.Millisecond)
		healPath()
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(time.Second)
	l.stop()

	var ok, unavailable []time.Duration
	var acked []string
	for _, c := range l.calls {
		took := c.end.Sub(c.start)
		switch c.code {
		case codes.OK:
			ok = append(ok, took)
			acked = append(acked, c.session)
		case codes.Unavailable:
			unavailable = append(unavailable, took)
		default:
			t.Errorf("%s: %v after %v, want OK or UNAVAILABLE", c.session, c.code, took)
		}
		// Within the bound, even a call queued behind a group commit
		// that is already waiting on the cut path.
		if took > netBound+netSlack {
			t.Errorf("%s: %v after %v, want an answer within %v", c.session, c.code, took, netBound+netSlack)
		}
	}
	slices.Sort(ok)
	slices.Sort(unavailable)
	t.Logf("%d calls OK (%s), %d UNAVAILABLE (%s)", len(ok), quantiles(ok), len(unavailable), quantiles(unavailable))
	if len(unavailable) == 0 {
		t.Error("no call failed while the path was down: the flapping did not cut anything")
	}
	readAcked(t, steady, acked)
	retrydtest.Verify(t, steady.Conn(t))
}

// TestQueuedBehindCut: a call queued behind a group commit that waits on
// a cut path ends within its own bound from when it was made, not the
// bound of the group ahead plus its own: the first call's group waits,
// the second call comes 100 ms later, and each fails UNAVAILABLE within
// about unavailable_after of its start.
func TestQueuedBehindCut(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts a path to Redis")
	}
	srv := redistest.StartInNamespace(t, 1)
	s := open(t, srv.URL(0, 0)+"?unavailable_after="+netBound.String(), "")
	ctx := context.Background()
	if _, err := store.New(s).FailedStep(ctx, failure("before")); err != nil {
		t.Fatal(err)
	}
	srv.Cut(t, 0)
	defer srv.Heal(t, 0)
	took := make([]time.Duration, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range took {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			began := time.Now()
			_, errs[i] = store.New(s).FailedStep(ctx, failure(fmt.Sprintf("queued-%d", i)))
			took[i] = time.Since(began)
		})
	}
	wg.Wait()
	for i := range took {
		t.Logf("call %d: %v after %v", i, errs[i], took[i].Round(time.Millisecond))
		if !errors.Is(errs[i], store.ErrUnavailable) {
			t.Errorf("call %d: %v, want ErrUnavailable", i, errs[i])
		}
		// Twice the bound less the head start would be 900 ms.
		if took[i] > netBound+200*time.Millisecond {
			t.Errorf("call %d ended %v after it was made, want within %v", i, took[i], netBound+200*time.Millisecond)
		}
	}
}
