package redis_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/store"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store/redis/redistest"
	"github.com/retryd/retryd/store/storetest"
)

// BenchmarkMemoryPerSession measures what one session costs Redis: the
// growth of INFO used_memory over b.N new sessions, each one FailedStep,
// divided by b.N (the global stream's entry and the timer set's members
// included), and MEMORY USAGE of the first session's own keys. Each shape
// gets a Redis of its own. Run it with
//
//	go test -run '^$' -bench MemoryPerSession -benchtime 10000x ./store/redis/
//
// "scheduled" is a session with one open chain and its pending retry (the
// session key, its events' share of a stream entry and its timer; the
// retry's id names the session, so it has no index key);
// "delegated" a session whose one failure was delegated (no chain). Redis
// 7.0 gives a new stream a node of stream-node-max-bytes (4096 by
// default) at once, which dominates a short session's cost: each shape
// runs under the default and under 1024.
func BenchmarkMemoryPerSession(b *testing.B) {
	for _, nodeBytes := range []string{"4096", "1024"} {
		for _, shape := range memoryShapes(b) {
			b.Run(fmt.Sprintf("%s/stream-node-max-bytes=%s", shape.name, nodeBytes), func(b *testing.B) {
				measureMemory(b, nodeBytes, shape.failure)
			})
		}
	}
}

type memoryShape struct {
	name    string
	failure func(session string) engine.Failure
}

func memoryShapes(b *testing.B) []memoryShape {
	return []memoryShape{
		{"scheduled", func(session string) engine.Failure { return scheduled(b, session, time.Hour) }},
		{"delegated", func(session string) engine.Failure {
			f := failure(session)
			f.Policy = nil
			return f
		}},
	}
}

// measureMemory runs one shape on a Redis of its own.
func measureMemory(b *testing.B, nodeBytes string, newFailure func(string) engine.Failure) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "stream-node-max-bytes", nodeBytes).Err(); err != nil {
		b.Fatal(err)
	}
	s := open(b, srv.URL(0), "")
	// The first session creates the keys every session shares.
	if _, err := store.New(s).FailedStep(ctx, newFailure("first")); err != nil {
		b.Fatal(err)
	}
	before := usedMemory(b, rdb)
	var n atomic.Int64
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := store.New(s).FailedStep(ctx, newFailure(fmt.Sprintf("s-%d", n.Add(1)))); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(usedMemory(b, rdb)-before)/float64(b.N), "bytes/session")
	keys := 0
	for _, pattern := range []string{"retryd:{first}:*", "retryd:r:*"} {
		found, err := rdb.Keys(ctx, pattern).Result()
		if err != nil {
			b.Fatal(err)
		}
		if pattern == "retryd:r:*" {
			found = found[:min(len(found), 1)] // one retry's index key
		}
		for _, k := range found {
			n, err := rdb.MemoryUsage(ctx, k).Result()
			if err != nil {
				b.Fatal(err)
			}
			keys += int(n)
		}
	}
	b.ReportMetric(float64(keys), "key-bytes/session")
}

// usedMemory reads INFO memory's used_memory.
func usedMemory(b *testing.B, rdb *goredis.Client) int64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("INFO memory has no used_memory")
	return 0
}

// BenchmarkCancelPropagation measures how long a cancellation made on one
// replica takes to reach an awaiter on another: two stores (two replicas,
// each with its own connections and subscription) over one Redis; per
// operation a retry is scheduled, awaited on A, and cancelled on B. It
// reports the median and the slowest delay from CancelRetry's return on B
// (the transaction committed) to the awaiter on A receiving Cancelled, and
// the median including the CancelRetry call. Run it with
//
//	go test -run '^$' -bench CancelPropagation -benchtime 500x ./store/redis/
func BenchmarkCancelPropagation(b *testing.B) {
	srv := redistest.Shared(b)
	prefix := redistest.Prefix()
	a, other := open(b, srv.URL(0), prefix), open(b, srv.URL(0), prefix)
	ctx := context.Background()
	var afterCommit, withCall []time.Duration
	b.ResetTimer()
	for i := range b.N {
		out, err := store.New(a).FailedStep(ctx, scheduled(b, fmt.Sprintf("s-%d", i), time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		id := out.Response.GetDecision().GetSchedule().GetRetryId()
		attached, ended := make(chan struct{}), make(chan time.Time, 1)
		go func() {
			err := storetest.AwaitRetry(ctx, a, id, func(r *retrydv1.AwaitRetryResponse) error {
				if r.GetState() != nil {
					close(attached)
				} else {
					ended <- time.Now()
				}
				return nil
			})
			if err != nil {
				b.Error(err)
			}
		}()
		<-attached
		began := time.Now()
		if _, err := storetest.CancelRetry(ctx, other, id); err != nil {
			b.Fatal(err)
		}
		committed := time.Now()
		at := <-ended
		afterCommit = append(afterCommit, at.Sub(committed))
		withCall = append(withCall, at.Sub(began))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	slices.Sort(afterCommit)
	slices.Sort(withCall)
	b.ReportMetric(ms(afterCommit[len(afterCommit)/2]), "ms-median")
	b.ReportMetric(ms(afterCommit[len(afterCommit)*99/100]), "ms-p99")
	b.ReportMetric(ms(afterCommit[len(afterCommit)-1]), "ms-max")
	b.ReportMetric(ms(withCall[len(withCall)/2]), "ms-median-with-call")
}
