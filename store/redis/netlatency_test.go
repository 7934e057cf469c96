package redis_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
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
		// query is the store URL's query: its bound (unavailable_after,
		// 1 s when not set) or its layout (partitions).
		query string
	}{
		{"rtt=0", 0, 0, 32, ""},
		{"rtt=50ms", 50 * time.Millisecond, 0, 32, ""},
		{"rtt=200ms", 200 * time.Millisecond, 0, 32, ""},
		{"rtt=200ms/bound=3s", 200 * time.Millisecond, 0, 32, "unavailable_after=3s"},
		{"rtt=200ms/agents=128", 200 * time.Millisecond, 0, 128, ""},
		{"rtt=200ms/agents=128/bound=3s", 200 * time.Millisecond, 0, 128, "unavailable_after=3s"},
		{"rtt=200ms/agents=128/partitions=16", 200 * time.Millisecond, 0, 128, "partitions=16"},
		{"rtt=200ms/loss=5%", 200 * time.Millisecond, 0.05, 32, ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			srv := redistest.StartInNamespace(b, 1)
			url := srv.URL(0, 0)
			if c.query != "" {
				url += "?" + c.query
			}
			s := retrydtest.Start(b, "--store", url)
			if c.rtt > 0 {
				srv.Delay(b, 0, c.rtt/2, c.rtt/8)
			}
			if c.loss > 0 {
				srv.Lose(b, 0, c.loss)
			}
			client := retrydv1.NewRetryServiceClient(s.Conn(b))
			b.ResetTimer()
			l := decideOverPath(client, c.workers, b.N, "lat")
			b.StopTimer()
			l.report(b, c.workers, c.rtt)
		})
	}
}

// BenchmarkRequestOverPath measures what one request of a given size
// costs over the slow path of BenchmarkPathLatency (200 ms added to the
// round trip, no jitter), on a warm connection of its own: a SET of size
// bytes, one after the other, b.N of them. It reports the mean time of a
// request in round trips of the added delay. Its cases are named after
// the host's TCP congestion control (cc), which decides it: BBR paces
// what a connection sends at its estimate of the path's bandwidth, and a
// connection that sends a request and then waits for the answer
// (application-limited) keeps that estimate near what it sent per round
// trip, so a request of more than a few segments goes out over a good
// part of a round trip; CUBIC sends it at once, as far as its window
// allows. A group commit is such a request (see docs/storage.md, "A slow
// or lossy path"). Run it as root with
//
//	go test -run '^$' -bench RequestOverPath -benchtime 20x ./store/redis/
func BenchmarkRequestOverPath(b *testing.B) {
	const rtt = 200 * time.Millisecond
	cc, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		b.Fatal(err)
	}
	srv := redistest.StartInNamespace(b, 1)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr(0), PoolSize: 1})
	defer rdb.Close()
	srv.Delay(b, 0, rtt/2, 0)
	ctx := context.Background()
	for _, kb := range []int{1, 8, 16, 32, 64, 160} {
		b.Run(fmt.Sprintf("cc=%s/size=%dKiB", strings.TrimSpace(string(cc)), kb), func(b *testing.B) {
			value := strings.Repeat("x", kb<<10)
			// The first requests open the connection's window; they are
			// not measured.
			for range 4 {
				if err := rdb.Set(ctx, "k", value, 0).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				if err := rdb.Set(ctx, "k", value, 0).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(rtt), "round-trips/op")
		})
	}
}

// pathLoad is what decideOverPath measured: the latencies of the calls
// answered OK, sorted, and how many failed UNAVAILABLE or otherwise.
type pathLoad struct {
	ok                  []time.Duration
	unavailable, failed int
	// unavailableIDs are the sessions of the calls that failed UNAVAILABLE.
	unavailableIDs []string
	took           time.Duration
}

