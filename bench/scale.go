package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/memcg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// ScaleConfig is a scale run: memory per open chain, and many concurrent
// AwaitRetry streams with the lateness of their starts. Each part starts a
// retryd (memory store) of its own, so it begins from an empty heap.
type ScaleConfig struct {
	// Root is the source tree retryd is built from: the repository root,
	// or another tree (an older commit) to measure it the same way.
	Root string
	// Chains are the checkpoints (total open chains) at which the chains
	// part reads retryd's RSS and heap; empty skips the part.
	Chains []int
	// Awaiters is how many AwaitRetry streams the awaiters part holds at
	// once; 0 skips it.
	Awaiters int
	// AwaitLead is how long after the part begins the first retry is due;
	// every session and stream must be set up by then. AwaitSpread is the
	// window over which the due times are spread evenly.
	AwaitLead, AwaitSpread time.Duration
	// AwaitLoad, when positive, runs the FailedStep mix of the main
	// benchmark with this many workers on other sessions while the retries
	// fall due: timer precision under load.
	AwaitLoad int
	// Workers make the calls that set the parts up.
	Workers int
	// ProfileDir, when set, receives a heap profile of retryd at the last
	// chains checkpoint (chains.heap.pprof) and with every awaiter
	// connected (awaiters.heap.pprof), and a CPU profile of the window in
	// which the awaited retries fall due (awaiters.cpu.pprof).
	ProfileDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Env are extra KEY=VALUE environment variables of the scale parts'
	// retryd (--retryd-env: GOGC, GOMEMLIMIT).
	Env []string
	// ChainsMemoryLimit, when positive, runs the chains part's retryd in a
	// memory cgroup of its own with this limit in bytes, as a pod with
	// resources.limits.memory runs it (internal/memcg: needs root and a
	// writable cgroup hierarchy). Passing the limit kills it, which fails
	// the part.
	ChainsMemoryLimit int64
}

// ChainPoint is one checkpoint of the chains part.
type ChainPoint struct {
	Chains   int
	RSS      int64 // bytes, VmRSS of the retryd process
	HeapLive int64 // bytes, go_memstats_heap_alloc_bytes (live and not yet collected)
	Elapsed  time.Duration
	// CgroupPeak is the most memory the cgroup's retryd used so far, as
	// the kernel counts it against the limit (with ChainsMemoryLimit).
	CgroupPeak int64
}

// AwaitResult is the awaiters part's outcome.
type AwaitResult struct {
	Awaiters    int
	Conns       int
	LoadWorkers int
	LoadCalls   int64
	// SetupRate is sessions plus streams set up per second.
	SetupRate float64
	// RSSBefore and RSSAwaiting are retryd's RSS before the part and with
	// every stream open (each session holding its pending retry).
	RSSBefore, RSSAwaiting int64
	// LateAwaiters counts streams that were registered only after their
	// retry was due (the lead was too short for this machine).
	LateAwaiters int
	// Server lateness: Started.started_at − due_at (both retryd's clock).
	// Client lateness: arrival of Started at the harness − due_at.
	Server, Client []time.Duration
	Errors         int64
	FirstError     string
	// From the first due time until every stream got its Started: the
	// window's wall time, retryd's CPU time, the time its threads waited
	// for a CPU while runnable (Linux schedstat), and the machine's load
	// average at its end. Zero when not measured.
	Window, WindowRunWait time.Duration
	WindowCPU             float64 // seconds
	WindowLoad            string
}

