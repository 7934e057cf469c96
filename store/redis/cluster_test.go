package redis_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// TestClusterFailover: two retryd binaries over a Redis Cluster of three
// masters, each with a replica (appendfsync always, checked on every
// connection). After a load, one more retry is scheduled; once the
// replicas have everything, the master holding that retry's session is
// killed with SIGKILL and an agent awaits the retry during the outage.
// The replica takes over the master's slots; then both binaries serve,
// the awaiter receives the retry's one Started, a second load runs, every
// decision, Started and Cancelled the first load's agents were told of is
// there, and the invariant checker passes.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a Cluster failover under two retryd processes")
	}
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1, AppendFsync: "always"})
	url := cluster.URL() + "&appendfsync=always"
	a := retrydtest.Start(t, "--store", url, "--health-listen", "127.0.0.1:0")
	b := retrydtest.Start(t, "--store", url)
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

	cluster.Replicated(t)
	master := cluster.Holding(t, "*:s:across")
	if err := master.Kill(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	type awaited struct {
		term *retrydv1.AwaitRetryResponse
		err  error
	}
	awaiter := make(chan awaited, 1)
	go func() {
		term, err := client.AwaitRetry(ctx, across)
		awaiter <- awaited{term, err}
	}()

	cluster.WaitFailover(t)
	took := time.Since(killed)
	waitHealth(t, healthpb.HealthCheckResponse_SERVING, probes...)
	t.Logf("a replica took over %v after the kill of master %s; retryd served again %v after it",
		took.Round(time.Millisecond), master.Addr, time.Since(killed).Round(time.Millisecond))
	got := <-awaiter
	if got.err != nil || got.term.GetStarted() == nil {
		t.Fatalf("the agent awaiting retry %s through the failover: %v %v, want Started", across, got.term, got.err)
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
