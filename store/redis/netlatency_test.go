package redis_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// BenchmarkPathLatency measures what a replica decides when its path to
// Redis is slow or lossy: one retryd process over a namespaced path with
// the round trip lengthened by rtt (half each way, ± an eighth of it) and
// loss of each packet each way, 32 agents (or as many as the case names)
// each calling FailedStep of a new session, one call after the other, b.N
// calls in all. It reports the decisions answered OK per second, their p50
// and p99, and the calls that failed UNAVAILABLE (the store URL's default
// bound of 1 s, unless the case names one). Run it as root with
//
//	go test -run '^$' -bench PathLatency -benchtime 2000x ./store/redis/
//
// "bound" is what one group commit per round trip allows with N callers
// that each call again once answered: a call waits for the group in
// flight, then commits in the next one, so N decisions per two added
// round trips.
func BenchmarkPathLatency(b *testing.B) {
	for _, c := range []struct {
		name    string
		rtt     time.Duration
		loss    float64
		workers int
		// bound is the store URL's unavailable_after; zero is its default.
		bound time.Duration
	}{
		{"rtt=0", 0, 0, 32, 0},
		{"rtt=50ms", 50 * time.Millisecond, 0, 32, 0},
		{"rtt=200ms", 200 * time.Millisecond, 0, 32, 0},
		{"rtt=200ms/bound=3s", 200 * time.Millisecond, 0, 32, 3 * time.Second},
		{"rtt=200ms/agents=128", 200 * time.Millisecond, 0, 128, 0},
		{"rtt=200ms/agents=128/bound=3s", 200 * time.Millisecond, 0, 128, 3 * time.Second},
		{"rtt=200ms/loss=5%", 200 * time.Millisecond, 0.05, 32, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			srv := redistest.StartInNamespace(b, 1)
			url := srv.URL(0, 0)
			if c.bound > 0 {
				url += "?unavailable_after=" + c.bound.String()
			}
			s := retrydtest.Start(b, "--store", url)
			if c.rtt > 0 {
				srv.Delay(b, 0, c.rtt/2, c.rtt/8)
			}
			if c.loss > 0 {
				srv.Lose(b, 0, c.loss)
			}
			client := retrydv1.NewRetryServiceClient(s.Conn(b))
			workers := c.workers
			var next atomic.Int64
			var mu sync.Mutex
			var ok []time.Duration
			unavailable, failed := 0, 0
			var wg sync.WaitGroup
			b.ResetTimer()
			for w := range workers {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						began := time.Now()
						_, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
							SessionId: fmt.Sprintf("lat-%d-%d", w, i), Turn: 1, Step: 1,
							Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
						took := time.Since(began)
						cancel()
						mu.Lock()
						switch status.Code(err) {
						case codes.OK:
							ok = append(ok, took)
						case codes.Unavailable:
							unavailable++
						default:
							failed++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			if failed > 0 {
				b.Errorf("%d calls failed with neither OK nor UNAVAILABLE", failed)
			}
			slices.Sort(ok)
			b.ReportMetric(float64(len(ok))/b.Elapsed().Seconds(), "decisions/s")
			if len(ok) > 0 {
				b.ReportMetric(float64(ok[len(ok)/2].Milliseconds()), "p50-ms")
				b.ReportMetric(float64(ok[(len(ok)*99)/100].Milliseconds()), "p99-ms")
			}
			b.ReportMetric(float64(unavailable), "unavailable")
			if c.rtt > 0 {
				b.ReportMetric(float64(workers)/(2*c.rtt.Seconds()), "bound-decisions/s")
			}
		})
	}
}

// TestLatencyAndLoss: one replica's path to Redis adds 200 ± 50 ms to
// each round trip and loses 5 % of the packets each way, the other's is
// clean, under the fleet load (FailedStep, awaiters, cancellations) through
// the Go client over both replicas. The slow replica still decides: a few
// of its calls may fail UNAVAILABLE (a lost packet costs a retransmission
// timeout), which the agents repeat; whatever either replica acknowledged
// is what the log holds, no retry starts twice, and the invariant checker
// passes.
func TestLatencyAndLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs a load over a slow, lossy path")
	}
	srv := redistest.StartInNamespace(t, 2)
	slow, clean := startOverPath(t, srv, 0), startOverPath(t, srv, 1)
	proveLatencyAndLoss(t, slow, clean, srv)
}

// pathFaults delays a replica's path and makes it lose packets.
type pathFaults interface {
	Delay(t testing.TB, i int, delay, jitter time.Duration)
	Undelay(t testing.TB, i int)
	Lose(t testing.TB, i int, p float64)
}

// proveLatencyAndLoss makes path 0 of faults, replica slow's, add 200 ± 50 ms
// to each round trip and lose 5 % of the packets each way, and runs the
// fleet load through the Go client over slow and clean: whatever either
// replica acknowledged is what the log holds, no retry starts twice, and
// the invariant checker passes.
func proveLatencyAndLoss(t *testing.T, slow, clean *retrydtest.Server, faults pathFaults) {
	t.Helper()
	faults.Delay(t, 0, 100*time.Millisecond, 25*time.Millisecond)
	faults.Lose(t, 0, 0.05)
	client := fleetClient(t, slow, clean)
	l := startLoad(t, client, 16)
	runLoad(l)
	t.Logf("%d calls answered, %d repeated after UNAVAILABLE", l.calls.Load(), l.repeats.Load())
	if l.calls.Load() == 0 {
		t.Fatal("no call was answered")
	}
	faults.Undelay(t, 0)
	faults.Lose(t, 0, 0)
	l.check(clean.Conn(t))
}
