package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the whole harness for about a second with tiny settings
// and checks that it produced a table with calls and no errors. It makes
// no assertion about speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two servers")
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Root:     filepath.Dir(strings.TrimSpace(string(out))),
		Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 1,
		Workers: 4, Conns: 1, Rate: 200, KeySpace: 50, Samples: 1000,
	}
	results, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 4 {
		t.Fatalf("got %d phases, want 4 (2 modes × 2 targets)", len(results))
	}
	for _, r := range results {
		if r.Calls == 0 || r.RPS() <= 0 {
			t.Errorf("%s %s: no calls", r.Target, r.Mode)
		}
		if r.Errors != 0 {
			t.Errorf("%s %s: %d errors, first: %s", r.Target, r.Mode, r.Errors, r.FirstError)
		}
	}
	var b strings.Builder
	if err := WriteTable(&b, cfg, results); err != nil {
		t.Fatal(err)
	}
	// The pooled ratio rows need CPU readings above zero, which a tiny run
	// on a busy machine may not get: only the per-round rows are certain.
	for _, want := range []string{"| saturation | 1 | retryd |", "| 200 rps | 1 | grpc echo |", "| saturation | retryd | grpc echo | 1 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
