// Command retryd-bench runs retryd's load benchmark (package bench) and
// writes a markdown results table to stdout and, with --out, to a file.
//
//	go run ./bench/cmd/retryd-bench [--duration 10s] [--warmup 2s] [--rounds 2]
//	    [--workers 32] [--conns 2] [--rate 2000] [--skip-saturation] [--sessions 10000]
//	    [--gubernator] [--redis-peer [--ratelimit-bin PATH]] [--base-src DIR]
//	    [--retryd-env KEY=VALUE]… [--no-metrics] [--profile DIR]
//	    [--chains 10000,100000,1000000] [--awaiters 100000 [--awaiters-load 32]]
//	    [--scale-src DIR] [--chains-memory-limit 1GiB] [--skip-ab] [--out bench-results.md]
//	go run ./bench/cmd/retryd-bench --all [--ratelimit-bin PATH] --out bench-results.md
//	go run ./bench/cmd/retryd-bench --storm [--storm-calls 60000] [--storm-callers 50] [--rounds 3]
//	    [--storm-herd 2000] [--redis-peer [--ratelimit-bin PATH]] [--profile DIR [--duration 10s]]
//	    [--storm-chain-ttl 10s] [--storm-abandon-grace 1s]
//
// --storm runs the failure storm instead of the A/B modes: each FailedStep
// a new session's first failure, against retryd on the memory store and,
// with --redis-peer, on the Redis store (beside ratelimit with
// --ratelimit-bin); --storm-herd N adds (or alone runs) the herd, N
// sessions per phase failing on one provider with fleet protection on.
// Each is interleaved with the bare echo under the same load. With
// --profile, one more phase per target and scenario, of --duration, is
// profiled after the measured ones.
//
// --all runs every part, as docs/benchmarks.md reports them; flags given
// beside it win.
//
// --redis-peer adds the Redis part: a redis-server of the harness's own,
// retryd on --store redis:// against it ("retryd@redis") and redis-benchmark
// EVALSHA of a token bucket ("redis EVALSHA"). --ratelimit-bin PATH adds
// envoyproxy/ratelimit ("ratelimit") on the same redis-server, saturation
// only; it implies --redis-peer. PATH is a binary of ratelimit's
// ./src/service_cmd that you built yourself, outside this repository: the
// harness never downloads or builds it.
//
// Every server it starts listens on 127.0.0.1 only. See docs/benchmarks.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/retryd/retryd/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process at once
	}()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "retryd-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := bench.DefaultConfig()
	fs := flag.NewFlagSet("retryd-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured time of each phase")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "unmeasured load before each phase")
	fs.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "A/B rounds per mode")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent callers")
	fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "client connections per target")
	fs.IntVar(&cfg.Rate, "rate", cfg.Rate, "fixed-rate mode's requests per second; 0: skip it")
	fs.BoolVar(&cfg.SkipSaturation, "skip-saturation", false, "skip the saturation mode")
	fs.IntVar(&cfg.KeySpace, "sessions", cfg.KeySpace, "session key space")
	fs.IntVar(&cfg.Samples, "samples", cfg.Samples, "latency samples kept per phase")
	fs.BoolVar(&cfg.Gubernator, "gubernator", false, "also run gubernator v2.13.0 (tools/gubernator) single-node on loopback")
	fs.BoolVar(&cfg.RedisPeer, "redis-peer", false, "also run retryd on --store redis:// against a redis-server of its own on loopback, and redis-benchmark EVALSHA of a token bucket against the same server (needs redis-server, redis-benchmark)")
	fs.StringVar(&cfg.RatelimitBin, "ratelimit-bin", "", "also run envoyproxy/ratelimit from this binary (its ./src/service_cmd, built by you outside the repo; never built or downloaded here) on the --redis-peer redis-server, as target ratelimit, saturation only; implies --redis-peer")
	fs.Func("retryd-env", "KEY=VALUE in retryd's environment (repeatable), e.g. GOGC=off", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want KEY=VALUE, got %q", v)
		}
		cfg.RetrydEnv = append(cfg.RetrydEnv, v)
		return nil
	})
	fs.BoolVar(&cfg.NoMetrics, "no-metrics", false, "run retryd without --metrics-listen (and so without otelgrpc); default: metrics on, as deployed")
	fs.IntVar(&cfg.EchoHold, "echo-hold", 0, "also run bench/echo holding this many linked 128-byte objects live (a heap shaped like retryd's state), as target \"grpc echo+held\", and holding the same bytes without pointers, as \"grpc echo+bytes\"; 0: skip")
	fs.StringVar(&cfg.BaseRoot, "base-src", "", "another retryd source tree (e.g. git archive HEAD, unpacked) to run as target retryd@base")
	fs.StringVar(&cfg.ProfileDir, "profile", "", "write CPU, allocation and heap profiles and an execution trace of retryd and the echoes (one extra, unmeasured phase of --duration per target and mode; under --storm, per target and scenario) to this directory")
	out := fs.String("out", "", "also write the table to this file")
	skipAB := fs.Bool("skip-ab", false, "skip the A/B load phases (run only the scale parts)")
	sc := bench.ScaleConfig{AwaitLead: time.Minute, AwaitSpread: 10 * time.Second}
	chains := fs.String("chains", "", "comma-separated checkpoints of open chains at which to read retryd's RSS (e.g. 10000,100000,1000000); empty: skip")
	fs.IntVar(&sc.Awaiters, "awaiters", 0, "concurrent AwaitRetry streams to hold, each awaiting a retry due within --awaiters-spread; 0: skip")
	fs.DurationVar(&sc.AwaitLead, "awaiters-lead", sc.AwaitLead, "time from the start of the awaiters part to the first due retry (the set-up must fit)")
	fs.DurationVar(&sc.AwaitSpread, "awaiters-spread", sc.AwaitSpread, "window over which the awaited retries fall due")
	fs.IntVar(&sc.AwaitLoad, "awaiters-load", 0, "workers running the FailedStep mix while the retries fall due; 0: no load")
	scaleSrc := fs.String("scale-src", "", "build the scale parts' retryd from this source tree (e.g. an older commit, unpacked) instead of this one")
	fs.Func("chains-memory-limit", "run the chains part's retryd in a memory cgroup with this limit (e.g. 1GiB), as a pod with resources.limits.memory (needs root)", func(v string) error {
		n, err := parseBytes(v)
		if err != nil {
			return err
		}
		sc.ChainsMemoryLimit = n
		return nil
	})
	storm := bench.StormConfig{Calls: 60_000, Callers: 50}
	fs.BoolVar(&storm.Memory, "storm", false, "run the failure storm instead of the A/B modes: every FailedStep a new session's first failure, against retryd on the memory store (--abandon-grace and --chain-ttl from --storm-abandon-grace and --storm-chain-ttl, admission bounds off), interleaved with the bare echo; with --redis-peer also on the Redis store (with --ratelimit-bin, beside ratelimit)")
	fs.IntVar(&storm.Herd, "storm-herd", 0, "run the storm's herd (instead of the A/B modes): this many sessions per phase failing on one provider with fleet protection (budget and circuit) on; 0: skip")
	fs.IntVar(&storm.Calls, "storm-calls", storm.Calls, "FailedSteps per phase of --storm")
	fs.IntVar(&storm.Callers, "storm-callers", storm.Callers, "concurrent callers of --storm and --storm-herd")
	fs.DurationVar(&storm.ChainTTL, "storm-chain-ttl", 10*time.Second, "retryd's --chain-ttl under --storm and --storm-herd: how long an idle session's state is held")
	fs.DurationVar(&storm.AbandonGrace, "storm-abandon-grace", time.Second, "retryd's --abandon-grace under --storm and --storm-herd: how long a retry nobody awaits stays pending after it is due")
	all := fs.Bool("all", false, "run every part as docs/benchmarks.md reports it: the A/B modes, --gubernator, --redis-peer (with ratelimit when --ratelimit-bin or $RETRYD_BENCH_RATELIMIT_BIN names its binary), --chains "+allChains+" and --awaiters 100000 (lead 75s, spread 60s); flags given explicitly win")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *all {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		everyPart(&cfg, &sc, chains, set, os.Getenv("RETRYD_BENCH_RATELIMIT_BIN"))
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	cfg.Root = root
	cfg.Log = stderr
	var table strings.Builder
	if storm.Memory || storm.Herd > 0 {
		storm.Redis = storm.Memory && cfg.RedisPeer
		if cfg.RatelimitBin != "" && !storm.Memory {
			return errors.New("--ratelimit-bin with --storm-herd needs --storm: ratelimit runs in the storm's Redis scenario")
		}
		results, err := bench.RunStorm(ctx, cfg, storm)
		if err != nil {
			return err
		}
		if err := bench.WriteStormTable(&table, cfg, storm, results); err != nil {
			return err
		}
		*skipAB = true
	}
	if !*skipAB {
		results, err := bench.Run(ctx, cfg)
		if err != nil {
			return err
		}
		if err := bench.WriteTable(&table, cfg, results); err != nil {
			return err
		}
	}
	if *chains != "" || sc.Awaiters > 0 {
		for _, f := range strings.Split(*chains, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				return fmt.Errorf("--chains: %q is not a positive count", f)
			}
			sc.Chains = append(sc.Chains, n)
		}
		sc.Root, sc.Log, sc.Workers, sc.ProfileDir = root, stderr, cfg.Workers, cfg.ProfileDir
		sc.Env = cfg.RetrydEnv
		if *scaleSrc != "" {
			sc.Root = *scaleSrc
		}
		points, aw, err := bench.RunScale(ctx, sc)
		if err != nil {
			return err
		}
		table.WriteString("\n")
		if err := bench.WriteScaleTable(&table, sc, points, aw); err != nil {
			return err
		}
	}
	fmt.Fprint(stdout, table.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(table.String()), 0o644); err != nil {
			return fmt.Errorf("writing --out: %w", err)
		}
	}
	return nil
}

