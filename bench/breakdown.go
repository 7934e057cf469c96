package bench

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A share is one part of a CPU profile: a category and its fraction of
// the samples.
type share struct {
	Category string
	Fraction float64
}

// categories assign a CPU sample to the first category (in this order)
// one of whose patterns matches a frame of its stack, so that a sample in
// the GC started from a handler counts as GC, one in policy resolution
// called from validation counts as policy, and so on.
var categories = []struct {
	name    string
	pattern *regexp.Regexp
}{
	{"GC: background mark workers (idle and fractional)", regexp.MustCompile(`runtime\.gcBgMarkWorker`)},
	{"GC: assists, sweeping, write barriers", regexp.MustCompile(`runtime\.(gcAssist|bgsweep|sweepone|wbBufFlush|bulkBarrier|gcWriteBarrier|markroot)`)},
	{"otelgrpc stats handler", regexp.MustCompile(`otelgrpc`)},
	// retryd's own RPC metrics interceptor, which replaces otelgrpc when
	// tracing is off. It runs inside the generated handler's frame, so it
	// must come before "service: handlers", which matches that frame.
	{"RPC metrics interceptor (telemetry.RPCMetrics)", regexp.MustCompile(`retryd/telemetry\.\(\*RPCMetrics\)`)},
	{"service telemetry (spans, metrics)", regexp.MustCompile(`retryd/service\.\(\*instruments\)|retryd/service\.(callerAttempt|traceparent)`)},
	{"policy resolution", regexp.MustCompile(`retryd/policy\.(Resolve|\(\*Cache\)|\(\*Policy\)\.(canonicalKey|Proto|index))`)},
	{"validation", regexp.MustCompile(`retryd/service\.\(\*validator\)|retryd/service\.\(\*Service\)\.failure$|retryd/policy\.ValidateCode`)},
	{"engine: fingerprint", regexp.MustCompile(`retryd/engine\.fingerprint`)},
	{"engine: transitions", regexp.MustCompile(`retryd/engine\.`)},
	{"store (locks, index, timers, event log)", regexp.MustCompile(`retryd/store/`)},
	{"logging", regexp.MustCompile(`log/slog`)},
	{"gRPC: receive and decode", regexp.MustCompile(`grpc\.recv|grpc\.\(\*serverStream\)\.RecvMsg|protobuf/proto\.UnmarshalOptions`)},
	{"gRPC: encode and send", regexp.MustCompile(`grpc\.\(\*serverStream\)\.SendMsg|grpc\.\(\*Server\)\.sendResponse|protobuf/proto\.MarshalOptions`)},
	{"service: handlers, admission, interning", regexp.MustCompile(`retryd/service\.|retryd/gen/retryd/v1\._RetryService`)},
	{"server interceptors (unary timeout, auth)", regexp.MustCompile(`retryd/server\.|retryd/auth\.`)},
	{"gRPC: HTTP/2 transport", regexp.MustCompile(`grpc/internal/transport|golang\.org/x/net/http2`)},
	{"gRPC: server, other", regexp.MustCompile(`google\.golang\.org/grpc`)},
	{"syscalls, netpoll, scheduler", regexp.MustCompile(`runtime\.(netpoll|schedule|findRunnable|park_m|mcall)|syscall|internal/poll`)},
}

const otherCategory = "other (runtime outside the above)"

// breakdown splits a CPU profile into categories, reading its stacks with
// go tool pprof -traces.
func breakdown(ctx context.Context, cpuFile string) ([]share, time.Duration, error) {
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-traces", cpuFile).Output()
	if err != nil {
		return nil, 0, fmt.Errorf("go tool pprof -traces %s: %w", cpuFile, err)
	}
	sums := map[string]time.Duration{}
	var total time.Duration
	value := regexp.MustCompile(`^\s*([0-9.]+)(ns|us|µs|ms|s)\s+(\S.*)$`)
	var cur time.Duration
	var frames []string
	flush := func() {
		if cur == 0 {
			return
		}
		total += cur
		cat := otherCategory
		for _, c := range categories {
			if slices.ContainsFunc(frames, c.pattern.MatchString) {
				cat = c.name
				break
			}
		}
		sums[cat] += cur
		cur, frames = 0, frames[:0]
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-----------+") {
			flush()
			continue
		}
		if m := value.FindStringSubmatch(line); m != nil {
			flush()
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				continue
			}
			unit := map[string]float64{"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}[m[2]]
			cur = time.Duration(v * unit)
			frames = append(frames, strings.TrimSpace(m[3]))
			continue
		}
		if cur != 0 {
			frames = append(frames, strings.TrimSpace(line))
		}
	}
	flush()
	if total == 0 {
		return nil, 0, nil
	}
	var shares []share
	for name, d := range sums {
		shares = append(shares, share{name, float64(d) / float64(total)})
	}
	slices.SortFunc(shares, func(a, b share) int {
		switch {
		case a.Fraction > b.Fraction:
			return -1
		case a.Fraction < b.Fraction:
			return 1
		}
		return strings.Compare(a.Category, b.Category)
	})
	return shares, total, nil
}

// writeBreakdown renders shares as text lines.
func writeBreakdown(b *strings.Builder, shares []share, total time.Duration) {
	fmt.Fprintf(b, "Where the samples go (%v of samples; each sample counted once, by the first category matching a frame of its stack):\n", total.Round(time.Millisecond))
	for _, s := range shares {
		fmt.Fprintf(b, "  %5.1f%%  %s\n", 100*s.Fraction, s.Category)
	}
	b.WriteString("\n")
}
