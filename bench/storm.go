package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The storm's scenarios, as its table names them.
const (
	stormScenario      = "storm"
	herdScenario       = "herd"
	redisStormScenario = "storm@redis"
	// herdProvider is the one provider every call of the herd names; the
	// policy file gives it a fleet block.
	herdProvider = "herd"
)

// StormConfig is the failure storm (RunStorm): calls that each open a
// session nobody has seen, so retryd's state grows and expires while it
// runs, against the bare echo under the same load generator.
type StormConfig struct {
	// Calls is the number of FailedSteps in one phase of the storm (and
	// of its Redis scenario); Callers the concurrent callers that make
	// them, back to back.
	Calls, Callers int
	// Memory runs the storm on the memory store ("storm").
	Memory bool
	// Herd, when positive, runs the herd ("herd"): Herd sessions per
	// phase failing on one provider whose fleet protection (budget and
	// circuit) is on, as fast as the callers go.
	Herd int
	// Redis runs the storm on the Redis store ("storm@redis"): retryd on
	// a redis-server of the harness's own, beside envoyproxy/ratelimit on
	// the same server when Config.RatelimitBin names its binary.
	Redis bool
	// ChainTTL and AbandonGrace are retryd's --chain-ttl and
	// --abandon-grace in every scenario (zero: 10 s and 1 s): how long
	// the storm's state is held before it is abandoned and expires.
	ChainTTL, AbandonGrace time.Duration
}

// Defaults of StormConfig.ChainTTL and AbandonGrace.
const (
	defaultStormChainTTL     = 10 * time.Second
	defaultStormAbandonGrace = time.Second
)

// withDefaults fills in the zero durations.
func (sc StormConfig) withDefaults() StormConfig {
	sc.ChainTTL = cmp.Or(sc.ChainTTL, defaultStormChainTTL)
	sc.AbandonGrace = cmp.Or(sc.AbandonGrace, defaultStormAbandonGrace)
	return sc
}

// stormRetrydArgs are retryd's flags in every storm scenario besides
// --store: a due retry nobody awaits is abandoned after the abandon grace
// and an idle session's chains expire after the chain TTL (1 s and 10 s
// by default), so the state a storm leaves behind expires during the run;
// the admission bounds are off, so no call is refused for the state it
// finds.
func (sc StormConfig) stormRetrydArgs() []string {
	return []string{
		"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "info",
		"--abandon-grace", sc.AbandonGrace.String(), "--chain-ttl", sc.ChainTTL.String(),
		"--max-pending-retries-per-tenant", "0", "--max-pending-retries", "0",
		"--max-open-chains-per-tenant", "0", "--max-open-chains", "0",
		"--max-active-sessions-per-tenant", "0", "--max-awaiters", "0",
	}
}

// herdPolicy is the herd's policy file: the herd's provider has a retry
// budget and a circuit, which a herd of first failures opens within its
// first minSamples calls.
const herdPolicy = `providers:
  ` + herdProvider + `:
    fleet:
      capacity: 100
      refillPerSecond: 1
      minSamples: 20
      failureThreshold: 0.5
`

// gcTrace makes a Go server print one line per collection on stderr, from
// which process.gcCPU sums the collector's CPU time.
const gcTrace = "GODEBUG=gctrace=1"

// StormResult is one measured phase of the storm.
type StormResult struct {
	Scenario, Target string
	Round            int
	// Calls were made; Answered got an answer (from retryd: a decision);
	// Fleet were answers the fleet acted on (held, paced or delegated by
	// the budget, the circuit or a fleet-wide Retry-After).
	Calls, Answered, Errors, Fleet int64
	FirstError                     string
	Elapsed                        time.Duration
	P50, P99                       time.Duration
	// ServerCPU is the server's CPU time during the phase; RedisCPU the
	// harness's redis-server's, for the Redis scenario's targets.
	ServerCPU, RedisCPU float64
	// GCCPU is the CPU time of the server's collections during the phase
	// (from GODEBUG=gctrace=1; zero when it printed none).
	GCCPU float64
	// Runtime is the server's Go runtime over the phase, from its
	// /metrics (nil for a server without the Prometheus Go collector).
	Runtime *StormRuntime
}

// StormRuntime is what a server's Go runtime did during a storm phase.
type StormRuntime struct {
	Mallocs, Allocated, GCs float64
}

// RPS is calls per second.
func (r StormResult) RPS() float64 { return float64(r.Calls) / r.Elapsed.Seconds() }

