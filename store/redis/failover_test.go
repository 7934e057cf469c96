package redis_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
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