// RunScale runs the parts cfg asks for.
func RunScale(ctx context.Context, cfg ScaleConfig) ([]ChainPoint, *AwaitResult, error) {
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	if cfg.Workers < 1 {
		cfg.Workers = 32
	}
	dir, err := os.MkdirTemp("", "retryd-scale-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(logw, "building retryd")
	bin, err := build(ctx, cfg.Root, dir, "retryd", "./cmd/retryd", "")
	if err != nil {
		return nil, nil, err
	}
	var points []ChainPoint
	if len(cfg.Chains) > 0 {
		if points, err = runChains(ctx, cfg, bin, logw); err != nil {
			return points, nil, err
		}
	}
	var aw *AwaitResult
	if cfg.Awaiters > 0 {
		if aw, err = runAwaiters(ctx, cfg, bin, logw); err != nil {
			return points, aw, err
		}
	}
	return points, aw, nil
}

// admissionFlags are retryd's admission-control bounds; a scale part
// measures what a million chains or 100 000 streams cost, so it lifts
// them (0: unlimited) when the binary has them.
var admissionFlags = []string{
	"max-pending-retries-per-tenant", "max-pending-retries", "max-open-chains-per-tenant",
	"max-open-chains", "max-active-sessions-per-tenant", "max-awaiters",
}

// startScaleRetryd starts a retryd for one part: memory store, tracing
// off, metrics on (its heap figures are read from /metrics), admission
// bounds lifted, up to 1 000 000 concurrent streams per connection.
func startScaleRetryd(ctx context.Context, bin string, env []string, g *memcg.Group, extra ...string) (*process, error) {
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--store", "memory", "--log-format", "json",
		"--log-level", "info", "--metrics-listen", "127.0.0.1:0"}, extra...)
	help, _ := exec.CommandContext(ctx, bin, "serve", "-h").CombinedOutput()
	if strings.Contains(string(help), "-pprof\n") || strings.Contains(string(help), "-pprof ") {
		args = append(args, "--pprof") // older builds have no profiles
	}
	for _, f := range admissionFlags {
		if strings.Contains(string(help), "-"+f+" ") {
			args = append(args, "--"+f, "0")
		}
	}
	prog := bin
	if g != nil {
		prog, args = g.Wrap(bin, args...)
	}
	return startServing(ctx, "retryd", prog, args,
		append([]string{"OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="}, env...))
}

// longPolicy keeps a scheduled retry pending for an hour: a chain that
// stays open for the whole part.
var longPolicy = &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
	InitialDelayMs: proto.Uint64(3_600_000), MaxDelayMs: proto.Uint64(3_600_000), JitterRatio: proto.Float64(0)}}

// runChains opens chains (one session, one FailedStep scheduling a retry
// due in an hour) through gRPC up to each checkpoint and reads retryd's
// memory there, after a short settle.
func runChains(ctx context.Context, cfg ScaleConfig, bin string, logw io.Writer) ([]ChainPoint, error) {
	var g *memcg.Group
	if cfg.ChainsMemoryLimit > 0 {
		var err error
		if g, err = memcg.New(fmt.Sprintf("retryd-bench-chains-%d", os.Getpid()), cfg.ChainsMemoryLimit); err != nil {
			return nil, err
		}
		defer g.Close()
		fmt.Fprintf(logw, "chains: retryd in a memory cgroup limited to %.1f MiB\n", mib(cfg.ChainsMemoryLimit))
	}
	p, err := startScaleRetryd(ctx, bin, cfg.Env, g)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	peak := func(pt *ChainPoint) error {
		if g == nil {
			return nil
		}
		var err error
		pt.CgroupPeak, err = g.Peak()
		return err
	}
	conns, err := dialN(p.addr, 4)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	checkpoints := slices.Sorted(slices.Values(cfg.Chains))
	var points []ChainPoint
	var next atomic.Int64
	start := time.Now()
	// The first point is the empty server, so the slope's intercept is
	// the server's own footprint.
	rss, heap, err := memoryOf(ctx, p)
	if err != nil {
		return nil, err
	}
	first := ChainPoint{RSS: rss, HeapLive: heap}
	if err := peak(&first); err != nil {
		return nil, err
	}
	points = append(points, first)
	for _, target := range checkpoints {
		var wg sync.WaitGroup
		var firstErr error
		var once sync.Once
		for w := range cfg.Workers {
			client := retrydv1.NewRetryServiceClient(conns[w%len(conns)])
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= int64(target) || ctx.Err() != nil {
						if i >= int64(target) {
							next.Add(-1) // not taken
						}
						return
					}
					_, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
						SessionId: "chain-" + strconv.FormatInt(i, 10), Turn: 1, Step: 1, Provider: "deepseek",
						Failure:      &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429, Message: "rate limited"},
						PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: longPolicy},
					})
					if err != nil {
						once.Do(func() { firstErr = fmt.Errorf("FailedStep %d: %w", i, err) })
						return
					}
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			if g != nil {
				if n, err := g.OOMKills(); err == nil && n > 0 {
					firstErr = fmt.Errorf("%w (the kernel killed retryd %d time(s) for passing its memory limit)", firstErr, n)
				}
			}
			return points, firstErr
		}
		if err := ctx.Err(); err != nil {
			return points, err
		}
		time.Sleep(2 * time.Second) // let the background GC finish a cycle
		rss, heap, err := memoryOf(ctx, p)
		if err != nil {
			return points, err
		}
		pt := ChainPoint{Chains: target, RSS: rss, HeapLive: heap, Elapsed: time.Since(start)}
		if err := peak(&pt); err != nil {
			return points, err
		}
		points = append(points, pt)
		fmt.Fprintf(logw, "chains %8d: RSS %6.1f MiB, heap %6.1f MiB (%v)\n", target, mib(rss), mib(heap), pt.Elapsed.Round(time.Second))
	}
	if err := heapProfile(ctx, cfg, p, "chains.heap.pprof"); err != nil {
		return points, err
	}
	return points, nil
}