// CPUPerCall is the server's CPU time per call.
func (r StormResult) CPUPerCall() time.Duration {
	if r.Calls == 0 {
		return 0
	}
	return time.Duration(r.ServerCPU / float64(r.Calls) * 1e9)
}

// stormRuntimeMetrics are the samples StormRuntime is read from.
var stormRuntimeMetrics = []string{"go_memstats_mallocs_total", "go_memstats_alloc_bytes_total", "go_gc_duration_seconds_count"}

func stormRuntimeOf(ctx context.Context, p *process) (*StormRuntime, error) {
	if p.metricsAddr == "" {
		return nil, nil
	}
	m, err := scrape(ctx, p, stormRuntimeMetrics...)
	if err != nil || len(m) < len(stormRuntimeMetrics) {
		return nil, err
	}
	return &StormRuntime{Mallocs: m["go_memstats_mallocs_total"], Allocated: m["go_memstats_alloc_bytes_total"], GCs: m["go_gc_duration_seconds_count"]}, nil
}

// stormCase is one scenario: its targets, interleaved, and the calls of
// each phase.
type stormCase struct {
	name    string
	calls   int
	targets []*target
}

// RunStorm builds retryd and bench/echo, starts the scenarios' servers
// (all with GODEBUG=gctrace=1) and runs cfg.Rounds rounds of each
// scenario, each round one phase per target starting one target later
// than the round before, as Run does. Every phase makes its calls with
// fresh session ids (unique across rounds), after cfg.Warmup of the same
// load with ids of its own.
func RunStorm(ctx context.Context, cfg Config, sc StormConfig) ([]StormResult, error) {
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	sc = sc.withDefaults()
	if sc.AbandonGrace < 0 || sc.ChainTTL < sc.AbandonGrace {
		return nil, fmt.Errorf("bench: storm abandon grace %v must be positive and at most the chain TTL %v", sc.AbandonGrace, sc.ChainTTL)
	}
	if sc.Callers < 1 || sc.Calls < 1 || cfg.Conns < 1 || cfg.Rounds < 1 || sc.Herd < 0 {
		return nil, fmt.Errorf("bench: storm callers, calls, conns and rounds must be positive (got %d, %d, %d, %d)",
			sc.Callers, sc.Calls, cfg.Conns, cfg.Rounds)
	}
	if cfg.RatelimitBin != "" {
		if _, err := os.Stat(cfg.RatelimitBin); err != nil {
			return nil, fmt.Errorf("bench: ratelimit binary: %w", err)
		}
		sc.Redis = true
	}
	if !sc.Memory && sc.Herd == 0 && !sc.Redis {
		return nil, fmt.Errorf("bench: no storm scenario chosen")
	}
	bins, err := buildServers(ctx, cfg.Root, "retryd-storm-", logw)
	if err != nil {
		return nil, err
	}
	defer bins.remove()
	dir, retrydBin, echoBin := bins.dir, bins.retryd, bins.echo
	retrydEnv := noTraceEnv(append([]string{gcTrace}, cfg.RetrydEnv...)...)
	// With --profile, retryd and the echo serve net/http/pprof beside
	// their /metrics (ratelimit serves neither: it is not profiled).
	retrydArgs := append(sc.stormRetrydArgs(), cfg.pprofArgs()...)
	var procs []*process
	var rs *redisServer
	var all []*target
	defer func() {
		for _, t := range all {
			for _, c := range t.conns {
				c.Close()
			}
		}
		for _, p := range procs {
			p.stop()
		}
		if rs != nil {
			rs.stop()
		}
	}()
	serve := func(name, bin string, args, env []string, nc newCaller) (*target, error) {
		p, err := startServing(ctx, name, bin, args, env)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		t := &target{name: name, proc: p, new: nc}
		all = append(all, t)
		return t, nil
	}
	echo, err := serve(echoName, echoBin, append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, cfg.pprofArgs()...), []string{gcTrace}, newEchoCaller)
	if err != nil {
		return nil, err
	}
	var cases []stormCase
	if sc.Memory {
		t, err := serve("retryd", retrydBin, append(slices.Clone(retrydArgs), "--store", "memory"), retrydEnv,
			newStormCaller("deepseek", &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429}))
		if err != nil {
			return nil, err
		}
		cases = append(cases, stormCase{name: stormScenario, calls: sc.Calls, targets: []*target{t, echo}})
	}
	if sc.Herd > 0 {
		policy := filepath.Join(dir, "herd-policy.yaml")
		if err := os.WriteFile(policy, []byte(herdPolicy), 0o644); err != nil {
			return nil, err
		}
		t, err := serve("retryd", retrydBin, append(slices.Clone(retrydArgs), "--store", "memory", "--config", policy), retrydEnv,
			newStormCaller(herdProvider, &retrydv1.Failure{Code: "SERVER", HttpStatus: 503}))
		if err != nil {
			return nil, err
		}
		cases = append(cases, stormCase{name: herdScenario, calls: sc.Herd, targets: []*target{t, echo}})
	}
	if sc.Redis {
		if rs, err = startRedis(ctx); err != nil {
			return nil, err
		}
		fmt.Fprintln(logw, "redis-server on", rs.addr, "pid", rs.proc.cmd.Process.Pid)
		t, err := serve(retrydRedisName, retrydBin, append(slices.Clone(retrydArgs), "--store", "redis://"+rs.addr+"/0"), retrydEnv,
			newStormCaller("deepseek", &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429}))
		if err != nil {
			return nil, err
		}
		t.redis = rs
		c := stormCase{name: redisStormScenario, calls: sc.Calls, targets: []*target{t}}
		if cfg.RatelimitBin != "" {
			p, err := startRatelimit(ctx, cfg.RatelimitBin, dir, rs.addr, noTraceEnv(gcTrace))
			if err != nil {
				return nil, err
			}
			procs = append(procs, p)
			fmt.Fprintln(logw, "ratelimit on", p.addr, "pid", p.cmd.Process.Pid)
			rl := &target{name: ratelimitName, proc: p, new: newRatelimitCaller, redis: rs}
			all = append(all, rl)
			c.targets = append(c.targets, rl)
		}
		c.targets = append(c.targets, echo)
		cases = append(cases, c)
	}
	for _, t := range all {
		for range cfg.Conns {
			c, err := grpc.NewClient(t.proc.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, err
			}
			t.conns = append(t.conns, c)
		}
	}
	for _, t := range all {
		if t.name == ratelimitName {
			if err := waitReady(ctx, t, cfg); err != nil {
				return nil, err
			}
			if err := checkLoopbackOnly(t.proc.cmd.Process.Pid); err != nil {
				return nil, err
			}
		}
	}
	var results []StormResult
	phase := 0
	for _, c := range cases {
		for round := 1; round <= cfg.Rounds; round++ {
			byTarget := make([]*StormResult, len(c.targets))
			for k := range c.targets {
				i := (k + round - 1) % len(c.targets)
				t := c.targets[i]
				phase++
				r, err := runStormPhase(ctx, t, cfg, sc, c, round, fmt.Sprintf("s%d-", phase))
				if err != nil {
					return results, err
				}
				fmt.Fprintf(logw, "%-11s %-12s round %d: %8.0f calls/s  p50 %-9v p99 %-9v cpu/call %-8v answered %d/%d errors %d\n",
					r.Scenario, r.Target, r.Round, r.RPS(), r.P50, r.P99, r.CPUPerCall(), r.Answered, r.Calls, r.Errors)
				byTarget[i] = &r
			}
			for _, r := range byTarget {
				results = append(results, *r)
			}
		}
	}
	if cfg.ProfileDir != "" {
		// One unmeasured phase per target and scenario, at saturation like
		// the storm's, for cfg.Duration: <target>.<scenario>.*. The echo
		// answers every scenario's load alike: it is profiled once.
		profiled := map[*target]bool{}
		for _, c := range cases {
			var ts []*target
			for _, t := range c.targets {
				if !profiled[t] {
					profiled[t] = true
					ts = append(ts, t)
				}
			}
			if err := profileTargets(ctx, ts, cfg, profileLoad{label: c.name, workers: sc.Callers, keySpace: c.calls}, logw); err != nil {
				return results, err
			}
		}
	}
	return results, nil
}

