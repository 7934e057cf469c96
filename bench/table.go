package bench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
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
	// target; retryd@base is compared with the baselines only. Then the
	// baselines among themselves (baselineRatios).
	b.WriteString("\n| mode | target | vs | round | CPU / call ratio | rps ratio | p99 ratio |\n| --- | --- | --- | --- | ---: | ---: | ---: |\n")
	targets := uniq(results, func(r Result) string { return r.Target })
	for _, mode := range uniq(results, func(r Result) string { return r.Mode }) {
		for _, pair := range baselineRatios {
			writeRatios(&b, cfg, results, mode, pair[0], pair[1])
		}
		for _, subject := range targets {
			if !strings.HasPrefix(subject, "retryd") {
				continue
			}
			for _, base := range targets {
				// The Redis peer's CPU is redis-server's: it has its own
				// table (writeRedisTable).
				if base == subject || base == peerName || subject != "retryd" && strings.HasPrefix(base, "retryd") {
					continue
				}
				writeRatios(&b, cfg, results, mode, subject, base)
			}
		}
	}
	writeRuntimeTable(&b, results)
	writeRedisTable(&b, cfg, results)
	_, err := io.WriteString(w, b.String())
	return err
}

// baselineRatios are the baselines compared with each other, where a run
// has both: the echoes that hold a heap with the bare echo (what holding
// state costs grpc-go), and the bare echo with gubernator (the framework's
// own throughput against gubernator's: the most any server on these cores
// can show against it).
var baselineRatios = [][2]string{
	{heldEchoName, echoName},
	{bytesEchoName, echoName},
	{echoName, gubernatorName},
}

