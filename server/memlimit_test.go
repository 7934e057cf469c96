package server

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestApplyMemoryLimit: the runtime's soft limit becomes ratio × the
// provider's limit, and is logged. Not parallel: the limit is the
// process's.
func TestApplyMemoryLimit(t *testing.T) {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		t.Skip("GOMEMLIMIT is set in the environment, which the runtime's limit follows")
	}
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	var logs bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applyMemoryLimit(ctx, 0.5, memlimit.Limit(1<<30), slog.New(slog.NewTextHandler(&logs, nil)))
	if got := memoryLimit(); got != 1<<29 {
		t.Errorf("soft memory limit %d, want %d (half of 1 GiB)", got, 1<<29)
	}
	if !strings.Contains(logs.String(), "soft memory limit") || !strings.Contains(logs.String(), "bytes=536870912") {
		t.Errorf("log: %q", logs.String())
	}
}