// runAwaiters sets up cfg.Awaiters sessions, each with one retry due at an
// absolute time (lead + an even share of the spread) through the
// provider's Retry-After, opens one AwaitRetry stream per retry as soon as
// it is scheduled, and records when each Started is stamped and arrives.
func runAwaiters(ctx context.Context, cfg ScaleConfig, bin string, logw io.Writer) (*AwaitResult, error) {
	n := cfg.Awaiters
	p, err := startScaleRetryd(ctx, bin, cfg.Env, nil)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	// retryd allows 1000 concurrent streams per connection by default;
	// 800 per connection leaves room.
	nconns := max((n+799)/800, 2)
	conns, err := dialN(p.addr, nconns)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	res := &AwaitResult{Awaiters: n, Conns: nconns, LoadWorkers: cfg.AwaitLoad}
	if res.RSSBefore, _, err = memoryOf(ctx, p); err != nil {
		return nil, err
	}
	policy := &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(1000), MaxDelayMs: proto.Uint64(3_600_000)}}
	begin := time.Now()
	firstDue := begin.Add(cfg.AwaitLead)
	server := make([]time.Duration, n)
	client := make([]time.Duration, n)
	var errs atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	var late atomic.Int64
	var next atomic.Int64
	var awaiting sync.WaitGroup // the streams, until Started arrives
	var setup sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range cfg.Workers {
		setup.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				conn := conns[i%nconns]
				rc := retrydv1.NewRetryServiceClient(conn)
				due := firstDue.Add(time.Duration(int64(cfg.AwaitSpread) * int64(i) / int64(n)))
				ms := time.Until(due).Milliseconds()
				if ms < 0 {
					cancel()
					fail(fmt.Errorf("the setup did not finish within --awaiters-lead %v (%d of %d set up): use a longer lead", cfg.AwaitLead, i, n))
					return
				}
				resp, err := rc.FailedStep(ctx, &retrydv1.FailedStepRequest{
					SessionId: "await-" + strconv.Itoa(i), Turn: 1, Step: 1, Provider: "deepseek",
					Failure:      &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429, ProviderRetryAfterMs: proto.Int64(ms)},
					PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: policy},
				})
				if err != nil {
					fail(fmt.Errorf("FailedStep: %w", err))
					continue
				}
				sched := resp.GetDecision().GetSchedule()
				if sched == nil {
					fail(fmt.Errorf("FailedStep: want a schedule, got %v", resp.GetDecision()))
					continue
				}
				stream, err := rc.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: sched.GetRetryId()})
				if err != nil {
					fail(fmt.Errorf("AwaitRetry: %w", err))
					continue
				}
				first, err := stream.Recv()
				if err != nil {
					fail(fmt.Errorf("AwaitRetry state: %w", err))
					continue
				}
				dueAt := sched.GetDueAt().AsTime()
				if first.GetState().GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING || !time.Now().Before(dueAt) {
					late.Add(1)
				}
				awaiting.Go(func() {
					msg, err := stream.Recv()
					arrived := time.Now()
					if err != nil {
						fail(fmt.Errorf("AwaitRetry terminal: %w", err))
						return
					}
					st := msg.GetStarted()
					if st == nil {
						fail(fmt.Errorf("AwaitRetry: want Started, got %v", msg))
						return
					}
					server[i] = st.GetStartedAt().AsTime().Sub(dueAt)
					client[i] = arrived.Sub(dueAt)
				})
			}
		})
	}
	setup.Wait()
	setupDone := time.Now()
	res.SetupRate = float64(n) / setupDone.Sub(begin).Seconds()
	if err := ctx.Err(); err != nil {
		awaiting.Wait()
		res.Errors = errs.Load()
		if v := firstErr.Load(); v != nil {
			return res, errors.New(v.(string))
		}
		return res, err
	}
	if res.RSSAwaiting, _, err = memoryOf(ctx, p); err != nil {
		return res, err
	}
	if err := heapProfile(ctx, cfg, p, "awaiters.heap.pprof"); err != nil {
		return res, err
	}
	fmt.Fprintf(logw, "awaiters: %d streams over %d connections set up in %v (%.0f/s); RSS %.1f MiB → %.1f MiB; first due in %v\n",
		n, nconns, setupDone.Sub(begin).Round(time.Millisecond), res.SetupRate, mib(res.RSSBefore), mib(res.RSSAwaiting),
		time.Until(firstDue).Round(time.Millisecond))
	profiled := make(chan error, 1)
	if cfg.ProfileDir != "" {
		// A CPU profile of the due window: where the starts' time goes.
		go func() {
			if !served(ctx, "http://"+p.metricsAddr+"/debug/pprof/") {
				profiled <- nil // a build without --pprof
				return
			}
			time.Sleep(time.Until(firstDue.Add(-500 * time.Millisecond)))
			secs := int(cfg.AwaitSpread.Round(time.Second)/time.Second) + 1
			profiled <- fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.metricsAddr, secs),
				filepath.Join(cfg.ProfileDir, "awaiters.cpu.pprof"))
		}()
	} else {
		profiled <- nil
	}
	if cfg.AwaitLoad > 0 {
		// The FailedStep mix on other sessions from a little before the
		// first due time to a little after the last.
		loadConns, err := dialN(p.addr, 2)
		if err != nil {
			return res, err
		}
		defer closeAll(loadConns)
		callers := make([]caller, cfg.AwaitLoad)
		for i := range callers {
			callers[i] = newRetrydCaller(loadConns[i%2], i, cfg.AwaitLoad, 10_000, rand.New(rand.NewPCG(7, uint64(i))), "load-")
		}
		time.Sleep(time.Until(firstDue.Add(-time.Second)))
		st, err := drive(ctx, callers, cfg.AwaitSpread+2*time.Second, 0, 0)
		if err != nil {
			return res, err
		}
		res.LoadCalls = st.calls
		if st.errors > 0 {
			fail(fmt.Errorf("load: %d errors, first: %s", st.errors, st.firstError))
		}
	}
	type sample struct {
		at   time.Time
		cpu  float64
		wait time.Duration
		err  error
	}
	windowStart := make(chan sample, 1)
	go func() {
		time.Sleep(time.Until(firstDue))
		var s sample
		s.at = time.Now()
		if s.cpu, s.err = p.cpuSeconds(); s.err == nil {
			s.wait, _, s.err = schedStats(p.cmd.Process.Pid)
		}
		windowStart <- s
	}()
	awaiting.Wait()
	if start := <-windowStart; start.err == nil && time.Since(start.at) > 0 {
		cpu, err1 := p.cpuSeconds()
		wait, _, err2 := schedStats(p.cmd.Process.Pid)
		if err1 == nil && err2 == nil {
			res.Window, res.WindowCPU, res.WindowRunWait = time.Since(start.at), cpu-start.cpu, wait-start.wait
			res.WindowLoad = loadAverage()
		}
	}
	if err := <-profiled; err != nil {
		return res, err
	}
	res.LateAwaiters = int(late.Load())
	res.Errors = errs.Load()
	if v := firstErr.Load(); v != nil {
		res.FirstError = v.(string)
	}
	for i := range n {
		if server[i] != 0 || client[i] != 0 {
			res.Server = append(res.Server, server[i])
			res.Client = append(res.Client, client[i])
		}
	}
	slices.Sort(res.Server)
	slices.Sort(res.Client)
	return res, nil
}