// runStormPhase runs c.calls calls of one target: the warm-up, then the
// measured calls, with the server's counters read before and after.
func runStormPhase(ctx context.Context, t *target, cfg Config, sc StormConfig, c stormCase, round int, prefix string) (StormResult, error) {
	res := StormResult{Scenario: c.name, Target: t.name, Round: round}
	newCallers := func(prefix string) []caller {
		callers := make([]caller, sc.Callers)
		for i := range callers {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(i)))
			callers[i] = t.new(t.conns[i%len(t.conns)], i, sc.Callers, c.calls, rng, prefix)
		}
		return callers
	}
	if cfg.Warmup > 0 {
		if _, err := drive(ctx, newCallers(prefix+"warm-"), cfg.Warmup, 0, 0); err != nil {
			return res, err
		}
	}
	callers := newCallers(prefix)
	rt0, err := stormRuntimeOf(ctx, t.proc)
	if err != nil {
		return res, err
	}
	var redis0 float64
	if t.redis != nil {
		if redis0, err = t.redis.proc.cpuSeconds(); err != nil {
			return res, err
		}
	}
	gc0 := t.proc.gcCPU.Load()
	cpu0, err := t.proc.cpuSeconds()
	if err != nil {
		return res, err
	}
	st, err := driveCalls(ctx, callers, int64(c.calls))
	if err != nil {
		return res, err
	}
	cpu1, err := t.proc.cpuSeconds()
	if err != nil {
		return res, err
	}
	gc1 := t.proc.gcCPU.Load()
	if t.redis != nil {
		redis1, err := t.redis.proc.cpuSeconds()
		if err != nil {
			return res, err
		}
		res.RedisCPU = redis1 - redis0
	}
	if rt0 != nil {
		rt1, err := stormRuntimeOf(ctx, t.proc)
		if err != nil {
			return res, err
		}
		if rt1 != nil {
			res.Runtime = &StormRuntime{Mallocs: rt1.Mallocs - rt0.Mallocs, Allocated: rt1.Allocated - rt0.Allocated, GCs: rt1.GCs - rt0.GCs}
		}
	}
	for _, cl := range callers {
		if s, ok := cl.(*stormCaller); ok {
			res.Fleet += s.fleet
		}
	}
	res.Calls, res.Answered, res.Errors, res.FirstError = st.calls, st.measured, st.errors, st.firstError
	res.Elapsed, res.ServerCPU, res.GCCPU = st.elapsed, cpu1-cpu0, float64(gc1-gc0)/1e9
	res.P50, res.P99 = percentile(st.samples, 0.50), percentile(st.samples, 0.99)
	return res, nil
}

