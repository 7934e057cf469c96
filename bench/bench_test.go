package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
)

// TestSmoke runs the whole harness for about a second with tiny settings
// and checks that it produced a table with calls and no errors, and that
// the echoes that hold a heap held it. It makes no assertion about speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two servers")
	}
	cfg := Config{
		Root:     moduleRoot(t),
		Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 1,
		Workers: 4, Conns: 1, Rate: 200, KeySpace: 50, Samples: 1000,
		EchoHold: 50_000, // 6.4 MB, above the 4 MB heap Go lets the bare echo's garbage reach
	}
	results, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 8 {
		t.Fatalf("got %d phases, want 8 (2 modes × 4 targets)", len(results))
	}
	for _, r := range results {
		if r.Calls == 0 || r.RPS() <= 0 {
			t.Errorf("%s %s: no calls", r.Target, r.Mode)
		}
		if r.Errors != 0 {
			t.Errorf("%s %s: %d errors, first: %s", r.Target, r.Mode, r.Errors, r.FirstError)
		}
		// Both servers' runtime counters come from their /metrics.
		if rt := r.Runtime; rt == nil || rt.Allocated <= 0 || rt.Heap <= 0 || rt.GCs < 0 {
			t.Errorf("%s %s: Go runtime %+v", r.Target, r.Mode, rt)
		}
		if r.ThreadRuns <= 0 { // a server that answered calls ran
			t.Errorf("%s %s: its threads were put on a CPU %d times", r.Target, r.Mode, r.ThreadRuns)
		}
		if r.ClientCPU < 0 {
			t.Errorf("%s %s: load generator CPU %v s", r.Target, r.Mode, r.ClientCPU)
		}
		if held := float64(cfg.EchoHold * 128); (r.Target == heldEchoName || r.Target == bytesEchoName) && r.Runtime != nil && r.Runtime.Heap < held {
			t.Errorf("%s %s: heap %.0f B at the end, below the %.0f B it holds", r.Target, r.Mode, r.Runtime.Heap, held)
		}
	}
	var b strings.Builder
	if err := WriteTable(&b, cfg, results); err != nil {
		t.Fatal(err)
	}
	// The pooled ratio rows need CPU readings above zero, which a tiny run
	// on a busy machine may not get: only the per-round rows are certain.
	for _, want := range []string{"| saturation | 1 | retryd |", "| 200 rps | 1 | grpc echo |", "| saturation | retryd | grpc echo | 1 |",
		"| 200 rps | 1 | grpc echo+held |", "| saturation | grpc echo+held | grpc echo | 1 |",
		"| 200 rps | 1 | grpc echo+bytes |", "| saturation | grpc echo+bytes | grpc echo | 1 |", "| GC cycles / 1 000 calls |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestSmokeProfile runs the harness with --profile for a moment, at
// saturation only, and checks that each server left its CPU and heap
// profiles, its execution trace and a summary that reads them all.
func TestSmokeProfile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two servers, and profiles them")
	}
	dir := t.TempDir()
	cfg := Config{
		Root:     moduleRoot(t),
		Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 1,
		Workers: 4, Conns: 1, KeySpace: 50, Samples: 1000, ProfileDir: dir,
	}
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"retryd.saturation", "grpc-echo.saturation"} {
		checkProfiles(t, dir, name, []string{".cpu.pprof", ".heap.pprof", ".trace", ".sched.pprof"},
			"Where the samples go", "Scheduler latency of an execution trace", "go tool trace -pprof=sched")
	}
}