// decideOverPath has workers agents each call FailedStep of a new session
// (named after prefix), one call after the other, calls in all.
func decideOverPath(client retrydv1.RetryServiceClient, workers, calls int, prefix string) pathLoad {
	var next atomic.Int64
	var mu sync.Mutex
	var l pathLoad
	var wg sync.WaitGroup
	began := time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(calls); i = next.Add(1) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				id := fmt.Sprintf("%s-%d-%d", prefix, w, i)
				began := time.Now()
				_, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
					SessionId: id, Turn: 1, Step: 1,
					Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
				took := time.Since(began)
				cancel()
				mu.Lock()
				switch status.Code(err) {
				case codes.OK:
					l.ok = append(l.ok, took)
				case codes.Unavailable:
					l.unavailable++
					l.unavailableIDs = append(l.unavailableIDs, id)
				default:
					l.failed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	l.took = time.Since(began)
	slices.Sort(l.ok)
	return l
}

// report reports a benchmark's figures: decisions/s answered OK, their
// p50 and p99, the calls that failed UNAVAILABLE, and what one group
// commit per round trip allows (see BenchmarkPathLatency).
func (l pathLoad) report(b *testing.B, workers int, rtt time.Duration) {
	b.Helper()
	if l.failed > 0 {
		b.Errorf("%d calls failed with neither OK nor UNAVAILABLE", l.failed)
	}
	b.ReportMetric(float64(len(l.ok))/l.took.Seconds(), "decisions/s")
	if len(l.ok) > 0 {
		b.ReportMetric(float64(l.ok[len(l.ok)/2].Milliseconds()), "p50-ms")
		b.ReportMetric(float64(l.ok[(len(l.ok)*99)/100].Milliseconds()), "p99-ms")
	}
	b.ReportMetric(float64(l.unavailable), "unavailable")
	if rtt > 0 {
		b.ReportMetric(float64(workers)/(2*rtt.Seconds()), "bound-decisions/s")
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

// TestSlowCommitKeepsItsConnection: over a path of 200 ms round trips
// with the default bound (1 s), 128 agents keep groups of up to 128 new
// sessions in flight, each of which takes several round trips; a caller
// waits for the group in flight, then for its own, so many calls fail
// UNAVAILABLE while their group's commit is in flight. The path answers
// (a probe's PING, on a new connection three round trips, fits in the
// bound), so those commits are not cut: they complete on their connection (the sessions
// of calls answered UNAVAILABLE are recorded), Redis accepts no more
// connections than the replica's pool needs while hundreds of calls miss
// their bound, and once the load ends the replica knows what Redis holds,
// so its next decision takes one round trip.
func TestSlowCommitKeepsItsConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs a load over a slow path")
	}
	const rtt = 200 * time.Millisecond
	srv := redistest.StartInNamespace(t, 1)
	s := retrydtest.Start(t, "--store", srv.URL(0, 0))
	client := retrydv1.NewRetryServiceClient(s.Conn(t))
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr(0)})
	t.Cleanup(func() { rdb.Close() })
	decide(t, client, "warm")

	srv.Delay(t, 0, rtt/2, rtt/20)
	const calls = 600
	// A call takes 3 to 5 round trips, so now and then a load answers
	// (nearly) every call just within the bound: the case then does not
	// hold its premise, and the load runs again, up to three times.
	var l pathLoad
	var before int
	for attempt := 1; ; attempt++ {
		before = connectionsReceived(t, rdb)
		l = decideOverPath(client, 128, calls, fmt.Sprintf("slow%d", attempt))
		t.Logf("%d of %d calls answered OK (%s), %d UNAVAILABLE, in %v", len(l.ok), calls,
			quantiles(l.ok), l.unavailable, l.took.Round(time.Millisecond))
		if l.failed > 0 {
			t.Fatalf("%d calls failed with neither OK nor UNAVAILABLE", l.failed)
		}
		if l.unavailable >= calls/10 {
			break
		}
		if attempt == 3 {
			t.Fatalf("only %d of %d calls missed their bound, in %d loads: the case does not hold its premise",
				l.unavailable, calls, attempt)
		}
		time.Sleep(2 * rtt) // the last group's answer
	}
	time.Sleep(2 * rtt) // the last group's answer
	grown := connectionsReceived(t, rdb) - before
	began := time.Now()
	_, nextErr := client.FailedStep(context.Background(), &retrydv1.FailedStepRequest{SessionId: "next", Turn: 1, Step: 1,
		Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
	next := time.Since(began)
	srv.Undelay(t, 0)

	recorded := 0
	for _, id := range l.unavailableIDs {
		_, err := client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: id})
		switch status.Code(err) {
		case codes.OK:
			recorded++
		case codes.NotFound: // withdrawn from the queue: never committed
		default:
			t.Fatalf("GetChains(%s): %v", id, err)
		}
	}
	t.Logf("%d of the %d calls answered UNAVAILABLE were recorded; Redis accepted %d connections; the next decision took %v",
		recorded, l.unavailable, grown, next.Round(time.Millisecond))
	// The replica's pool grows by a few connections (a probe, a poll
	// beside the commit); a cut commit costs one each.
	if grown > 6 {
		t.Errorf("Redis accepted %d connections while %d calls missed their bound: commits were cut", grown, l.unavailable)
	}
	if recorded == 0 {
		t.Errorf("none of the %d calls answered UNAVAILABLE was recorded: their groups' commits did not complete", l.unavailable)
	}
	switch {
	case nextErr != nil:
		t.Errorf("the next decision, alone over the slow path: %v", nextErr)
	case next > rtt*3/2:
		t.Errorf("the next decision took %v, more than one round trip of %v", next, rtt)
	}
}

