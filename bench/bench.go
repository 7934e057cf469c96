// Package bench is retryd's load benchmark: it builds retryd (memory
// store) and bench/echo, a bare grpc-go unary server, optionally runs
// gubernator, starts each on loopback and drives it with a built-in Go
// load generator, A/B/A/B interleaved, measuring requests per second,
// p50/p99 latency and the server's own CPU time per request (utime+stime
// from /proc/<pid>/stat). With Config.RedisPeer it also runs retryd on a
// redis-server of its own and redis-benchmark's EVALSHA against the same
// server (redispeer.go), and with Config.RatelimitBin envoyproxy/ratelimit
// on that server too (ratelimit.go). RunStorm (storm.go) is the failure
// storm: every FailedStep a new session's first failure, on the memory
// and Redis stores and as a herd on one fleet-protected provider. Run it with
// go run ./bench/cmd/retryd-bench; docs/benchmarks.md describes the load
// and the numbers.
package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The baselines' target names.
const (
	echoName       = "grpc echo"
	heldEchoName   = "grpc echo+held"
	bytesEchoName  = "grpc echo+bytes"
	gubernatorName = "gubernator"
)

// Config is one benchmark run.
type Config struct {
	// Root is the repository root (the directory of go.mod).
	Root string
	// Duration is the measured time of one phase; Warmup runs before it,
	// unmeasured.
	Duration, Warmup time.Duration
	// Rounds is how many times each target runs per mode (A/B/A/B…).
	Rounds int
	// Workers is the number of concurrent callers; Conns the number of
	// client connections they share round-robin.
	Workers, Conns int
	// Rate is the fixed-rate mode's requests per second; 0 skips it.
	Rate int
	// SkipSaturation skips the saturation mode.
	SkipSaturation bool
	// KeySpace is the number of sessions (gubernator: rate limit keys).
	KeySpace int
	// Samples bounds the latency samples kept per phase.
	Samples int
	// Gubernator adds gubernator v2.13.0 (built from tools/gubernator) as
	// a third target.
	Gubernator bool
	// BaseRoot, when set, is another source tree of retryd (for example
	// `git archive HEAD` unpacked in a scratch directory) whose
	// ./cmd/retryd runs as one more target, "retryd@base", under the same
	// load and interleaved with the others: a before/after comparison in
	// one run.
	BaseRoot string
	// RetrydEnv are extra KEY=VALUE environment variables of retryd (for
	// example GOGC or GOMEMLIMIT, to see how much of its cost is the GC's).
	RetrydEnv []string
	// NoMetrics runs retryd without its metrics listener (so without
	// otelgrpc, which it installs only when tracing or metrics are on);
	// the default is the Helm chart's deployment, metrics on. Profiling
	// needs the listener, so ProfileDir overrides it.
	NoMetrics bool
	// EchoHold, when positive, adds two targets: "grpc echo+held",
	// bench/echo holding EchoHold linked objects live (--hold), a heap
	// shaped like retryd's state, and "grpc echo+bytes", holding the same
	// bytes without pointers (--hold-pointers=false); both interleaved with
	// the others and compared with the bare echo. They measure what holding
	// state costs grpc-go's server by itself, through the collector, and
	// how much of it is the pointers the collector must follow.
	EchoHold int
	// ProfileDir, when set, starts retryd with --pprof and bench/echo with
	// --pprof, and after the measured phases runs one unmeasured phase of
	// Duration per target and mode (RunStorm: per target and scenario)
	// while collecting its CPU, allocation and heap profiles into this
	// directory (see profileTarget).
	ProfileDir string
	// RedisPeer adds the Redis part (redispeer.go): a redis-server of the
	// harness's own on loopback, retryd on --store redis://… against it
	// ("retryd@redis", every mode) and redis-benchmark running EVALSHA of
	// a token-bucket script against the same server ("redis EVALSHA",
	// saturation only: redis-benchmark has no fixed rate), interleaved
	// with the other targets. Needs redis-server and redis-benchmark.
	RedisPeer bool
	// RatelimitBin, when set, is an envoyproxy/ratelimit binary (its
	// src/service_cmd, built by the user: the harness never builds or
	// downloads it) to run as one more target of the Redis part,
	// "ratelimit", on the same redis-server (ratelimit.go): one
	// ShouldRateLimit call per decision, saturation only, interleaved with
	// the other targets. It implies RedisPeer.
	RatelimitBin string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// DefaultConfig is the full run of docs/benchmarks.md.
func DefaultConfig() Config {
	return Config{
		Duration: 10 * time.Second, Warmup: 2 * time.Second, Rounds: 2,
		Workers: 32, Conns: 2, Rate: 2000, KeySpace: 10_000, Samples: 200_000,
	}
}

// Result is one measured phase.
type Result struct {
	Target string
	Mode   string // "saturation" or "<rate> rps"
	Round  int
	// Calls are all RPCs; Measured the ones whose latency is reported
	// (FailedStep for retryd).
	Calls, Measured, Errors int64
	// Missed counts fixed-rate ticks no worker was free for.
	Missed     int64
	FirstError string
	Elapsed    time.Duration
	P50, P99   time.Duration
	// ServerCPU is the server process's CPU time during the phase (for
	// the Redis peer: redis-server's).
	ServerCPU float64
	// Redis are the harness's redis-server's counters over the phase, for
	// the targets of the Redis part (nil otherwise).
	Redis *RedisStats
	// ClientCPU is this process's CPU time during the phase: the load
	// generator's, which shares the machine's cores with the server.
	ClientCPU float64
	// ThreadRuns is how often the server's threads were put on a CPU
	// during the phase (schedStats): its wake-ups, about.
	ThreadRuns int64
	// Runtime is the server's Go runtime over the phase, for retryd and
	// echo, whose /metrics have the Prometheus Go collector (nil
	// otherwise).
	Runtime *GoRuntime
}

// GoRuntime is what a server's Go runtime did during a phase, from its
// Prometheus Go collector.
type GoRuntime struct {
	GCs       float64 // completed GC cycles
	Allocated float64 // bytes allocated on the heap
	Heap      float64 // heap objects' bytes (live and not yet swept) at the end
}

// goRuntimeMetrics are the samples GoRuntime is read from.
var goRuntimeMetrics = []string{"go_gc_duration_seconds_count", "go_memstats_alloc_bytes_total", "go_memstats_heap_alloc_bytes"}

// goRuntimeOf reads p's runtime counters, or nil when p has no /metrics.
func goRuntimeOf(ctx context.Context, p *process) (*GoRuntime, error) {
	if p.metricsAddr == "" {
		return nil, nil
	}
	m, err := scrape(ctx, p, goRuntimeMetrics...)
	if err != nil || len(m) < len(goRuntimeMetrics) {
		return nil, err // not a Go server with the Prometheus Go collector
	}
	return &GoRuntime{GCs: m["go_gc_duration_seconds_count"], Allocated: m["go_memstats_alloc_bytes_total"], Heap: m["go_memstats_heap_alloc_bytes"]}, nil
}

// RPS is calls per second.
func (r Result) RPS() float64 { return float64(r.Calls) / r.Elapsed.Seconds() }

// CPUPerCall is the server's CPU time per call.
func (r Result) CPUPerCall() time.Duration {
	if r.Calls == 0 {
		return 0
	}
	return time.Duration(r.ServerCPU / float64(r.Calls) * 1e9)
}

// target is one running server and how to load it.
type target struct {
	name  string
	proc  *process
	conns []*grpc.ClientConn
	new   newCaller
	// redis is the redis-server the target uses (Redis part only).
	redis *redisServer
	// peer marks the redis-benchmark target; peerRate is its last rate.
	peer     bool
	peerRate float64
	// saturationOnly skips the target in the fixed-rate mode.
	saturationOnly bool
}

// Run builds and starts the servers, runs every phase and stops the
// servers. It returns the results in the order they ran.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	if cfg.Workers < 1 || cfg.Conns < 1 || cfg.Rounds < 1 || cfg.Duration <= 0 {
		return nil, fmt.Errorf("bench: workers, conns, rounds and duration must be positive (got %d, %d, %d, %v)",
			cfg.Workers, cfg.Conns, cfg.Rounds, cfg.Duration)
	}
	if cfg.RatelimitBin != "" {
		if _, err := os.Stat(cfg.RatelimitBin); err != nil {
			return nil, fmt.Errorf("bench: ratelimit binary: %w", err)
		}
		cfg.RedisPeer = true
	}
	bins, err := buildServers(ctx, cfg.Root, "retryd-bench-", logw)
	if err != nil {
		return nil, err
	}
	defer bins.remove()
	dir, retrydBin, echoBin := bins.dir, bins.retryd, bins.echo
	var targets []*target
	var rs *redisServer
	defer func() {
		for _, t := range targets {
			for _, c := range t.conns {
				c.Close()
			}
			if !t.peer {
				t.proc.stop()
			}
		}
		if rs != nil {
			rs.stop()
		}
	}()
	// The metrics listener is on, as the Helm chart deploys retryd; nothing
	// scrapes it during the run.
	retrydArgs := []string{"serve", "--listen", "127.0.0.1:0", "--store", "memory", "--log-format", "json", "--log-level", "info"}
	if !cfg.NoMetrics || cfg.ProfileDir != "" {
		retrydArgs = append(retrydArgs, "--metrics-listen", "127.0.0.1:0")
	}
	// echo's metrics listener serves only its runtime counters (no
	// interceptor), read between phases as retryd's are.
	echoArgs := []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}
	mainArgs := append(slices.Clone(retrydArgs), cfg.pprofArgs()...)
	echoArgs = append(echoArgs, cfg.pprofArgs()...)
	p, err := startServing(ctx, "retryd", retrydBin, mainArgs, noTraceEnv(cfg.RetrydEnv...))
	if err != nil {
		return nil, err
	}
	targets = append(targets, &target{name: "retryd", proc: p, new: newRetrydCaller})
	if cfg.BaseRoot != "" {
		fmt.Fprintln(logw, "building retryd@base from", cfg.BaseRoot)
		baseBin, err := build(ctx, cfg.BaseRoot, dir, "retryd-base", "./cmd/retryd", "")
		if err != nil {
			return nil, err
		}
		p, err := startServing(ctx, "retryd@base", baseBin, retrydArgs, noTraceEnv())
		if err != nil {
			return nil, err
		}
		targets = append(targets, &target{name: "retryd@base", proc: p, new: newRetrydCaller})
	}
	p, err = startServing(ctx, "echo", echoBin, echoArgs, nil)
	if err != nil {
		return nil, err
	}
	targets = append(targets, &target{name: echoName, proc: p, new: newEchoCaller})
	if cfg.EchoHold > 0 {
		for _, h := range []struct {
			name     string
			pointers bool
		}{{heldEchoName, true}, {bytesEchoName, false}} {
			args := append(slices.Clone(echoArgs), "--hold", strconv.Itoa(cfg.EchoHold), "--hold-pointers="+strconv.FormatBool(h.pointers))
			p, err := startServing(ctx, h.name, echoBin, args, nil)
			if err != nil {
				return nil, err
			}
			targets = append(targets, &target{name: h.name, proc: p, new: newEchoCaller})
		}
	}
	if cfg.RedisPeer {
		if rs, err = startRedis(ctx); err != nil {
			return nil, err
		}
		fmt.Fprintln(logw, "redis-server on", rs.addr, "pid", rs.proc.cmd.Process.Pid)
		args := slices.Clone(mainArgs) // with --pprof under --profile
		args[slices.Index(args, "--store")+1] = "redis://" + rs.addr + "/0"
		p, err := startServing(ctx, retrydRedisName, retrydBin, args, noTraceEnv(cfg.RetrydEnv...))
		if err != nil {
			return nil, err
		}
		targets = append(targets, &target{name: retrydRedisName, proc: p, new: newRetrydCaller, redis: rs},
			&target{name: peerName, proc: rs.proc, redis: rs, peer: true, saturationOnly: true})
	}
	var rl *target
	if cfg.RatelimitBin != "" {
		p, err := startRatelimit(ctx, cfg.RatelimitBin, dir, rs.addr, noTraceEnv())
		if err != nil {
			return nil, err
		}
		fmt.Fprintln(logw, "ratelimit on", p.addr, "pid", p.cmd.Process.Pid)
		rl = &target{name: ratelimitName, proc: p, new: newRatelimitCaller, redis: rs, saturationOnly: true}
		targets = append(targets, rl)
	}
	if cfg.Gubernator {
		fmt.Fprintln(logw, "building gubernator v2.13.0 from tools/gubernator")
		p, err := startGubernator(ctx, cfg.Root, dir, noTraceEnv())
		if err != nil {
			return nil, err
		}
		targets = append(targets, &target{name: gubernatorName, proc: p, new: newGubernatorCaller})
	}
	for _, t := range targets {
		if t.peer {
			continue
		}
		for range cfg.Conns {
			c, err := grpc.NewClient(t.proc.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, err
			}
			t.conns = append(t.conns, c)
		}
	}
	if cfg.Gubernator {
		if err := waitReady(ctx, targets[len(targets)-1], cfg); err != nil {
			return nil, err
		}
	}
	if rl != nil {
		if err := waitReady(ctx, rl, cfg); err != nil {
			return nil, err
		}
		if err := checkLoopbackOnly(rl.proc.cmd.Process.Pid); err != nil {
			return nil, err
		}
	}
	var modes []int // 0: saturation, else the fixed rate
	if !cfg.SkipSaturation {
		modes = append(modes, 0)
	}
	if cfg.Rate > 0 {
		modes = append(modes, cfg.Rate)
	}
	var results []Result
	phase := 0
	for _, rate := range modes {
		for round := 1; round <= cfg.Rounds; round++ {
			// Each round starts one target later than the one before, so
			// no target always runs first, or always right after the
			// same other one's load. Its results are kept in target order.
			byTarget := make([]*Result, len(targets))
			for k := range targets {
				i := (k + round - 1) % len(targets)
				t := targets[i]
				if t.saturationOnly && rate > 0 {
					continue // redis-benchmark has no fixed-rate mode; ratelimit runs beside it
				}
				phase++
				r, err := runPhase(ctx, t, cfg, rate, round, fmt.Sprintf("p%d-", phase))
				if err != nil {
					return appendDone(results, byTarget), err
				}
				fmt.Fprintf(logw, "%-10s %-11s round %d: %8.0f rps  p50 %-9v p99 %-9v cpu/call %-8v errors %d\n",
					r.Target, r.Mode, r.Round, r.RPS(), r.P50, r.P99, r.CPUPerCall(), r.Errors)
				byTarget[i] = &r
			}
			results = appendDone(results, byTarget)
		}
	}
	if rl != nil {
		// Every socket it opened during the run, too.
		if err := checkLoopbackOnly(rl.proc.cmd.Process.Pid); err != nil {
			return results, err
		}
	}
	if cfg.ProfileDir != "" {
		for _, rate := range modes {
			var ts []*target
			for _, t := range targets {
				if !t.peer && (!t.saturationOnly || rate == 0) {
					ts = append(ts, t)
				}
			}
			if err := profileTargets(ctx, ts, cfg, profileLoad{label: modeLabel(rate), rate: rate, workers: cfg.Workers, keySpace: cfg.KeySpace}, logw); err != nil {
				return results, err
			}
		}
	}
	return results, nil
}