// checkProfiles checks that dir holds name's profiles, one non-empty file
// per extension in exts, and a summary (name.top.txt) with each of wants.
func checkProfiles(t *testing.T, dir, name string, exts []string, wants ...string) {
	t.Helper()
	for _, ext := range exts {
		if fi, err := os.Stat(filepath.Join(dir, name+ext)); err != nil || fi.Size() == 0 {
			t.Errorf("%s%s: %v", name, ext, err)
		}
	}
	top, err := os.ReadFile(filepath.Join(dir, name+".top.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range wants {
		if !strings.Contains(string(top), want) {
			t.Errorf("%s.top.txt lacks %q:\n%s", name, want, top)
		}
	}
}

// TestSmokeRedisPeer runs the Redis part (Config.RedisPeer) for a moment:
// retryd on a redis-server of the harness's own and redis-benchmark's
// EVALSHA against it. It checks calls, no errors and Redis counters, and
// makes no assertion about speed. It needs redis-server and
// redis-benchmark (Debian: redis-server, redis-tools).
func TestSmokeRedisPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three servers")
	}
	needPrograms(t, "redis-server", "redis-benchmark")
	cfg := Config{
		Root:     moduleRoot(t),
		Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 1,
		Workers: 4, Conns: 1, KeySpace: 50, Samples: 1000, RedisPeer: true,
	}
	results, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, r := range results {
		targets = append(targets, r.Target)
		if r.Calls == 0 || r.RPS() <= 0 {
			t.Errorf("%s %s: no calls", r.Target, r.Mode)
		}
		if r.Errors != 0 {
			t.Errorf("%s %s: %d errors, first: %s", r.Target, r.Mode, r.Errors, r.FirstError)
		}
		if redisPart := r.Target == retrydRedisName || r.Target == peerName; redisPart != (r.Redis != nil) {
			t.Errorf("%s: Redis counters %v", r.Target, r.Redis)
		} else if redisPart && r.Redis.Commands < r.Calls {
			t.Errorf("%s: %d Redis commands for %d calls", r.Target, r.Redis.Commands, r.Calls)
		}
	}
	if want := []string{"retryd", "grpc echo", retrydRedisName, peerName}; !slices.Equal(targets, want) {
		t.Fatalf("phases of %v, want %v (saturation only)", targets, want)
	}
	var b strings.Builder
	if err := WriteTable(&b, cfg, results); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| saturation | 1 | retryd@redis |", "| saturation | 1 | redis EVALSHA |", "EVALSHA calls/s |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestParseRedisInfo(t *testing.T) {
	info := "# Stats\r\ntotal_commands_processed:100005\r\ntotal_net_input_bytes:2560664\r\n" +
		"total_net_output_bytes:1200\r\ntotal_reads_processed:20041\r\n\r\n# Commandstats\r\n" +
		"cmdstat_evalsha:calls=20000,usec=395964,usec_per_call=19.80,rejected_calls=1,failed_calls=2\r\n" +
		"cmdstat_hset:calls=20000,usec=15789,usec_per_call=0.79,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=1,usec_per_call=0.1,rejected_calls=0,failed_calls=0\r\n"
	st := parseRedisInfo(info)
	if st.Commands != 40000 || st.ByCommand["evalsha"] != 20000 || st.ByCommand["info"] != 0 || st.Failed != 3 ||
		st.Reads != 20041 || st.NetIn != 2560664 || st.NetOut != 1200 ||
		st.UsecByCommand["evalsha"] != 395964 || st.UsecByCommand["hset"] != 15789 || st.UsecByCommand["info"] != 0 {
		t.Fatalf("parsed %+v", st)
	}
	d := st.sub(RedisStats{Commands: 10, Reads: 41, ByCommand: map[string]int64{"hset": 20000},
		UsecByCommand: map[string]int64{"hset": 15789, "evalsha": 964}})
	if d.Commands != 39990 || d.Reads != 20000 || d.ByCommand["evalsha"] != 20000 || len(d.ByCommand) != 1 ||
		d.UsecByCommand["evalsha"] != 395000 || len(d.UsecByCommand) != 1 {
		t.Fatalf("difference %+v", d)
	}
}

// moduleRoot is the directory of this module's go.mod, the harness's Root.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// needPrograms skips the test unless every program is installed, or fails
// it with RETRYD_REQUIRE_TOOLS=1 (retrydtest.NeedProgram). Each of them
// comes with Debian's redis-tools or redis-server.
func needPrograms(t *testing.T, programs ...string) {
	t.Helper()
	for _, p := range programs {
		retrydtest.NeedProgram(t, p, "apt-get install -y redis-server redis-tools")
	}
}
