package memory

import (
	"sync"
	"time"

	"github.com/retryd/retryd/engine"
)

// timerEntry is one deadline: 16 bytes (a time.Time alone is 24), as
// every pending retry has one. The deadline is on the wall clock, the
// clock of the due and start times the log records: if the wall clock
// steps, a timer fires when the wall clock reaches its deadline, so a
// retry never starts at a recorded time before its recorded due time.
type timerEntry struct {
	at    int64 // Unix nanoseconds
	retry *engine.Retry
}

// when returns the entry's deadline.
func (e timerEntry) when() time.Time { return time.Unix(0, e.at) }

// timerHeap holds every pending retry's next deadline in one min-heap,
// served by one goroutine: a million pending retries cost a million small
// entries, not a million sleeping goroutines.
type timerHeap struct {
	mu      sync.Mutex
	entries entries
	wake    chan struct{} // signalled when an earlier entry arrives
	stopped bool
	// timer is next's sleep, reused across calls (only the timer
	// goroutine calls next).
	timer *time.Timer
}

// entries is a binary min-heap by time, written out rather than through
// container/heap, whose interface boxes every entry pushed or popped.
type entries []timerEntry

func (h entries) less(i, j int) bool { return h[i].at < h[j].at }

func (h *entries) push(e timerEntry) {
	*h = append(*h, e)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (h *entries) pop() timerEntry {
	q := *h
	e := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = timerEntry{}
	q = q[:n]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < n && q.less(l, least) {
			least = l
		}
		if r < n && q.less(r, least) {
			least = r
		}
		if least == i {
			break
		}
		q[i], q[least] = q[least], q[i]
		i = least
	}
	*h = q
	return e
}

func newTimerHeap() *timerHeap {
	return &timerHeap{wake: make(chan struct{}, 1)}
}

func (t *timerHeap) push(at time.Time, r *engine.Retry) {
	t.mu.Lock()
	t.entries.push(timerEntry{at: at.UnixNano(), retry: r})
	first := t.entries[0].retry == r && t.entries[0].at == at.UnixNano()
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
	due, ok := t.due(now, nil, 1)
	if !ok {
		return timerEntry{}, false
	}
	return due[0], true
}

// due blocks until the earliest entry is due, then pops it and every other
// entry due by then, at most limit, in deadline order, appended to buf; ok
// is false once the heap is stopped. One wake-up of the timer goroutine
// serves every retry that fell due while it slept or worked, under one
// acquisition of the heap's lock.
func (t *timerHeap) due(now func() time.Time, buf []timerEntry, limit int) (_ []timerEntry, ok bool) {
	if t.timer == nil {
		t.timer = time.NewTimer(time.Hour)
	}
	timer := t.timer
	for {
		t.mu.Lock()
		if t.stopped {
			t.mu.Unlock()
			return buf, false
		}
		wait := time.Hour
		if len(t.entries) > 0 {
			at := now().UnixNano()
			if wait = time.Duration(t.entries[0].at - at); wait <= 0 {
				for n := 0; n < limit && len(t.entries) > 0 && t.entries[0].at <= at; n++ {
					buf = append(buf, t.entries.pop())
				}
				t.mu.Unlock()
				return buf, true
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