// decide has a new session, named id, report one failed step, which must
// be answered.
func decide(t *testing.T, client retrydv1.RetryServiceClient, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{SessionId: id, Turn: 1, Step: 1,
		Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}}); err != nil {
		t.Fatalf("FailedStep(%s): %v", id, err)
	}
}

// connectionsReceived reads INFO stats' total_connections_received.
func connectionsReceived(t *testing.T, rdb *goredis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatalf("INFO stats: %v", err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO stats: total_connections_received:%s: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("INFO stats has no total_connections_received")
	return 0
}

// BenchmarkPathLatencyHA is BenchmarkPathLatency's slow-path cases over a
// Sentinel URL (the master and its Sentinel behind the path) and a
// Cluster URL (three masters behind it), with the store URL's default
// bound: one retryd process in a namespace of its own, its store path
// slowed by rtt (half each way, ± an eighth of it) and losing loss of
// the packets each way, and over a partitioned layout where the case
// names one. Run it as root with
//
//	go test -run '^$' -bench PathLatencyHA -benchtime 600x ./store/redis/
func BenchmarkPathLatencyHA(b *testing.B) {
	for _, kind := range []struct {
		name  string
		start func(testing.TB, int) *redistest.StoreNet
	}{{"sentinel", redistest.StartSentinelNet}, {"cluster", redistest.StartClusterNet}} {
		for _, c := range []struct {
			name    string
			rtt     time.Duration
			loss    float64
			workers int
			// partitions, when not 0, is the store URL's layout (a
			// Cluster URL's is 16 partitions unless it names one).
			partitions int
		}{
			{"rtt=200ms", 200 * time.Millisecond, 0, 32, 0},
			{"rtt=200ms/agents=128", 200 * time.Millisecond, 0, 128, 0},
			{"rtt=200ms/agents=128/partitions=16", 200 * time.Millisecond, 0, 128, 16},
			{"rtt=200ms/loss=5%", 200 * time.Millisecond, 0.05, 32, 0},
		} {
			b.Run(kind.name+"/"+c.name, func(b *testing.B) {
				sn := kind.start(b, 1)
				url := sn.URL
				if c.partitions > 0 {
					url += fmt.Sprintf("&partitions=%d", c.partitions)
				}
				s := retrydtest.StartInNetns(b, sn.Namespace(0), "--store", url, "--listen", sn.Listen(0))
				sn.Delay(b, 0, c.rtt/2, c.rtt/8)
				if c.loss > 0 {
					sn.Lose(b, 0, c.loss)
				}
				client := retrydv1.NewRetryServiceClient(s.Conn(b))
				b.ResetTimer()
				l := decideOverPath(client, c.workers, b.N, "lat")
				b.StopTimer()
				l.report(b, c.workers, c.rtt)
			})
		}
	}
}
