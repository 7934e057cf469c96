package redis_test

import (
	"context"
	"fmt"
	"github.com/retryd/retryd/store"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
)

// BenchmarkKnownSessions: decisions on sessions that exist, as most of a
// fleet's are (BenchmarkFailedStep decides on a new session every time):
// one store, 32 callers, each cycling through 32 sessions of its own, each
// call one transition of a session this replica wrote last — a failure
// that schedules a retry, or the cancellation of the session's pending
// retry (so its next failure is taken). Each session soon holds a chain,
// step records and retained retries: a snapshot of a few hundred bytes to
// kilobytes. It reports the CPU time of Redis and of this process (the
// store and its callers) per call.
func BenchmarkKnownSessions(b *testing.B) {
	srv := redistest.Shared(b)
	benchKnownSessions(b, []string{srv.Addr}, open(b, srv.URL(0), redistest.Prefix()))
}

// BenchmarkKnownSessionsAlternating is BenchmarkKnownSessions on two
// replicas of one Redis, each session's calls going to them in turn, as a
// round-robin balancer without session affinity sends them: every call
// lands on the replica that did not write the session last, so what it
// knows of the session is out of date (its check fails, or it reads
// first, see known.go) and it decodes the snapshot.
func BenchmarkKnownSessionsAlternating(b *testing.B) {
	srv := redistest.Shared(b)
	prefix := redistest.Prefix()
	benchKnownSessions(b, []string{srv.Addr}, open(b, srv.URL(0), prefix), open(b, srv.URL(0), prefix))
}

// benchKnownSessions runs BenchmarkKnownSessions' calls, a session's n-th
// call on stores[n % len(stores)].
func benchKnownSessions(b *testing.B, addrs []string, stores ...*redis.Store) {
	var workers atomic.Int64
	var calls atomic.Int64
	cpu, own := redisCPU(b, addrs), processCPU(b)
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := workers.Add(1)
		const perWorker = 32
		var steps, n [perWorker]uint64
		var pending [perWorker]bool
		ctx := context.Background()
		for i := 0; pb.Next(); i++ {
			j := i % perWorker
			id := fmt.Sprintf("k-%d-%d", w, j)
			s := stores[n[j]%uint64(len(stores))]
			n[j]++
			if pending[j] {
				if _, err := store.New(s).CancelSession(ctx, id); err != nil {
					b.Fatal(err)
				}
				pending[j] = false
			} else {
				steps[j]++
				f := failure(id)
				f.Request.Step = steps[j]
				out, err := store.New(s).FailedStep(ctx, f)
				if err != nil {
					b.Fatal(err)
				}
				pending[j] = out.Response.GetDecision().GetSchedule() != nil
			}
			calls.Add(1)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(calls.Load())/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric((redisCPU(b, addrs)-cpu)*1e6/float64(calls.Load()), "redis-cpu-µs/op")
	b.ReportMetric(float64(processCPU(b)-own)/float64(time.Microsecond)/float64(calls.Load()), "store-cpu-µs/op")
}

// processCPU is the CPU time this process (the store and the benchmark's
// callers, not Redis) used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
