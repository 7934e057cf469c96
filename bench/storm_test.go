package bench

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSmokeStorm runs the storm and the herd for a moment, two rounds
// each, and checks that every call of a phase got a decision, that the
// numbers the table reports are there and positive, and that the herd's
// fleet protection acted. It makes no assertion about speed.
func TestSmokeStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three servers")
	}
	cfg := Config{Root: moduleRoot(t), Warmup: 50 * time.Millisecond, Rounds: 2, Conns: 1}
	sc := StormConfig{Calls: 400, Callers: 8, Memory: true, Herd: 200}
	results, err := RunStorm(context.Background(), cfg, sc)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 8 {
		t.Fatalf("got %d phases, want 8 (2 scenarios × 2 targets × 2 rounds)", len(results))
	}
	for _, r := range results {
		want := int64(sc.Calls)
		if r.Scenario == herdScenario {
			want = int64(sc.Herd)
		}
		if r.Calls != want || r.Answered != want || r.Errors != 0 {
			t.Errorf("%s %s round %d: %d calls, %d answered, %d errors (first: %s), want %d answered",
				r.Scenario, r.Target, r.Round, r.Calls, r.Answered, r.Errors, r.FirstError, want)
		}
		if r.RPS() <= 0 || r.P50 <= 0 || r.P99 < r.P50 || r.ServerCPU < 0 || r.GCCPU < 0 {
			t.Errorf("%s %s round %d: %.0f calls/s, p50 %v, p99 %v, CPU %v s, GC CPU %v s",
				r.Scenario, r.Target, r.Round, r.RPS(), r.P50, r.P99, r.ServerCPU, r.GCCPU)
		}
		// Both servers' allocations come from their /metrics.
		if rt := r.Runtime; rt == nil || rt.Mallocs <= 0 || rt.Allocated <= 0 || rt.GCs < 0 {
			t.Errorf("%s %s round %d: Go runtime %+v", r.Scenario, r.Target, r.Round, rt)
		}
		if r.Scenario == herdScenario && r.Target == "retryd" && r.Fleet == 0 {
			t.Errorf("herd round %d: the fleet acted on none of %d decisions", r.Round, r.Answered)
		}
	}
	var b strings.Builder
	if err := WriteStormTable(&b, cfg, sc, results); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| storm | 1 | retryd | 400 | 400 | 0 |", "| storm | 2 | grpc echo | 400 | 400 | 0 |",
		"| herd | 2 | retryd | 200 | 200 | 0 |", "| storm | retryd | grpc echo | 1 |", "| herd | retryd | grpc echo | 2 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestSmokeStormProfile runs the storm with a profile directory for a
// moment and checks that retryd and the echo left their profiles of the
// storm's load and a summary that reads them.
func TestSmokeStormProfile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two servers, and profiles them")
	}
	dir := t.TempDir()
	cfg := Config{Root: moduleRoot(t), Duration: time.Second, Warmup: 50 * time.Millisecond, Rounds: 1, Conns: 1, ProfileDir: dir}
	sc := StormConfig{Calls: 200, Callers: 4, Memory: true}
	if _, err := RunStorm(context.Background(), cfg, sc); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"retryd.storm", "grpc-echo.storm"} {
		checkProfiles(t, dir, name, []string{".cpu.pprof", ".allocs.pprof", ".heap.pprof", ".trace", ".sched.pprof"},
			"Where the samples go", "-sample_index=alloc_objects", "Scheduler latency of an execution trace")
	}
}

func TestGCTraceCPU(t *testing.T) {
	t.Parallel()
	ns, ok := gcTraceCPU("gc 7 @0.512s 1%: 0.011+1.2+0.020 ms clock, 0.045+0.31/0.58/0.10+0.082 ms cpu, 4->4->2 MB, 5 MB goal, 0 MB stacks, 0 MB globals, 2 P")
	if !ok || ns != 1_117_000 {
		t.Fatalf("got %d ns, %v; want 1117000 ns", ns, ok)
	}
	for _, line := range []string{`{"msg":"serving"}`, "gc 7 @0.5s 1%: forced", "gcx"} {
		if _, ok := gcTraceCPU(line); ok {
			t.Errorf("%q read as a collection", line)
		}
	}
}