// heapProfile saves retryd's heap profile (after a GC) as name in
// cfg.ProfileDir, if set.
func heapProfile(ctx context.Context, cfg ScaleConfig, p *process, name string) error {
	if cfg.ProfileDir == "" {
		return nil
	}
	if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
		return err
	}
	url := "http://" + p.metricsAddr + "/debug/pprof/"
	if !served(ctx, url) {
		return nil // a build without --pprof
	}
	return fetch(ctx, url+"heap?gc=1", filepath.Join(cfg.ProfileDir, name))
}

func dialN(addr string, n int) ([]*grpc.ClientConn, error) {
	var conns []*grpc.ClientConn
	for range n {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		c.Close()
	}
}

// memoryOf reads the process's RSS (/proc/<pid>/status) and its Go heap
// (go_memstats_heap_alloc_bytes from retryd's /metrics).
func memoryOf(ctx context.Context, p *process) (rss, heap int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			rss = kb << 10
		}
	}
	if p.metricsAddr == "" {
		return rss, 0, nil
	}
	m, err := scrape(ctx, p, "go_memstats_heap_alloc_bytes")
	return rss, int64(m["go_memstats_heap_alloc_bytes"]), err
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// WriteScaleTable writes the scale results as markdown.
func WriteScaleTable(w io.Writer, cfg ScaleConfig, points []ChainPoint, aw *AwaitResult) error {
	var b strings.Builder
	if len(points) > 1 {
		b.WriteString("Open chains (one session, one FailedStep with a retry pending for an hour, through gRPC)")
		if cfg.ChainsMemoryLimit > 0 {
			fmt.Fprintf(&b, ", retryd in a memory cgroup limited to %.1f MiB (its soft memory limit follows it, see --memory-limit-ratio); the last column is the most the cgroup used so far, as the kernel counts it against the limit", mib(cfg.ChainsMemoryLimit))
		}
		b.WriteString(":\n\n| open chains | RSS | Go heap (live + garbage) | RSS / chain since the previous row | set-up time |")
		if cfg.ChainsMemoryLimit > 0 {
			b.WriteString(" cgroup peak |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n")
		} else {
			b.WriteString("\n| ---: | ---: | ---: | ---: | ---: |\n")
		}
		for i, pt := range points {
			per := ""
			if i > 0 && pt.Chains > points[i-1].Chains {
				per = fmt.Sprintf("%.0f B", float64(pt.RSS-points[i-1].RSS)/float64(pt.Chains-points[i-1].Chains))
			}
			fmt.Fprintf(&b, "| %d | %.1f MiB | %.1f MiB | %s | %v |", pt.Chains, mib(pt.RSS), mib(pt.HeapLive), per, pt.Elapsed.Round(time.Second))
			if cfg.ChainsMemoryLimit > 0 {
				fmt.Fprintf(&b, " %.1f MiB |", mib(pt.CgroupPeak))
			}
			b.WriteString("\n")
		}
		// Least-squares slope over the checkpoints from the first
		// non-empty one on.
		fit := points[1:]
		if len(fit) >= 2 {
			slope, heapSlope := slopeOf(fit, func(p ChainPoint) int64 { return p.RSS }), slopeOf(fit, func(p ChainPoint) int64 { return p.HeapLive })
			last := fit[len(fit)-1]
			fmt.Fprintf(&b, "\nRSS slope %d → %d chains: **%.0f B per open chain** (heap slope %.0f B); at 1 000 000 chains that is %.2f GiB of RSS beyond the server's own footprint.\n",
				fit[0].Chains, last.Chains, slope, heapSlope, slope*1e6/(1<<30))
		}
	}
	if aw != nil {
		fmt.Fprintf(&b, "\nConcurrent AwaitRetry: %d streams over %d connections, due over %v after a %v lead; load during the due window: %d workers (%d calls).\n\n",
			aw.Awaiters, aw.Conns, cfg.AwaitSpread, cfg.AwaitLead, aw.LoadWorkers, aw.LoadCalls)
		fmt.Fprintf(&b, "| measure | p50 | p99 | max | n |\n| --- | ---: | ---: | ---: | ---: |\n")
		for _, row := range []struct {
			name string
			d    []time.Duration
		}{{"Started lateness, server (started_at − due_at)", aw.Server}, {"Started lateness, client (arrival − due_at)", aw.Client}} {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d |\n", row.name, ms(quantile(row.d, 0.5)), ms(quantile(row.d, 0.99)), ms(quantile(row.d, 1)), len(row.d))
		}
		fmt.Fprintf(&b, "\nSet-up %.0f sessions+streams/s; retryd RSS %.1f MiB before, %.1f MiB with every stream open (%.0f B per awaiting session: session, open chain, pending retry, stream); %d awaiters registered after their due time; %d errors",
			aw.SetupRate, mib(aw.RSSBefore), mib(aw.RSSAwaiting), float64(aw.RSSAwaiting-aw.RSSBefore)/float64(aw.Awaiters), aw.LateAwaiters, aw.Errors)
		if aw.FirstError != "" {
			fmt.Fprintf(&b, " (first: %s)", aw.FirstError)
		}
		b.WriteString(".\n")
		if aw.Window > 0 {
			fmt.Fprintf(&b, "\nDue window (first due time → last Started, %v): retryd used %.2f s of CPU (%.2f cores); its threads waited %.2f s runnable for a CPU (schedstat); machine load average at its end %s.\n",
				aw.Window.Round(time.Millisecond), aw.WindowCPU, aw.WindowCPU/aw.Window.Seconds(), aw.WindowRunWait.Seconds(), aw.WindowLoad)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func slopeOf(pts []ChainPoint, y func(ChainPoint) int64) float64 {
	var sx, sy, sxx, sxy float64
	for _, p := range pts {
		x, v := float64(p.Chains), float64(y(p))
		sx, sy, sxx, sxy = sx+x, sy+v, sxx+x*x, sxy+x*v
	}
	n := float64(len(pts))
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

// quantile of sorted samples by nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
