package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
	"github.com/retryd/retryd/store/storetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestRedisRestart is fault 3 of the durable-state issue: Redis, with its
// append-only file on, goes away in the middle of a load on two replicas
// and comes back on the same port and directory. While it is gone retryd
// reports NOT_SERVING on gRPC health (main port and --health-listen port,
// overall and for the RetryService) and answers UNAVAILABLE without
// recording anything; once it is back, health is SERVING again, the
// agents carry on, and every decision acknowledged before the outage is
// still there. Two ways to lose Redis: a clean stop (SIGTERM) under the
// default appendfsync everysec, which writes everything before it exits;
// and a crash (SIGKILL) under appendfsync always, which retryd's URL
// requires (appendfsync=always) because only then is every acknowledged
// write on disk.
func TestRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: restarts Redis under load")
	}
	t.Parallel()
	for _, tc := range []struct {
		name, fsync, query string
		signal             syscall.Signal
	}{
		{name: "sigterm-everysec", fsync: "everysec", signal: syscall.SIGTERM},
		{name: "kill9-always", fsync: "always", query: "?appendfsync=always", signal: syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartWith(t, redistest.Options{AppendOnly: true, AppendFsync: tc.fsync})
			url := srv.URL(0) + tc.query
			a := retrydtest.Start(t, "--store", url, "--health-listen", "127.0.0.1:0")
			b := retrydtest.Start(t, "--store", url)
			probes := []*grpc.ClientConn{a.Conn(t), a.HealthConn(t), b.Conn(t)}
			l := startLoad(t, fleetClient(t, a, b), 6)

			time.Sleep(1500 * time.Millisecond)
			if err := srv.Kill(tc.signal); err != nil {
				t.Fatal(err)
			}
			acknowledged := l.calls.Load()
			waitHealth(t, healthpb.HealthCheckResponse_NOT_SERVING, probes...)
			outage(t, retrydv1.NewRetryServiceClient(a.Conn(t)))

			srv.Restart(t)
			waitHealth(t, healthpb.HealthCheckResponse_SERVING, probes...)
			resumed := l.calls.Load()
			time.Sleep(1500 * time.Millisecond)
			l.stop()
			t.Logf("%d calls answered before Redis went away, %d after it came back; %d calls repeated after UNAVAILABLE",
				acknowledged, l.calls.Load()-resumed, l.repeats.Load())
			if l.calls.Load() == resumed {
				t.Error("no call was answered after Redis came back")
			}
			if t.Failed() {
				t.FailNow()
			}
			// What was refused during the outage was not recorded.
			_, err := retrydv1.NewRetryServiceClient(a.Conn(t)).GetChains(context.Background(),
				&retrydv1.GetChainsRequest{SessionId: "during-outage"})
			if status.Code(err) != codes.NotFound {
				t.Errorf("GetChains of the session refused during the outage: %v, want NOT_FOUND", err)
			}
			l.check(a.Conn(t))
			retrydtest.Verify(t, b.Conn(t))
			// go-redis' complaints while Redis was away went through the
			// server's logger: a JSON log stays JSON.
			for _, srv := range []*retrydtest.Server{a, b} {
				for _, line := range strings.Split(strings.TrimSpace(srv.Logs()), "\n") {
					if !json.Valid([]byte(line)) {
						t.Errorf("log line is not JSON: %q", line)
						break
					}
				}
			}
		})
	}
}

// outage checks that a replica without Redis answers UNAVAILABLE.
func outage(t *testing.T, c retrydv1.RetryServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: "during-outage", Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("FailedStep without Redis: %v, want UNAVAILABLE", err)
	}
	_, err = c.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
		Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "agent0-session0"}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("CancelRetries without Redis: %v, want UNAVAILABLE", err)
	}
	_, err = c.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "agent0-session0"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("GetChains without Redis: %v, want UNAVAILABLE", err)
	}
}

// waitHealth waits until every connection's health service reports want,
// overall and for the RetryService.
func waitHealth(t *testing.T, want healthpb.HealthCheckResponse_ServingStatus, conns ...*grpc.ClientConn) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, conn := range conns {
		h := healthpb.NewHealthClient(conn)
		for _, service := range []string{"", retrydv1.RetryService_ServiceDesc.ServiceName} {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
				cancel()
				if err == nil && resp.GetStatus() == want {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("health of %q on %s: %v %v, want %s", service, conn.Target(), resp, err, want)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// TestRequireAppendFsync: with appendfsync=always in its URL the store
// refuses a Redis that could lose acknowledged writes, naming what it
// found, and accepts one that fsyncs every write.
func TestRequireAppendFsync(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts redistest.Options
		bad  string // part of the refusal; empty: accepted
	}{
		{"no-aof", redistest.Options{}, `appendonly "no"`},
		{"everysec", redistest.Options{AppendOnly: true}, `appendfsync "everysec"`},
		{"always", redistest.Options{AppendOnly: true, AppendFsync: "always"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartWith(t, tc.opts)
			s, err := redis.Open(context.Background(), redis.Config{URL: srv.URL(0) + "?appendfsync=always"})
			if tc.bad == "" {
				if err != nil {
					t.Fatalf("Open of a Redis with appendfsync always: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("Open of a Redis with %v: accepted, want a refusal", tc.opts)
			}
			if !strings.Contains(err.Error(), tc.bad) || !strings.Contains(err.Error(), srv.Addr) {
				t.Errorf("refusal %q does not name %s and %s", err, tc.bad, srv.Addr)
			}
		})
	}
	_, err := redis.Open(context.Background(), redis.Config{URL: "redis://127.0.0.1:1/0?appendfsync=sometimes"})
	if err == nil || !strings.Contains(err.Error(), "sometimes") {
		t.Errorf("appendfsync=sometimes: %v, want a refusal naming the value", err)
	}
}

// TestPing: Ping follows Redis going away and coming back.
func TestPing(t *testing.T) {
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{})
	s := open(t, srv.URL(0), "")
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := srv.Kill(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Ping without Redis: %v, want ErrUnavailable", err)
	}
	srv.Restart(t)
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping after the restart: %v", err)
	}
}

// TestOutageGivesGrace: a retry that fell due while Redis was away is not
// abandoned the moment Redis is back, since no agent could await it in
// between: it gets a whole abandon grace from then, and an agent that
// attaches within it starts it.
func TestOutageGivesGrace(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: keeps Redis away for longer than an abandon grace")
	}
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{AppendOnly: true})
	const grace = 4 * time.Second
	s, err := redis.Open(context.Background(), redis.Config{Options: store.Options{AbandonGrace: grace}, URL: srv.URL(0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := store.New(s).FailedStep(ctx, scheduled(t, "s", 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	id := out.Response.GetDecision().GetSchedule().GetRetryId()
	if err := srv.Kill(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200*time.Millisecond + grace + time.Second) // due, and its grace passed, while Redis is away
	srv.Restart(t)
	for s.Ping(ctx) != nil {
		time.Sleep(50 * time.Millisecond)
	}
	// The timer poller, which retries every second while Redis is away,
	// has handled the retry's timer by now.
	time.Sleep(1500 * time.Millisecond)
	var term *retrydv1.AwaitRetryResponse
	err = storetest.AwaitRetry(ctx, s, id, func(r *retrydv1.AwaitRetryResponse) error {
		if r.GetState() == nil {
			term = r
		}
		return nil
	})
	if err != nil || term.GetStarted() == nil {
		t.Errorf("an awaiter right after Redis came back: %v %v, want Started", term, err)
	}
}