// appendDone appends the results of a round that were made, in target
// order.
func appendDone(results []Result, byTarget []*Result) []Result {
	for _, r := range byTarget {
		if r != nil {
			results = append(results, *r)
		}
	}
	return results
}

// servers are retryd and bench/echo, built into a scratch directory of
// their own (dir, where a run may also write files its servers read).
type servers struct{ dir, retryd, echo string }

// buildServers makes the scratch directory (named after pattern, see
// os.MkdirTemp) and builds retryd (./cmd/retryd of root) and bench/echo
// into it. The caller removes it with remove.
func buildServers(ctx context.Context, root, pattern string, logw io.Writer) (*servers, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return nil, err
	}
	s := &servers{dir: dir}
	fmt.Fprintln(logw, "building retryd and bench/echo")
	if s.retryd, err = build(ctx, root, dir, "retryd", "./cmd/retryd", ""); err != nil {
		s.remove()
		return nil, err
	}
	if s.echo, err = build(ctx, root, dir, "echo", "./bench/echo", ""); err != nil {
		s.remove()
		return nil, err
	}
	return s, nil
}

func (s *servers) remove() { os.RemoveAll(s.dir) }

// noTraceEnv is the environment that keeps a server's tracing and OTLP
// export a no-op even when the caller's environment configures an
// exporter, followed by extra.
func noTraceEnv(extra ...string) []string {
	return append([]string{"OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="}, extra...)
}