// writeRuntimeTable writes what the Go runtime of each phase did per
// call, for the targets whose /metrics has it (retryd and echo): garbage
// collection is paced by bytes allocated against the live heap, so these
// say how much of a difference in CPU per call the collector can be.
// Then how often the server's threads were put on a CPU per call (/proc
// schedstat): an idle server pays a thread's wake-up for most of what it
// does, a busy one shares them. The last column is the load generator's
// own CPU per call: at saturation the two share the cores, so
// throughput follows the sum of its and the server's.
func writeRuntimeTable(b *strings.Builder, results []Result) {
	header := false
	for _, r := range results {
		if r.Runtime == nil || r.Calls == 0 {
			continue
		}
		if !header {
			b.WriteString("\n| mode | round | target | GC cycles / 1 000 calls | allocated / call | heap at the end | threads put on a CPU / call | load generator CPU / call |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
			header = true
		}
		calls := float64(r.Calls)
		fmt.Fprintf(b, "| %s | %d | %s | %.2f | %.0f B | %.1f MiB | %.2f | %s |\n",
			r.Mode, r.Round, r.Target, r.Runtime.GCs/calls*1000, r.Runtime.Allocated/calls, r.Runtime.Heap/(1<<20), float64(r.ThreadRuns)/calls,
			us(time.Duration(r.ClientCPU/calls*1e9)))
	}
}

// writeRedisTable writes the Redis part's phases (those with Redis
// counters): per phase what each decision cost Redis, then retryd@redis'
// ratios to each peer (redis EVALSHA, ratelimit), then the commands per
// decision by command.
func writeRedisTable(b *strings.Builder, cfg Config, results []Result) {
	var rs []Result
	for _, r := range results {
		if r.Redis != nil && r.Calls > 0 {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return
	}
	per := func(n int64, r Result) float64 { return float64(n) / float64(r.Calls) }
	fmt.Fprintf(b, "\nRedis part: %s is retryd serve --store redis://… and %s is redis-benchmark -c %d -P 1 -r %d "+
		"EVALSHA of a token bucket (one round trip per call), against the same redis-server; a decision is one call "+
		"(retryd: every RPC of the mix, each one session transition). Counters are Redis' own (INFO stats, commandstats) "+
		"over the measured phase; read events (total_reads_processed) count the reads of client sockets, one per round "+
		"trip of a client that waits for each reply; scripts count retryd's group commits (one commit script each) and "+
		"the peer's calls.", retrydRedisName, peerName, cfg.Workers, cfg.KeySpace)
	if _, ok := findTarget(rs, ratelimitName); ok {
		fmt.Fprintf(b, " %s is envoyproxy/ratelimit on the same redis-server, one ShouldRateLimit per decision (one "+
			"descriptor, a key of the same key space, 100 per minute: INCRBY+EXPIRE in one pipeline), %d workers over %d "+
			"gRPC connections like the other gRPC targets; OK and OVER_LIMIT both count as decisions.", ratelimitName, cfg.Workers, cfg.Conns)
	}
	b.WriteString("\n\n| mode | round | target | decisions | decisions/s | p50 | p99 | Redis commands / decision | Redis read events / decision | scripts (EVALSHA + EVAL) / decision | Redis bytes in / decision | Redis CPU / decision | server CPU / decision (retryd, ratelimit) | errors |\n")
	b.WriteString("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		d := r.Redis
		serverCPU := "—"
		if r.Target != peerName {
			serverCPU = us(r.CPUPerCall())
		}
		fmt.Fprintf(b, "| %s | %d | %s | %d | %.0f | %s | %s | %.2f | %.2f | %.3f | %.0f | %s | %s | %d |\n",
			r.Mode, r.Round, r.Target, r.Calls, r.RPS(), us(r.P50), us(r.P99), per(d.Commands, r), per(d.Reads, r),
			per(d.ByCommand["evalsha"]+d.ByCommand["eval"], r), per(d.NetIn, r), us(time.Duration(d.CPU/float64(r.Calls)*1e9)), serverCPU, r.Errors)
	}
	if _, ok := findTarget(rs, peerName); ok {
		b.WriteString("\n| mode | round | retryd@redis decisions/s ÷ EVALSHA calls/s | Redis CPU / decision ratio | Redis read events / decision ratio |\n| --- | --- | ---: | ---: | ---: |\n")
		writeRedisRatios(b, cfg, rs, peerName, false)
	}
	if _, ok := findTarget(rs, ratelimitName); ok {
		b.WriteString("\n| mode | round | retryd@redis decisions/s ÷ ratelimit decisions/s | Redis CPU / decision ratio | Redis read events / decision ratio | Redis commands / decision ratio | server CPU / decision ratio | p99 ratio |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		writeRedisRatios(b, cfg, rs, ratelimitName, true)
	}
	// Commands per decision by command, pooled over the rounds of a mode,
	// each with Redis' time in it per decision.
	b.WriteString("\n| mode | target | Redis commands per decision, by command, and Redis' time in them per decision " +
		"(commandstats; a script's time includes the commands it calls) (pooled over rounds) |\n| --- | --- | --- |\n")
	for _, mode := range uniq(rs, func(r Result) string { return r.Mode }) {
		for _, target := range uniq(rs, func(r Result) string { return r.Target }) {
			var calls int64
			by, usec := map[string]int64{}, map[string]int64{}
			for _, r := range rs {
				if r.Mode == mode && r.Target == target {
					calls += r.Calls
					for k, v := range r.Redis.ByCommand {
						by[k] += v
					}
					for k, v := range r.Redis.UsecByCommand {
						usec[k] += v
					}
				}
			}
			if calls == 0 {
				continue
			}
			cmds := make([]string, 0, len(by))
			for k := range by {
				cmds = append(cmds, k)
			}
			slices.SortFunc(cmds, func(x, y string) int { return cmp.Or(cmp.Compare(by[y], by[x]), cmp.Compare(x, y)) })
			parts := make([]string, len(cmds))
			for i, k := range cmds {
				parts[i] = fmt.Sprintf("%s %.3f (%.1f µs)", strings.ToUpper(k), float64(by[k])/float64(calls), float64(usec[k])/float64(calls))
			}
			fmt.Fprintf(b, "| %s | %s | %s |\n", mode, target, strings.Join(parts, ", "))
		}
	}
}

// writeRedisRatios writes retryd@redis' saturation ratios to base, per
// round and pooled over the rounds: decisions/s, Redis CPU and read events
// per decision and, with server, Redis commands, the server's own CPU per
// decision and p99 (for a gRPC peer: ratelimit).
func writeRedisRatios(b *strings.Builder, cfg Config, rs []Result, base string, server bool) {
	per := func(n int64, r Result) float64 { return float64(n) / float64(r.Calls) }
	var aCalls, bCalls, aReads, bReads, aCmds, bCmds int64
	var aSec, bSec, aCPU, bCPU, aSrv, bSrv float64
	for round := 1; round <= cfg.Rounds; round++ {
		a, okA := find(rs, retrydRedisName, "saturation", round)
		o, okB := find(rs, base, "saturation", round)
		if !okA || !okB {
			continue
		}
		fmt.Fprintf(b, "| saturation | %d | %.2f | %.2f | %.2f |", round, a.RPS()/o.RPS(),
			(a.Redis.CPU/float64(a.Calls))/(o.Redis.CPU/float64(o.Calls)), per(a.Redis.Reads, a)/per(o.Redis.Reads, o))
		if server {
			fmt.Fprintf(b, " %.2f | %.2f | %.2f |", per(a.Redis.Commands, a)/per(o.Redis.Commands, o),
				ratio(a.CPUPerCall(), o.CPUPerCall()), ratio(a.P99, o.P99))
		}
		b.WriteString("\n")
		aCalls, bCalls = aCalls+a.Calls, bCalls+o.Calls
		aSec, bSec = aSec+a.Elapsed.Seconds(), bSec+o.Elapsed.Seconds()
		aCPU, bCPU = aCPU+a.Redis.CPU, bCPU+o.Redis.CPU
		aReads, bReads = aReads+a.Redis.Reads, bReads+o.Redis.Reads
		aCmds, bCmds = aCmds+a.Redis.Commands, bCmds+o.Redis.Commands
		aSrv, bSrv = aSrv+a.ServerCPU, bSrv+o.ServerCPU
	}
	if aCalls == 0 || bCalls == 0 {
		return
	}
	fmt.Fprintf(b, "| saturation | pooled | %.2f | %.2f | %.2f |", (float64(aCalls)/aSec)/(float64(bCalls)/bSec),
		(aCPU/float64(aCalls))/(bCPU/float64(bCalls)), (float64(aReads)/float64(aCalls))/(float64(bReads)/float64(bCalls)))
	if server {
		srv := ""
		if bSrv > 0 {
			srv = fmt.Sprintf("%.2f", (aSrv/float64(aCalls))/(bSrv/float64(bCalls)))
		}
		fmt.Fprintf(b, " %.2f | %s | |", (float64(aCmds)/float64(aCalls))/(float64(bCmds)/float64(bCalls)), srv)
	}
	b.WriteString("\n")
}

// writeRatios writes subject's ratios to base in mode, per round and
// pooled over the rounds.
func writeRatios(b *strings.Builder, cfg Config, results []Result, mode, subject, base string) {
	var p pooled
	for round := 1; round <= cfg.Rounds; round++ {
		a, okA := find(results, subject, mode, round)
		o, okB := find(results, base, mode, round)
		if !okA || !okB || o.Calls == 0 || a.Calls == 0 {
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d | %.2f | %.2f | %.2f |\n", mode, subject, base, round,
			ratio(a.CPUPerCall(), o.CPUPerCall()), a.RPS()/o.RPS(), ratio(a.P99, o.P99))
		p.add(a.ServerCPU, a.Calls, a.Elapsed, o.ServerCPU, o.Calls, o.Elapsed)
	}
	if cpu, rps, ok := p.ratios(); ok {
		fmt.Fprintf(b, "| %s | %s | %s | pooled | %.2f | %.2f | |\n", mode, subject, base, cpu, rps)
	}
}

// pooled sums a subject's (a) and a baseline's (b) server CPU seconds,
// calls and elapsed seconds over the rounds they both ran, for the
// pooled ratio rows.
type pooled struct {
	aCPU, bCPU, aSec, bSec float64
	aCalls, bCalls         int64
}

func (p *pooled) add(aCPU float64, aCalls int64, aElapsed time.Duration, bCPU float64, bCalls int64, bElapsed time.Duration) {
	p.aCPU, p.bCPU = p.aCPU+aCPU, p.bCPU+bCPU
	p.aCalls, p.bCalls = p.aCalls+aCalls, p.bCalls+bCalls
	p.aSec, p.bSec = p.aSec+aElapsed.Seconds(), p.bSec+bElapsed.Seconds()
}

// ratios are the pooled CPU per call and calls per second ratios, when
// both sides made calls and the baseline's CPU reading is above zero.
func (p pooled) ratios() (cpu, rps float64, ok bool) {
	if p.aCalls == 0 || p.bCalls == 0 || p.bCPU <= 0 {
		return 0, 0, false
	}
	return (p.aCPU / float64(p.aCalls)) / (p.bCPU / float64(p.bCalls)),
		(float64(p.aCalls) / p.aSec) / (float64(p.bCalls) / p.bSec), true
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

func findTarget(results []Result, target string) (Result, bool) {
	for _, r := range results {
		if r.Target == target {
			return r, true
		}
	}
	return Result{}, false
}

// uniq is the distinct keys of results, in the order they first occur.
func uniq[R any](results []R, key func(R) string) []string {
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