// driveCalls makes n calls in total over the callers, each calling back to
// back until none are left, and keeps the latency of every answered call.
func driveCalls(ctx context.Context, callers []caller, n int64) (stats, error) {
	var left atomic.Int64
	left.Store(n)
	per := make([]stats, len(callers))
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &per[i]
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				t0 := time.Now()
				answered, err := c.call(cctx)
				lat := time.Since(t0)
				cancel()
				s.calls++
				if err != nil {
					s.errors++
					if s.firstError == "" {
						s.firstError = err.Error()
					}
					continue
				}
				if answered {
					s.measured++
					s.samples = append(s.samples, lat)
				}
			}
		}()
	}
	wg.Wait()
	out := stats{elapsed: time.Since(start)}
	for _, s := range per {
		out.calls += s.calls
		out.measured += s.measured
		out.errors += s.errors
		if out.firstError == "" {
			out.firstError = s.firstError
		}
		out.samples = append(out.samples, s.samples...)
	}
	return out, ctx.Err()
}

// stormCaller reports, on each call, the first failure of a session
// nobody has seen: turn 1, step 1 of prefix + worker + a counter. It never
// cancels or succeeds: what retryd scheduled is abandoned after the grace
// and the session expires after the chain TTL.
type stormCaller struct {
	client   retrydv1.RetryServiceClient
	id       string
	n        int
	provider string
	failure  *retrydv1.Failure
	// fleet counts answers the fleet acted on.
	fleet int64
}

func newStormCaller(provider string, f *retrydv1.Failure) newCaller {
	return func(conn *grpc.ClientConn, id, workers, keySpace int, rng *rand.Rand, prefix string) caller {
		return &stormCaller{client: retrydv1.NewRetryServiceClient(conn), id: prefix + strconv.Itoa(id) + "-",
			provider: provider, failure: f}
	}
}

// call reports a new session's first failure; it is answered when retryd
// returned a decision.
func (c *stormCaller) call(ctx context.Context) (bool, error) {
	c.n++
	resp, err := c.client.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: c.id + strconv.Itoa(c.n), Turn: 1, Step: 1, Provider: c.provider, Failure: c.failure})
	if err != nil {
		return false, fmt.Errorf("FailedStep: %w", err)
	}
	d := resp.GetDecision()
	if d.GetSchedule() == nil && d.GetDelegate() == nil {
		return false, fmt.Errorf("FailedStep: an answer without a decision")
	}
	switch d.GetSchedule().GetDelaySource() {
	case retrydv1.DelaySource_DELAY_SOURCE_FLEET_BUDGET, retrydv1.DelaySource_DELAY_SOURCE_CIRCUIT_OPEN, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_PACING:
		c.fleet++
	}
	switch d.GetDelegate().GetReason() {
	case retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED, retrydv1.DelegateReason_DELEGATE_REASON_FLEET_CIRCUIT_OPEN:
		c.fleet++
	}
	return true, nil
}
