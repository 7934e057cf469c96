package bench

import (
	"strings"
	"testing"
	"time"
)

// TestWriteTableBaselineRatios checks the rows that compare baselines
// with each other: each appears when the run has both targets, with the
// ratios of their phases, and not otherwise.
func TestWriteTableBaselineRatios(t *testing.T) {
	phase := func(target string, calls int64, cpu float64, p99 time.Duration) Result {
		return Result{Target: target, Mode: "saturation", Round: 1, Calls: calls, Measured: calls,
			Elapsed: time.Second, P99: p99, ServerCPU: cpu}
	}
	cfg := Config{Rounds: 1}
	all := []Result{
		phase("retryd", 1500, 0.06, 2*time.Millisecond),
		phase(echoName, 2000, 0.05, time.Millisecond),
		phase(heldEchoName, 2000, 0.04, time.Millisecond),
		phase(gubernatorName, 1000, 0.1, 2*time.Millisecond),
	}
	table := func(results []Result) string {
		var b strings.Builder
		if err := WriteTable(&b, cfg, results); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}

	got := table(all)
	for _, want := range []string{
		// echo: 25 µs per call at 2 000 rps; gubernator: 100 µs at 1 000 rps
		"| saturation | grpc echo | gubernator | 1 | 0.25 | 2.00 | 0.50 |",
		"| saturation | grpc echo | gubernator | pooled | 0.25 | 2.00 | |",
		"| saturation | grpc echo+held | grpc echo | 1 | 0.80 | 1.00 | 1.00 |",
		"| saturation | retryd | gubernator | 1 | 0.40 | 1.50 | 1.00 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"| gubernator | grpc echo |", "| grpc echo | retryd |", "| grpc echo | grpc echo+held |"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("table has %q:\n%s", unwanted, got)
		}
	}

	got = table(all[:3]) // no gubernator in the run
	if strings.Contains(got, "gubernator") {
		t.Errorf("a run without gubernator compares with it:\n%s", got)
	}
}
