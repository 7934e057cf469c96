package memory

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
)

// TestTimerHeapOrdersManyEntries pushes and pops entries in a random
// interleaving and checks that every pop returns the earliest entry.
func TestTimerHeapOrdersManyEntries(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var h entries
	var want []time.Time
	for i := range 5000 {
		if len(h) > 0 && rng.IntN(3) == 0 {
			got := h.pop()
			slices.SortFunc(want, func(a, b time.Time) int { return a.Compare(b) })
			if !got.when().Equal(want[0]) {
				t.Fatalf("pop %d: %v, want the earliest %v", i, got.when(), want[0])
			}
			want = want[1:]
			continue
		}
		at := base.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
		h.push(timerEntry{at: at.UnixNano(), retry: &engine.Retry{}})
		want = append(want, at)
	}
	for len(h) > 0 {
		prev := h.pop().at
		if len(h) > 0 && h[0].at < prev {
			t.Fatalf("popped %v before %v", prev, h[0].at)
		}
	}
}