// pprofArgs are the flags that make retryd and bench/echo serve
// net/http/pprof on their metrics listener, when the run profiles.
func (cfg Config) pprofArgs() []string {
	if cfg.ProfileDir == "" {
		return nil
	}
	return []string{"--pprof"}
}

// modeLabel names an A/B mode: "saturation" (rate 0) or "<rate> rps".
func modeLabel(rate int) string {
	if rate > 0 {
		return fmt.Sprintf("%d rps", rate)
	}
	return "saturation"
}

// waitReady retries one call until t answers (gubernator joins its own
// member list after it listens), for at most 30 s.
func waitReady(ctx context.Context, t *target, cfg Config) error {
	c := t.new(t.conns[0], 0, 1, cfg.KeySpace, rand.New(rand.NewPCG(1, 1)), "ready-")
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.call(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not answer within 30s: %w\n%s", t.name, err, t.proc.logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startGubernator builds gubernator from the tools module and runs it as a
// single node bound to loopback only: gRPC and HTTP on reserved loopback
// ports, member-list discovery (its default) with its gossip bound and
// advertised on a loopback port too, its only known node itself.
func startGubernator(ctx context.Context, root, dir string, env []string) (*process, error) {
	bin, err := build(ctx, filepath.Join(root, "tools", "gubernator"), dir, "gubernator",
		"github.com/gubernator-io/gubernator/v2/cmd/gubernator", "")
	if err != nil {
		return nil, err
	}
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	env = append(env,
		"GUBER_GRPC_ADDRESS="+addrs[0],
		"GUBER_HTTP_ADDRESS="+addrs[1],
		"GUBER_ADVERTISE_ADDRESS="+addrs[0],
		"GUBER_PEER_DISCOVERY_TYPE=member-list",
		"GUBER_MEMBERLIST_ADDRESS="+addrs[2],
		"GUBER_MEMBERLIST_BIND_ADDRESS="+addrs[2],
		"GUBER_MEMBERLIST_ADVERTISE_ADDRESS="+addrs[0],
		"GUBER_MEMBERLIST_KNOWN_NODES="+addrs[2],
		"GUBER_LOG_LEVEL=warn",
	)
	p, _, err := start(ctx, "gubernator", bin, nil, env)
	if err != nil {
		return nil, err
	}
	p.addr = addrs[0]
	return p, nil
}

// runPhase runs one target in one mode: warm-up, then the measured
// duration.
func runPhase(ctx context.Context, t *target, cfg Config, rate, round int, prefix string) (Result, error) {
	mode := modeLabel(rate)
	if t.peer {
		return runPeerPhase(ctx, t, cfg, round, "peer:"+prefix)
	}
	res := Result{Target: t.name, Mode: mode, Round: round}
	callers := make([]caller, cfg.Workers)
	for i := range callers {
		rng := rand.New(rand.NewPCG(uint64(round), uint64(i)))
		callers[i] = t.new(t.conns[i%len(t.conns)], i, cfg.Workers, cfg.KeySpace, rng, prefix)
	}
	if cfg.Warmup > 0 {
		if _, err := drive(ctx, callers, cfg.Warmup, rate, 0); err != nil {
			return res, err
		}
	}
	var redis0 RedisStats
	if t.redis != nil {
		var err error
		if redis0, err = t.redis.snapshot(ctx); err != nil {
			return res, err
		}
	}
	rt0, err := goRuntimeOf(ctx, t.proc)
	if err != nil {
		return res, err
	}
	cpu0, err := t.proc.cpuSeconds()
	if err != nil {
		return res, err
	}
	_, runs0, err := schedStats(t.proc.cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	client0, err := procCPU(os.Getpid())
	if err != nil {
		return res, err
	}
	st, err := drive(ctx, callers, cfg.Duration, rate, max(cfg.Samples/cfg.Workers, 1))
	if err != nil {
		return res, err
	}
	cpu1, err := t.proc.cpuSeconds()
	if err != nil {
		return res, err
	}
	client1, err := procCPU(os.Getpid())
	if err != nil {
		return res, err
	}
	_, runs1, err := schedStats(t.proc.cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	res.ThreadRuns, res.ClientCPU = runs1-runs0, client1-client0
	if rt0 != nil {
		rt1, err := goRuntimeOf(ctx, t.proc)
		if err != nil {
			return res, err
		}
		if rt1 != nil {
			res.Runtime = &GoRuntime{GCs: rt1.GCs - rt0.GCs, Allocated: rt1.Allocated - rt0.Allocated, Heap: rt1.Heap}
		}
	}
	if t.redis != nil {
		redis1, err := t.redis.snapshot(ctx)
		if err != nil {
			return res, err
		}
		d := redis1.sub(redis0)
		res.Redis = &d
	}
	res.Calls, res.Measured, res.Errors, res.Missed, res.FirstError = st.calls, st.measured, st.errors, st.missed, st.firstError
	res.Elapsed = st.elapsed
	res.ServerCPU = cpu1 - cpu0
	res.P50, res.P99 = percentile(st.samples, 0.50), percentile(st.samples, 0.99)
	return res, nil
}

type stats struct {
	calls, measured, errors, missed int64
	firstError                      string
	elapsed                         time.Duration
	samples                         []time.Duration
}

// drive runs every caller on its own goroutine for d. With rate 0 each
// calls back to back (closed loop, saturation); otherwise a 1 ms ticker
// releases rate·elapsed calls in total to whichever worker is free, and a
// call no worker was free for is counted as missed (open loop, no
// queueing). Each worker keeps a uniform reservoir of at most keep
// latency samples of its measured calls.
func drive(ctx context.Context, callers []caller, d time.Duration, rate, keep int) (stats, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var tokens chan struct{}
	var missed int64
	var tickWG sync.WaitGroup
	if rate > 0 {
		tokens = make(chan struct{}, len(callers))
		tickWG.Add(1)
		go func() {
			defer tickWG.Done()
			defer close(tokens)
			start := time.Now()
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			var sent int64
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tick.C:
					due := int64(now.Sub(start).Seconds() * float64(rate))
					for ; sent < due; sent++ {
						select {
						case tokens <- struct{}{}:
						default:
							missed++
						}
					}
				}
			}
		}()
	}
	per := make([]stats, len(callers))
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &per[i]
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for {
				if tokens != nil {
					if _, ok := <-tokens; !ok {
						return
					}
				}
				if ctx.Err() != nil {
					return
				}
				// A call started before the end runs to completion (and
				// counts), so no session is left in a state its worker
				// does not know.
				cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				t0 := time.Now()
				measured, err := c.call(cctx)
				lat := time.Since(t0)
				ccancel()
				s.calls++
				if err != nil {
					s.errors++
					if s.firstError == "" {
						s.firstError = err.Error()
					}
					continue
				}
				if !measured || keep == 0 {
					continue
				}
				s.measured++
				if len(s.samples) < keep {
					s.samples = append(s.samples, lat)
				} else if j := rng.Int64N(s.measured); j < int64(keep) {
					s.samples[j] = lat
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	tickWG.Wait()
	out := stats{elapsed: elapsed, missed: missed}
	for _, s := range per {
		out.calls += s.calls
		out.measured += s.measured
		out.errors += s.errors
		if out.firstError == "" {
			out.firstError = s.firstError
		}
		out.samples = append(out.samples, s.samples...)
	}
	if err := context.Cause(ctx); ctx.Err() != nil && err != context.DeadlineExceeded {
		return out, err
	}
	return out, nil
}

// percentile of samples by nearest rank (samples is sorted in place).
func percentile(samples []time.Duration, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	slices.Sort(samples)
	i := int(q*float64(len(samples))+0.5) - 1
	return samples[min(max(i, 0), len(samples)-1)]
}