// TestSmokeStormRedis runs the storm on the Redis store for a moment,
// beside envoyproxy/ratelimit when RETRYD_BENCH_RATELIMIT_BIN names its
// binary, and checks that every call got a decision and that
// redis-server's CPU was read. It needs redis-server and redis-benchmark.
func TestSmokeStormRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three servers")
	}
	needPrograms(t, "redis-server", "redis-benchmark")
	cfg := Config{Root: moduleRoot(t), Warmup: 50 * time.Millisecond, Rounds: 1, Conns: 1,
		RatelimitBin: os.Getenv("RETRYD_BENCH_RATELIMIT_BIN")}
	sc := StormConfig{Calls: 300, Callers: 8, Redis: true}
	results, err := RunStorm(context.Background(), cfg, sc)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{retrydRedisName, echoName}
	if cfg.RatelimitBin != "" {
		want = []string{retrydRedisName, ratelimitName, echoName}
	}
	var targets []string
	for _, r := range results {
		targets = append(targets, r.Target)
		if r.Scenario != redisStormScenario || r.Calls != 300 || r.Answered != 300 || r.Errors != 0 || r.RPS() <= 0 || r.P50 <= 0 {
			t.Errorf("%s %s: %d calls, %d answered, %d errors (first: %s), %.0f calls/s, p50 %v",
				r.Scenario, r.Target, r.Calls, r.Answered, r.Errors, r.FirstError, r.RPS(), r.P50)
		}
		if r.Target == retrydRedisName && r.RedisCPU < 0 {
			t.Errorf("redis-server CPU %v s", r.RedisCPU)
		}
	}
	if !slices.Equal(targets, want) {
		t.Fatalf("phases of %v, want %v", targets, want)
	}
	var b strings.Builder
	if err := WriteStormTable(&b, cfg, sc, results); err != nil {
		t.Fatal(err)
	}
	wantRows := []string{"| storm@redis | retryd@redis | grpc echo | 1 |"}
	if cfg.RatelimitBin != "" {
		wantRows = append(wantRows, "| storm@redis | ratelimit | grpc echo | 1 |", "| storm@redis | retryd@redis | ratelimit | 1 |")
	}
	for _, want := range wantRows {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestStormHeldState checks the storm's chain TTL and abandon grace: the
// defaults and the values given reach the table's header, and a grace
// longer than the TTL is refused before anything is built.
func TestStormHeldState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sc   StormConfig
		want string
	}{
		{StormConfig{Calls: 1, Callers: 1, Memory: true}, "--abandon-grace 1s --chain-ttl 10s"},
		{StormConfig{Calls: 1, Callers: 1, Memory: true, ChainTTL: time.Second, AbandonGrace: 200 * time.Millisecond}, "--abandon-grace 200ms --chain-ttl 1s"},
	} {
		var b strings.Builder
		if err := WriteStormTable(&b, Config{Rounds: 1, Conns: 1}, tc.sc, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("%+v: the table's header lacks %q:\n%s", tc.sc, tc.want, b.String())
		}
		if got := tc.sc.withDefaults().stormRetrydArgs(); !slices.Contains(got, "--chain-ttl") ||
			!strings.Contains(strings.Join(got, " "), tc.want) {
			t.Errorf("%+v: retryd's flags %q lack %q", tc.sc, got, tc.want)
		}
	}
	_, err := RunStorm(context.Background(), Config{Root: t.TempDir(), Rounds: 1, Conns: 1},
		StormConfig{Calls: 1, Callers: 1, Memory: true, ChainTTL: time.Second, AbandonGrace: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "abandon grace") {
		t.Errorf("a grace longer than the chain TTL: %v, want an error naming the abandon grace", err)
	}
}
