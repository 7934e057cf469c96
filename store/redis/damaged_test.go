package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestDamagedSession: a session whose stored data cannot be read refuses
// the calls that touch it, and only them; its due timer is tried again a
// minute later, not at every poll, and counted in retryd.timers.postponed
// (zero before).
func TestDamagedSession(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix()
	// A short grace: the timer of a retry nobody awaits waits for its
	// abandon time.
	s, err := redis.Open(context.Background(), redis.Config{URL: srv.URL(0), KeyPrefix: prefix,
		Options: store.Options{AbandonGrace: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reader := sdkmetric.NewManualReader()
	if _, err := service.New(s, service.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))); err != nil {
		t.Fatal(err)
	}
	postponed := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == "retryd.timers.postponed" {
					return m.Data.(metricdata.Sum[int64]).DataPoints[0].Value
				}
			}
		}
		t.Fatal("no metric retryd.timers.postponed")
		return 0
	}
	ctx := context.Background()
	out, err := store.New(s).FailedStep(ctx, failure("broken"))
	if err != nil || out.Scheduled == nil {
		t.Fatalf("FailedStep: %v %v", out, err)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	// Damage the snapshot before its retry falls due.
	if err := rdb.Set(ctx, prefix+"retryd:{broken}:s", "\xff\xff not a snapshot", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.New(s).GetChains(ctx, "broken"); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("GetChains of the damaged session: %v, want an error naming the damage", err)
	}
	if _, err := store.New(s).FailedStep(ctx, failure("healthy")); err != nil {
		t.Errorf("FailedStep of another session: %v", err)
	}
	if n := postponed(); n != 0 {
		t.Errorf("retryd.timers.postponed = %d before any timer fell due, want 0", n)
	}
	member := " broken" // the session's timer
	deadline := time.Now().Add(20 * time.Second)
	for {
		score, err := rdb.ZScore(ctx, prefix+"retryd:timers", member).Result()
		if err != nil {
			t.Fatalf("the damaged session's timer: %v", err)
		}
		if at := time.UnixMilli(int64(score)); time.Until(at) > 30*time.Second {
			break // postponed
		}
		if time.Now().After(deadline) {
			t.Fatalf("the damaged session's timer is still due at %v: retried at every poll", time.UnixMilli(int64(score)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The count follows the timer's move.
	for n := postponed(); n != 1; n = postponed() {
		if time.Now().After(deadline) {
			t.Fatalf("retryd.timers.postponed = %d after the damaged session's timer was postponed, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
