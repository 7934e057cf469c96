package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// profileLoad is the load of a profiling phase: rate calls per second
// (0: saturation) from workers callers over a key space of keySpace (for
// the storm's callers: the calls of a phase, unused). label names the
// phase's files, <target>.<label>.*.
type profileLoad struct {
	label                   string
	rate, workers, keySpace int
}

// profileTargets profiles each of ts under l (profileTarget) into
// cfg.ProfileDir, and logs the files it wrote.
func profileTargets(ctx context.Context, ts []*target, cfg Config, l profileLoad, logw io.Writer) error {
	if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
		return err
	}
	for _, t := range ts {
		files, err := profileTarget(ctx, t, cfg, l, cfg.ProfileDir)
		if err != nil {
			return err
		}
		if len(files) > 0 {
			fmt.Fprintf(logw, "%-10s profiles: %s\n", t.name, strings.Join(files, " "))
		}
	}
	return nil
}

// profileTarget runs one more phase against t under l, after the
// measured ones and not part of the table, for cfg.Duration after
// cfg.Warmup, and collects over it the server's CPU profile and its
// allocations (a delta of the allocs profile over the same seconds), then
// a heap profile (after a GC) at its end, through the server's
// net/http/pprof (retryd and bench/echo --metrics-listen … --pprof). It
// writes <dir>/<name>.<label>.cpu.pprof, .allocs.pprof, .heap.pprof,
// .trace and .top.txt (the share of each category of work, see
// breakdown, then go tool pprof -top, flat and cumulative, the
// allocation sites by objects and by bytes, and the scheduler latency)
// and returns their paths. A target without a profile endpoint
// (gubernator, a retryd@base that predates --pprof) is skipped.
func profileTarget(ctx context.Context, t *target, cfg Config, l profileLoad, dir string) ([]string, error) {
	if t.proc.metricsAddr == "" {
		return nil, nil
	}
	rate := l.rate
	name := strings.ReplaceAll(t.name, " ", "-") + "." + strings.ReplaceAll(l.label, " ", "")
	secs := max(int(cfg.Duration.Round(time.Second)/time.Second), 1)
	callers := make([]caller, l.workers)
	for i := range callers {
		rng := rand.New(rand.NewPCG(uint64(cfg.Rounds+1), uint64(i)))
		callers[i] = t.new(t.conns[i%len(t.conns)], i, l.workers, l.keySpace, rng, "prof-"+name+"-")
	}
	if cfg.Warmup > 0 {
		if _, err := drive(ctx, callers, cfg.Warmup, rate, 0); err != nil {
			return nil, err
		}
	}
	base := "http://" + t.proc.metricsAddr + "/debug/pprof/"
	if !served(ctx, base) {
		return nil, nil // a retryd@base without --pprof
	}
	cpuFile := filepath.Join(dir, name+".cpu.pprof")
	allocsFile := filepath.Join(dir, name+".allocs.pprof")
	st, err := fetchUnderLoad(ctx, callers, secs, rate,
		download{fmt.Sprintf("%sprofile?seconds=%d", base, secs), cpuFile},
		download{fmt.Sprintf("%sallocs?seconds=%d", base, secs), allocsFile})
	if err != nil {
		return nil, fmt.Errorf("profiling %s: %w", t.name, err)
	}
	// An execution trace of a shorter window of the same load, after the
	// CPU profile so that tracing's own cost stays out of it.
	traceFile := filepath.Join(dir, name+".trace")
	traceSecs := min(secs, 3)
	tst, err := fetchUnderLoad(ctx, callers, traceSecs, rate, download{fmt.Sprintf("%strace?seconds=%d", base, traceSecs), traceFile})
	if err != nil {
		return nil, fmt.Errorf("tracing %s: %w", t.name, err)
	}
	heapFile := filepath.Join(dir, name+".heap.pprof")
	if err := fetch(ctx, base+"heap?gc=1", heapFile); err != nil {
		return nil, err
	}
	topFile := filepath.Join(dir, name+".top.txt")
	var top strings.Builder
	fmt.Fprintf(&top, "%s: CPU profile of %d s of %s load (%d calls, %.0f rps); server CPU per call is in the results table\n\n",
		t.name, secs, l.label, st.calls, float64(st.calls)/st.elapsed.Seconds())
	shares, total, err := breakdown(ctx, cpuFile)
	if err != nil {
		return nil, err
	}
	writeBreakdown(&top, shares, total)
	for _, args := range [][]string{{"-top", "-nodecount=40"}, {"-top", "-cum", "-nodecount=60"}} {
		out, err := exec.CommandContext(ctx, "go", append(append([]string{"tool", "pprof"}, args...), cpuFile)...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("go tool pprof %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		fmt.Fprintf(&top, "$ go tool pprof %s %s\n%s\n", strings.Join(args, " "), filepath.Base(cpuFile), out)
	}
	// The allocs profile covers secs of the load, which ran a little
	// longer: its calls are the load's rate times secs.
	windowCalls := float64(st.calls) / st.elapsed.Seconds() * float64(secs)
	fmt.Fprintf(&top, "Allocations over the same %d s (a delta of the allocs profile, sampled every 512 KiB and scaled): about %.0f calls, so divide by %.0f for a figure per call.\n\n",
		secs, windowCalls, windowCalls)
	for _, args := range [][]string{{"-sample_index=alloc_objects", "-top", "-nodecount=40"}, {"-sample_index=alloc_space", "-top", "-nodecount=25"}} {
		out, err := exec.CommandContext(ctx, "go", append(append([]string{"tool", "pprof"}, args...), allocsFile)...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("go tool pprof %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		fmt.Fprintf(&top, "$ go tool pprof %s %s\n%s\n", strings.Join(args, " "), filepath.Base(allocsFile), out)
	}
	if err := writeSchedLatency(ctx, &top, traceFile, tst.calls, traceSecs); err != nil {
		return nil, err
	}
	if err := os.WriteFile(topFile, []byte(top.String()), 0o644); err != nil {
		return nil, err
	}
	return []string{cpuFile, allocsFile, heapFile, traceFile, topFile}, nil
}

// writeSchedLatency writes where the goroutines of the traced window
// waited to run once they were runnable (go tool trace -pprof=sched: the
// scheduler latency, by the stack that made them runnable), in total and
// per call of the window.
func writeSchedLatency(ctx context.Context, w io.Writer, traceFile string, calls int64, secs int) error {
	sched, err := exec.CommandContext(ctx, "go", "tool", "trace", "-pprof=sched", traceFile).Output()
	if err != nil {
		return fmt.Errorf("go tool trace -pprof=sched %s: %w", traceFile, err)
	}
	schedFile := strings.TrimSuffix(traceFile, ".trace") + ".sched.pprof"
	if err := os.WriteFile(schedFile, sched, 0o644); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=20", schedFile).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go tool pprof -top %s: %w\n%s", schedFile, err, out)
	}
	fmt.Fprintf(w, "Scheduler latency of an execution trace of %d s of the same load (%d calls): the time runnable goroutines waited for a CPU, by the stack that made them runnable; divide by the calls for a figure per call.\n\n", secs, calls)
	fmt.Fprintf(w, "$ go tool trace -pprof=sched %s > %s && go tool pprof -top -nodecount=20 %s\n%s\n",
		filepath.Base(traceFile), filepath.Base(schedFile), filepath.Base(schedFile), out)
	return nil
}

// download is a URL to GET into a file.
type download struct{ url, file string }

// fetchUnderLoad GETs each download, all at once, while callers run the
// load of rate (0: saturation) for a little longer than the secs the
// server takes to answer, so that what it collects covers load only. A
// call that failed is an error.
func fetchUnderLoad(ctx context.Context, callers []caller, secs, rate int, ds ...download) (stats, error) {
	got := make(chan error, len(ds))
	for _, d := range ds {
		go func() { got <- fetch(ctx, d.url, d.file) }()
	}
	st, err := drive(ctx, callers, time.Duration(secs)*time.Second+300*time.Millisecond, rate, 0)
	for range ds {
		if ferr := <-got; err == nil {
			err = ferr
		}
	}
	if err == nil && st.errors > 0 {
		err = fmt.Errorf("%d errors, first: %s", st.errors, st.firstError)
	}
	return st, err
}

// served reports whether url answers 200 OK.
func served(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// fetch GETs url (on loopback) into file.
func fetch(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return f.Close()
}