// allChains are --all's checkpoints of the chains part.
const allChains = "10000,100000,250000,500000,750000,1000000"

// everyPart turns on, for --all, every part a flag does not already
// configure (set holds the flags given): gubernator, the Redis part (with
// ratelimit when ratelimitBin names its binary), memory per chain at
// allChains and 100 000 awaiters, as docs/benchmarks.md runs them.
func everyPart(cfg *bench.Config, sc *bench.ScaleConfig, chains *string, set map[string]bool, ratelimitBin string) {
	cfg.Gubernator, cfg.RedisPeer = true, true
	if !set["ratelimit-bin"] && ratelimitBin != "" {
		cfg.RatelimitBin = ratelimitBin
	}
	if !set["chains"] {
		*chains = allChains
	}
	if !set["awaiters"] {
		sc.Awaiters = 100_000
	}
	if !set["awaiters-lead"] {
		sc.AwaitLead = 75 * time.Second
	}
	if !set["awaiters-spread"] {
		sc.AwaitSpread = 60 * time.Second
	}
}

// moduleRoot is the directory of the main module's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run retryd-bench inside the retryd module")
	}
	return filepath.Dir(mod), nil
}

// parseBytes parses a size: a byte count, or a number with KiB, MiB or GiB.
func parseBytes(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a positive size such as 1073741824 or 1GiB, got %q", v)
	}
	return n * mult, nil
}
