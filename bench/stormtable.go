package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteStormTable writes the storm's results as markdown: one row per
// phase, then each target's ratios to the bare echo of the same scenario
// and round, then pooled over the rounds.
func WriteStormTable(w io.Writer, cfg Config, sc StormConfig, results []StormResult) error {
	sc = sc.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "retryd-bench failure storm: %d callers over %d connections, %d FailedSteps per phase (herd: %d), each a new session's first failure, after %v warm-up, %d rounds interleaved with the bare echo; retryd --abandon-grace %v --chain-ttl %v, admission bounds off\n\n",
		sc.Callers, cfg.Conns, sc.Calls, sc.Herd, cfg.Warmup, cfg.Rounds, sc.AbandonGrace, sc.ChainTTL)
	b.WriteString("| scenario | round | target | calls | answered | errors | fleet acted | calls/s | p50 | p99 | server CPU / call | redis-server CPU / call | allocs / call | bytes / call | GC cycles | GC CPU share |\n")
	b.WriteString("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		redisCPU := "—"
		if r.Target == retrydRedisName || r.Target == ratelimitName {
			redisCPU = us(time.Duration(r.RedisCPU / float64(r.Calls) * 1e9))
		}
		allocs, bytes, gcs := "—", "—", "—"
		if rt := r.Runtime; rt != nil && r.Calls > 0 {
			allocs = fmt.Sprintf("%.1f", rt.Mallocs/float64(r.Calls))
			bytes = fmt.Sprintf("%.0f", rt.Allocated/float64(r.Calls))
			gcs = fmt.Sprintf("%.0f", rt.GCs)
		}
		share := "—"
		if r.ServerCPU > 0 {
			share = fmt.Sprintf("%.1f %%", 100*r.GCCPU/r.ServerCPU)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %d | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Scenario, r.Round, r.Target, r.Calls, r.Answered, r.Errors, r.Fleet, r.RPS(), us(r.P50), us(r.P99),
			us(r.CPUPerCall()), redisCPU, allocs, bytes, gcs, share)
	}
	for _, r := range results {
		if r.FirstError != "" {
			fmt.Fprintf(&b, "\n- first error, %s %s round %d: %s", r.Scenario, r.Target, r.Round, r.FirstError)
		}
	}
	b.WriteString("\n\nFor retryd every call is one FailedStep, so its allocations and bytes per call are per FailedStep. " +
		"Allocations, bytes and GC cycles are deltas of the server's go_memstats_mallocs_total, go_memstats_alloc_bytes_total and go_gc_duration_seconds_count " +
		"over the phase (retryd's and the echo's /metrics, so one scrape of /metrics is in them; ratelimit serves none: —). GC CPU share: the CPU time of the collections the server printed " +
		"with GODEBUG=gctrace=1 (sweep termination, assists, background and idle marking, mark termination; not sweeping; idle marking runs on a core nothing else wanted) over its CPU time (/proc, 10 ms resolution: — when 0).\n\n")
	b.WriteString("| scenario | target | vs | round | CPU / call ratio | calls/s ratio | p50 ratio | p99 ratio | allocs / call ratio |\n")
	b.WriteString("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, scenario := range uniq(results, func(r StormResult) string { return r.Scenario }) {
		for _, subject := range uniq(results, func(r StormResult) string { return r.Target }) {
			if subject != echoName {
				writeStormRatios(&b, cfg, results, scenario, subject, echoName)
			}
		}
		// On Redis, retryd also against the other service in front of
		// the same redis-server.
		if _, ok := findStorm(results, scenario, ratelimitName, 1); ok {
			writeStormRatios(&b, cfg, results, scenario, retrydRedisName, ratelimitName)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeStormRatios writes subject's ratios to base in one scenario, per
// round and pooled over the rounds.
func writeStormRatios(b *strings.Builder, cfg Config, results []StormResult, scenario, subject, base string) {
	var p pooled
	for round := 1; round <= cfg.Rounds; round++ {
		a, okA := findStorm(results, scenario, subject, round)
		o, okB := findStorm(results, scenario, base, round)
		if !okA || !okB || a.Calls == 0 || o.Calls == 0 {
			continue
		}
		allocs := "—"
		if a.Runtime != nil && o.Runtime != nil && o.Runtime.Mallocs > 0 {
			allocs = fmt.Sprintf("%.2f", (a.Runtime.Mallocs/float64(a.Calls))/(o.Runtime.Mallocs/float64(o.Calls)))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %s |\n", scenario, subject, base, round,
			ratio(a.CPUPerCall(), o.CPUPerCall()), a.RPS()/o.RPS(), ratio(a.P50, o.P50), ratio(a.P99, o.P99), allocs)
		p.add(a.ServerCPU, a.Calls, a.Elapsed, o.ServerCPU, o.Calls, o.Elapsed)
	}
	if cpu, rps, ok := p.ratios(); ok {
		fmt.Fprintf(b, "| %s | %s | %s | pooled | %.2f | %.2f | | | |\n", scenario, subject, base, cpu, rps)
	}
}

func findStorm(results []StormResult, scenario, target string, round int) (StormResult, bool) {
	for _, r := range results {
		if r.Scenario == scenario && r.Target == target && r.Round == round {
			return r, true
		}
	}
	return StormResult{}, false
}
