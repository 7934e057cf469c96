package redis_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// TestFailover is fault 2 of the durable-state issue: three retryd
// replicas over one Redis (in each key layout, and over a Redis Cluster)
// serve a fleet of agents (FailedStep, AwaitRetry
// by two awaiters at once, CancelRetries while an awaiter waits, retries
// left pending) through one round_robin client; one replica is killed
// with SIGKILL in the middle, and the agents carry on through the other
// two. Afterwards a surviving replica holds every decision an agent
// received with the same retry id, number and due time, no retry started
// twice, every awaiter received its retry's one Started or Cancelled, and
// the invariant checker finds nothing.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: three retryd processes under load for seconds")
	}
	t.Parallel()
	eachLayout(t, func(t *testing.T, url string, _ bool) { testFailover(t, url) })
}

func testFailover(t *testing.T, url string) {
	var replicas []*retrydtest.Server
	for range 3 {
		replicas = append(replicas, retrydtest.Start(t, "--store", url))
	}
	l := startLoad(t, fleetClient(t, replicas...), 8)

	time.Sleep(2 * time.Second)
	before := l.calls.Load()
	if err := replicas[0].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = replicas[0].Wait(10 * time.Second)
	killedAt := l.calls.Load()
	time.Sleep(3 * time.Second)
	l.stop()
	after := l.calls.Load() - killedAt
	t.Logf("%d calls answered before the kill, %d after; %d calls repeated after UNAVAILABLE; "+
		"%d retries scheduled, %d started, %d cancelled, %d left pending",
		before, after, l.repeats.Load(), len(l.told.scheduled), len(l.told.started),
		len(l.told.cancelled), len(l.told.pending))
	if after == 0 {
		t.Fatal("no call was answered after the kill: the agents did not fail over")
	}
	if t.Failed() {
		t.FailNow()
	}
	l.check(replicas[1].Conn(t))
	retrydtest.Verify(t, replicas[2].Conn(t))
}

// redisFailover is how a test fails its Redis over: kill makes sure the
// replica has everything (WAIT, or replication offsets) and kills the
// master that matters; promoted waits until a replica took over and names
// what happened, for the log; describe, if set, says where the servers
// stand when the proof fails.
type redisFailover struct {
	kill     func()
	promoted func() string
	describe func() string
}

// proveRedisFailover is the proof both Redis failover tests (Sentinel,
// Cluster) make with two retryd binaries a and b (a with a health port):
// a load runs, one more retry of session "across" is scheduled, the Redis
// master fails over (fo), and an agent awaits that retry during the
// outage. Afterwards both binaries report SERVING, the awaiter receives
// the retry's one Started, a second load runs, everything the first
// load's agents were told is there, and the invariant checker passes.
func proveRedisFailover(t *testing.T, a, b *retrydtest.Server, fo redisFailover) {
	t.Helper()
	probes := []*grpc.ClientConn{a.Conn(t), a.HealthConn(t), b.Conn(t)}
	client := fleetClient(t, a, b)

	before := startNamedLoad(t, client, 6, "before")
	runLoad(before)
	if t.Failed() {
		t.FailNow()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: "across", Turn: 1, Step: 1, Provider: "p",
		Failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
			MaxRetries: proto.Uint32(3),
			Backoff:    &retrydv1.Backoff{InitialDelayMs: proto.Uint64(500), MaxDelayMs: proto.Uint64(500)},
		}},
	})
	if err != nil || resp.GetDecision().GetSchedule() == nil {
		t.Fatalf("FailedStep before the failover: %v %v, want a schedule", resp, err)
	}
	across := resp.GetDecision().GetSchedule().GetRetryId()

	fo.kill()
	killed := time.Now()
	// Awaited only once the master is gone, the retry cannot have started
	// on it: it starts on the new master, once.
	type awaited struct {
		term *retrydv1.AwaitRetryResponse
		err  error
	}
	awaiter := make(chan awaited, 1)
	go func() {
		term, err := client.AwaitRetry(ctx, across)
		awaiter <- awaited{term, err}
	}()
	what := fo.promoted()
	promoted := time.Since(killed)
	waitHealth(t, healthpb.HealthCheckResponse_SERVING, probes...)
	t.Logf("%s %v after the kill; retryd served again %v after the kill", what,
		promoted.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	got := <-awaiter
	if got.err != nil || got.term.GetStarted() == nil {
		where := ""
		if fo.describe != nil {
			where = "\nthe Redis servers now:\n" + fo.describe()
		}
		t.Fatalf("the agent awaiting retry %s through the failover: %v %v, want Started%s\nretryd a:\n%s\nretryd b:\n%s",
			across, got.term, got.err, where, tail(a.Logs(), 40), tail(b.Logs(), 40))
	}

	after := startNamedLoad(t, client, 6, "after")
	runLoad(after)
	if t.Failed() {
		t.FailNow()
	}
	before.check(a.Conn(t))
	events := after.check(b.Conn(t))
	var starts []*retrydv1.RetryStarted
	for _, ev := range events {
		if ev.GetStarted().GetRetryId() == across {
			starts = append(starts, ev.GetStarted())
		}
	}
	if len(starts) != 1 || !proto.Equal(starts[0], got.term.GetStarted()) {
		t.Errorf("retry %s: the log holds starts %v, the agent received %v", across, starts, got.term.GetStarted())
	}
}

// tail is the last n lines of logs.
func tail(logs string, n int) string {
	lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
