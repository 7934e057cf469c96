package server

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// memoryLimitRefresh is how often the soft memory limit follows a change
// of the container's limit (an in-place resize).
const memoryLimitRefresh = time.Minute

// setMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to
// ratio × the memory limit of retryd's cgroup, the container's, and keeps
// it there until ctx ends. With the default GOGC the heap grows to twice
// what is live before a collection, so a memory store holding many chains
// would pass its container's limit and be killed long before its live
// state fills it; with the limit the collector runs more often instead as
// the heap nears it. A GOMEMLIMIT in the environment wins (the runtime
// has applied it), as does the absence of a cgroup limit (nothing is
// set); ratio 0 turns this off.
//
// automemlimit reads cgroup v1 and v2; retryd only chooses the ratio.
func setMemoryLimit(ctx context.Context, ratio float64, log *slog.Logger) {
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("soft memory limit from GOMEMLIMIT", "GOMEMLIMIT", v, "bytes", memoryLimit())
		return
	}
	if ratio == 0 {
		return
	}
	applyMemoryLimit(ctx, ratio, memlimit.FromCgroup, log)
}

// applyMemoryLimit is setMemoryLimit with the limit's provider given.
func applyMemoryLimit(ctx context.Context, ratio float64, provider memlimit.Provider, log *slog.Logger) {
	limit, err := memlimit.Set(
		memlimit.WithRatio(ratio),
		memlimit.WithProvider(provider),
		memlimit.WithRefreshInterval(ctx, memoryLimitRefresh),
	)
	switch {
	case err != nil:
		log.Warn("cannot read the container's memory limit; the Go runtime's soft memory limit stays as it was", "err", err)
	case limit != math.MaxInt64:
		log.Info("soft memory limit", "bytes", limit, "ratio", ratio)
	}
}

// memoryLimit returns the runtime's soft memory limit.
func memoryLimit() int64 { return debug.SetMemoryLimit(-1) }
