package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/memory"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
)

func open(t testing.TB, url, prefix string) *redis.Store {
	t.Helper()
	s, err := redis.Open(context.Background(), redis.Config{URL: url, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func failure(session string) engine.Failure {
	p, err := policy.Resolve(nil)
	if err != nil {
		panic(err)
	}
	return engine.Failure{
		Request: &retrydv1.FailedStepRequest{SessionId: session, Turn: 1, Step: 1,
			Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}},
		Policy: p,
	}
}

// TestSchemaMismatch: data of another schema version is refused, naming
// both versions.
func TestSchemaMismatch(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer c.Close()
	if err := c.Set(context.Background(), prefix+"retryd:schema", "7", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := redis.Open(context.Background(), redis.Config{URL: srv.URL(0), KeyPrefix: prefix})
	var se *redis.SchemaError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), `"7"`) || !strings.Contains(err.Error(), `"5"`) {
		t.Fatalf("Open over schema 7: %v, want a SchemaError naming 7 and 5", err)
	}
	open(t, srv.URL(0), redistest.Prefix()) // an empty prefix is initialised

	// A layout is refused by every other: the single layout, and another
	// number of partitions.
	single := redistest.Prefix()
	open(t, srv.URL(0), single)
	_, err = redis.Open(context.Background(), redis.Config{URL: srv.URL(0) + "?partitions=4", KeyPrefix: single})
	if !errors.As(err, &se) || se.Found != "5" || se.Want != "6 partitions=4" {
		t.Fatalf("Open with 4 partitions over the single layout: %v, want a SchemaError", err)
	}
	four := redistest.Prefix()
	open(t, srv.URL(0)+"?partitions=4", four)
	for _, url := range []string{srv.URL(0), srv.URL(0) + "?partitions=8"} {
		_, err = redis.Open(context.Background(), redis.Config{URL: url, KeyPrefix: four})
		if !errors.As(err, &se) || se.Found != "6 partitions=4" {
			t.Fatalf("Open of %s over 4 partitions: %v, want a SchemaError", url, err)
		}
	}
}

// TestUnreachable: Open refuses a Redis that does not answer.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	addr := srv.Addr
	srv.Stop()
	_, err := redis.Open(context.Background(), redis.Config{URL: "redis://" + addr + "/0"})
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "PING") {
		t.Fatalf("Open of a stopped Redis: %v, want an error naming %s and PING", err, addr)
	}
}

// TestRedisDown: once Redis is gone, calls fail UNAVAILABLE and never
// guess.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := open(t, srv.URL(0), "")
	if _, err := store.New(s).FailedStep(context.Background(), failure("a")); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if _, err := store.New(s).FailedStep(context.Background(), failure("b")); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("FailedStep with Redis down: %v, want ErrUnavailable", err)
	}
	if _, err := store.New(s).GetChains(context.Background(), "a"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("GetChains with Redis down: %v, want ErrUnavailable", err)
	}
}

// BenchmarkFailedStep measures decisions through the store (no gRPC), each
// a first failure of a fresh session, from 32 goroutines per CPU: redis
// against memory, and with three stores (replicas) in each key layout and
// on a Cluster, calls spread over them. Run it with
//
//	go test -run '^$' -bench FailedStep -benchtime 5s ./store/redis/
func BenchmarkFailedStep(b *testing.B) {
	// replicas opens n stores over one URL; cpu reads the Redis servers'
	// CPU time (INFO cpu), so that each decision's cost in Redis is
	// reported beside the rate.
	replicas := func(n int, url string) []store.Backend {
		prefix := redistest.Prefix()
		stores := make([]store.Backend, n)
		for i := range stores {
			stores[i] = open(b, url, prefix)
		}
		return stores
	}
	for _, backend := range []struct {
		name string
		open func(b *testing.B) (stores []store.Backend, redisAddrs []string)
	}{
		{"memory", func(b *testing.B) ([]store.Backend, []string) {
			s := memory.New(memory.Config{})
			b.Cleanup(func() { _ = s.Close() })
			return []store.Backend{s}, nil
		}},
		{"redis", func(b *testing.B) ([]store.Backend, []string) {
			srv := redistest.Shared(b)
			return replicas(1, srv.URL(0)), []string{srv.Addr}
		}},
		// Three stores over one Redis: three replicas of retryd.
		{"redis-3-replicas", func(b *testing.B) ([]store.Backend, []string) {
			srv := redistest.Shared(b)
			return replicas(3, srv.URL(0)), []string{srv.Addr}
		}},
		{"redis-partitioned-16-3-replicas", func(b *testing.B) ([]store.Backend, []string) {
			srv := redistest.Shared(b)
			return replicas(3, srv.URL(0)+"?partitions=16"), []string{srv.Addr}
		}},
		{"redis-cluster-3-masters-3-replicas", func(b *testing.B) ([]store.Backend, []string) {
			c := redistest.SharedCluster(b)
			addrs := make([]string, len(c.Nodes))
			for i, n := range c.Nodes {
				addrs[i] = n.Addr
			}
			return replicas(3, c.URL()), addrs
		}},
	} {
		b.Run(backend.name, func(b *testing.B) {
			stores, addrs := backend.open(b)
			var n atomic.Int64
			cpu := redisCPU(b, addrs)
			b.ReportAllocs()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					s := stores[int(i)%len(stores)]
					if _, err := store.New(s).FailedStep(context.Background(), failure(fmt.Sprintf("s-%d", i))); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			if len(addrs) > 0 {
				b.ReportMetric((redisCPU(b, addrs)-cpu)*1e6/float64(b.N), "redis-cpu-µs/op")
			}
		})
	}
}

// redisCPU returns the CPU time the Redis servers at addrs used so far, in
// seconds (INFO cpu: used_cpu_sys + used_cpu_user).
func redisCPU(b *testing.B, addrs []string) float64 {
	var total float64
	for _, addr := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		info, err := c.Info(context.Background(), "cpu").Result()
		c.Close()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			for _, field := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), field); ok {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						b.Fatal(err)
					}
					total += f
				}
			}
		}
	}
	return total
}

// TestTwoStoresOneLog: two stores over one Redis (two replicas) writing
// the same and different sessions at once number every event once, in
// one gapless order, and the log passes the invariant checker.
func TestTwoStoresOneLog(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix()
	stores := []*redis.Store{open(t, srv.URL(0), prefix), open(t, srv.URL(0), prefix)}
	const sessions, steps = 8, 20
	var wg sync.WaitGroup
	for i := range sessions {
		for k, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for step := range uint64(steps) {
					f := failure(fmt.Sprintf("s%d", i))
					f.Request.Step = step*2 + uint64(k) + 1
					f.Policy = nil // delegated: no pending retry in the way
					if _, err := store.New(s).FailedStep(context.Background(), f); err != nil {
						var ee *engine.Error
						if !errors.As(err, &ee) || ee.Kind != engine.KindStale {
							t.Errorf("FailedStep: %v", err)
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	var events []*retrydv1.Event
	err := store.New(stores[1]).WatchEvents(context.Background(), &retrydv1.WatchEventsRequest{StopAtEnd: true},
		func(ev *retrydv1.Event) error { events = append(events, ev); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(events) == 0 {
		t.Fatal("no events")
	}
	for i, ev := range events {
		if ev.GetSequence() != uint64(i+1) {
			t.Fatalf("event %d has sequence %d, want %d", i, ev.GetSequence(), i+1)
		}
	}
	for _, v := range invariant.Check(events) {
		t.Errorf("invariant violation: %s", v)
	}
	t.Logf("%d events from two stores", len(events))
}
