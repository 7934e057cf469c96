package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteTable writes the results as markdown: one row per phase, then the
// ratios of retryd to each baseline, per round and pooled over rounds.
func WriteTable(w io.Writer, cfg Config, results []Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "retryd-bench: %d workers over %d connections, %d sessions, %v per phase after %v warm-up, %d rounds, A/B interleaved\n\n",
		cfg.Workers, cfg.Conns, cfg.KeySpace, cfg.Duration, cfg.Warmup, cfg.Rounds)
	b.WriteString("| mode | round | target | calls | latency-measured calls | rps | p50 | p99 | server CPU / call | server CPU cores | errors | missed ticks |\n")
	b.WriteString("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %.0f | %s | %s | %s | %.2f | %d | %d |\n",
			r.Mode, r.Round, r.Target, r.Calls, r.Measured, r.RPS(), us(r.P50), us(r.P99), us(r.CPUPerCall()),
			r.ServerCPU/r.Elapsed.Seconds(), r.Errors, r.Missed)
	}
	var firstErrs []string
	for _, r := range results {
		if r.FirstError != "" {
			firstErrs = append(firstErrs, fmt.Sprintf("- %s %s round %d: %s", r.Target, r.Mode, r.Round, r.FirstError))
		}
	}
	if len(firstErrs) > 0 {
		b.WriteString("\nFirst error of each phase with errors:\n\n" + strings.Join(firstErrs, "\n") + "\n")
	}
	// Every retryd build (retryd, retryd@base) against every other
	// target; retryd@base is compared with the baselines only.
	b.WriteString("\n| mode | target | vs | round | CPU / call ratio | rps ratio | p99 ratio |\n| --- | --- | --- | --- | ---: | ---: | ---: |\n")
	targets := uniq(results, func(r Result) string { return r.Target })
	for _, mode := range uniq(results, func(r Result) string { return r.Mode }) {
		for _, subject := range targets {
			if !strings.HasPrefix(subject, "retryd") {
				continue
			}
			for _, base := range targets {
				if base == subject || subject != "retryd" && strings.HasPrefix(base, "retryd") {
					continue
				}
				writeRatios(&b, cfg, results, mode, subject, base)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRatios writes subject's ratios to base in mode, per round and
// pooled over the rounds.
func writeRatios(b *strings.Builder, cfg Config, results []Result, mode, subject, base string) {
	var aCPU, bCPU float64
	var aCalls, bCalls int64
	var aSec, bSec float64
	for round := 1; round <= cfg.Rounds; round++ {
		a, okA := find(results, subject, mode, round)
		o, okB := find(results, base, mode, round)
		if !okA || !okB || o.Calls == 0 || a.Calls == 0 {
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d | %.2f | %.2f | %.2f |\n", mode, subject, base, round,
			ratio(a.CPUPerCall(), o.CPUPerCall()), a.RPS()/o.RPS(), ratio(a.P99, o.P99))
		aCPU, bCPU = aCPU+a.ServerCPU, bCPU+o.ServerCPU
		aCalls, bCalls = aCalls+a.Calls, bCalls+o.Calls
		aSec, bSec = aSec+a.Elapsed.Seconds(), bSec+o.Elapsed.Seconds()
	}
	if aCalls > 0 && bCalls > 0 && bCPU > 0 {
		fmt.Fprintf(b, "| %s | %s | %s | pooled | %.2f | %.2f | |\n", mode, subject, base,
			(aCPU/float64(aCalls))/(bCPU/float64(bCalls)), (float64(aCalls)/aSec)/(float64(bCalls)/bSec))
	}
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func find(results []Result, target, mode string, round int) (Result, bool) {
	for _, r := range results {
		if r.Target == target && r.Mode == mode && r.Round == round {
			return r, true
		}
	}
	return Result{}, false
}

func uniq(results []Result, key func(Result) string) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range results {
		if k := key(r); !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}
