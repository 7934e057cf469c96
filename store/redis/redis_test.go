package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/service"
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
	if !errors.As(err, &se) || !strings.Contains(err.Error(), `"7"`) || !strings.Contains(err.Error(), `"1"`) {
		t.Fatalf("Open over schema 7: %v, want a SchemaError naming 7 and 1", err)
	}
	open(t, srv.URL(0), redistest.Prefix()) // an empty prefix is initialised

	// A layout is refused by every other: the single layout, and another
	// number of partitions.
	single := redistest.Prefix()
	open(t, srv.URL(0), single)
	_, err = redis.Open(context.Background(), redis.Config{URL: srv.URL(0) + "?partitions=4", KeyPrefix: single})
	if !errors.As(err, &se) || se.Found != "1" || se.Want != "2 partitions=4" {
		t.Fatalf("Open with 4 partitions over the single layout: %v, want a SchemaError", err)
	}
	four := redistest.Prefix()
	open(t, srv.URL(0)+"?partitions=4", four)
	for _, url := range []string{srv.URL(0), srv.URL(0) + "?partitions=8"} {
		_, err = redis.Open(context.Background(), redis.Config{URL: url, KeyPrefix: four})
		if !errors.As(err, &se) || se.Found != "2 partitions=4" {
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
	if _, err := s.FailedStep(context.Background(), failure("a")); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if _, err := s.FailedStep(context.Background(), failure("b")); !errors.Is(err, service.ErrUnavailable) {
		t.Errorf("FailedStep with Redis down: %v, want ErrUnavailable", err)
	}
	if _, err := s.GetChains(context.Background(), "a"); !errors.Is(err, service.ErrUnavailable) {
		t.Errorf("GetChains with Redis down: %v, want ErrUnavailable", err)
	}
}

// BenchmarkFailedStep measures decisions through the store (no gRPC), each
// a first failure of a fresh session, from 32 goroutines per CPU: redis
// against memory. Run it with
//
//	go test -run '^$' -bench FailedStep -benchtime 5s ./store/redis/
func BenchmarkFailedStep(b *testing.B) {
	for _, backend := range []struct {
		name string
		open func(b *testing.B) service.Store
	}{
		{"memory", func(b *testing.B) service.Store {
			s := memory.New(memory.Config{})
			b.Cleanup(s.Close)
			return s
		}},
		{"redis", func(b *testing.B) service.Store {
			return open(b, redistest.Shared(b).URL(0), redistest.Prefix())
		}},
	} {
		b.Run(backend.name, func(b *testing.B) {
			s := backend.open(b)
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.FailedStep(context.Background(), failure(fmt.Sprintf("s-%d", n.Add(1)))); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
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
					if _, err := s.FailedStep(context.Background(), f); err != nil {
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
	err := stores[1].WatchEvents(context.Background(), &retrydv1.WatchEventsRequest{StopAtEnd: true},
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
