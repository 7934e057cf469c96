package memory

import (
	"container/heap"
	"sync"
	"time"

	"github.com/retryd/retryd/engine"
)

type timerKind uint8

const (
	timerDue     timerKind = iota // the backoff ends
	timerAbandon                  // the grace for an awaiter ends
)

type timerEntry struct {
	at    time.Time
	retry *engine.Retry
	kind  timerKind
}

// timerHeap holds every pending retry's next deadline in one min-heap,
// served by one goroutine: a million pending retries cost a million small
// entries, not a million sleeping goroutines.
type timerHeap struct {
	mu      sync.Mutex
	entries entries
	wake    chan struct{} // signalled when an earlier entry arrives
	stopped bool
}

type entries []timerEntry

func (h entries) Len() int           { return len(h) }
func (h entries) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h entries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *entries) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *entries) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = timerEntry{}
	*h = old[:n-1]
	return e
}

func newTimerHeap() *timerHeap {
	return &timerHeap{wake: make(chan struct{}, 1)}
}

func (t *timerHeap) push(at time.Time, r *engine.Retry, kind timerKind) {
	t.mu.Lock()
	heap.Push(&t.entries, timerEntry{at: at, retry: r, kind: kind})
	first := t.entries[0].retry == r && t.entries[0].kind == kind
	t.mu.Unlock()
	if first {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

func (t *timerHeap) stop() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Len reports how many entries wait.
func (t *timerHeap) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// next blocks until the earliest entry is due and pops it; ok is false once
// the heap is stopped.
func (t *timerHeap) next(now func() time.Time) (timerEntry, bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		t.mu.Lock()
		if t.stopped {
			t.mu.Unlock()
			return timerEntry{}, false
		}
		wait := time.Hour
		if len(t.entries) > 0 {
			if wait = t.entries[0].at.Sub(now()); wait <= 0 {
				e := heap.Pop(&t.entries).(timerEntry)
				t.mu.Unlock()
				return e, true
			}
		}
		t.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-t.wake:
		}
	}
}
