package memory

import (
	"sync"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// eventLog is the bounded, ordered event log: a ring of the newest events,
// each numbered by a sequence that increases by one per event. Readers wait
// on notify, which is closed and replaced whenever more becomes readable.
//
// A store without persistence numbers and publishes events in one step
// (append). A durable store must write an event with its final sequence
// before anyone may read it, and may fail to write it, so it numbers the
// events first (reserve, under the session's shard lock and the log lock:
// one session's events are numbered in the order they happened, one
// transition's events are consecutive) and publishes or abandons them once
// the write returned (resolve). Writes of different sessions finish in any
// order, so the log keeps the reservations in sequence order and readers
// see sequences only up to last, below which every reservation is resolved:
// a reader never sees sequence n+1 and later learns of n. An abandoned
// reservation leaves a gap in the numbering, which readers skip; sequences
// stay strictly increasing.
type eventLog struct {
	mu     sync.Mutex
	ring   []*retrydv1.Event
	last   uint64 // every sequence up to last is published or abandoned; 0 when empty
	next   uint64 // the newest sequence handed out
	open   []*reservation
	notify chan struct{}
	// watched: a reader holds notify, so it must be closed (and replaced)
	// when more becomes readable; while nobody waits, appends skip it.
	watched bool
}

// reservation is a run of consecutive sequences handed to one transition.
type reservation struct {
	last     uint64
	events   []*retrydv1.Event
	resolved bool
}

func newEventLog(size int) *eventLog {
	return &eventLog{ring: make([]*retrydv1.Event, size), notify: make(chan struct{})}
}

// restore starts the log from recovered events (in sequence order, gaps
// allowed) numbered up to last.
func (l *eventLog) restore(evs []*retrydv1.Event, last uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	size := uint64(len(l.ring))
	for _, ev := range evs {
		if seq := ev.GetSequence(); seq != 0 && seq <= last && seq+size > last {
			l.ring[(seq-1)%size] = ev
		}
	}
	l.last, l.next = last, last
}

// append numbers and publishes events. Callers hold their session's shard
// lock, so one session's events enter the log in the order they happened.
func (l *eventLog) append(evs ...*retrydv1.Event) {
	if len(evs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.open) > 0 {
		l.resolveLocked(l.reserveLocked(evs), true)
		return
	}
	for _, ev := range evs {
		l.next++
		ev.Sequence = l.next
		l.ring[(l.next-1)%uint64(len(l.ring))] = ev
	}
	l.last = l.next
	l.wake()
}

// wake tells the readers waiting on notify that more is readable.
func (l *eventLog) wake() {
	if l.watched {
		close(l.notify)
		l.notify = make(chan struct{})
		l.watched = false
	}
}

// reserve numbers events without making them readable; resolve the
// returned reservation exactly once. Callers hold their session's shard
// lock until they resolve it.
func (l *eventLog) reserve(evs []*retrydv1.Event) *reservation {
	if len(evs) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reserveLocked(evs)
}

func (l *eventLog) reserveLocked(evs []*retrydv1.Event) *reservation {
	for _, ev := range evs {
		l.next++
		ev.Sequence = l.next
	}
	r := &reservation{last: l.next, events: evs}
	l.open = append(l.open, r)
	return r
}

// resolve publishes a reservation's events, or abandons their sequences,
// and makes readable every sequence no earlier reservation still holds back.
func (l *eventLog) resolve(r *reservation, publish bool) {
	if r == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resolveLocked(r, publish)
}

func (l *eventLog) resolveLocked(r *reservation, publish bool) {
	if publish {
		size := uint64(len(l.ring))
		for _, ev := range r.events {
			l.ring[(ev.Sequence-1)%size] = ev
		}
	}
	r.resolved, r.events = true, nil
	advanced := false
	for len(l.open) > 0 && l.open[0].resolved {
		l.last = l.open[0].last
		l.open[0] = nil
		l.open = l.open[1:]
		advanced = true
	}
	if advanced {
		l.wake()
	}
}

// read returns up to limit retained events after sequence after (of one
// session when sessionID is set), the sequence to resume after, and a
// channel closed when more becomes readable. A sequence whose slot holds no
// event of that number (abandoned, or overwritten by a newer event while an
// earlier write was still in flight) is skipped.
func (l *eventLog) read(after uint64, sessionID string, limit int) ([]*retrydv1.Event, uint64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	size := uint64(len(l.ring))
	first := uint64(1)
	if l.last > size {
		first = l.last - size + 1
	}
	seq := max(after+1, first)
	var out []*retrydv1.Event
	for ; seq <= l.last && len(out) < limit; seq++ {
		ev := l.ring[(seq-1)%size]
		if ev == nil || ev.GetSequence() != seq {
			continue
		}
		if sessionID == "" || ev.GetSessionId() == sessionID {
			out = append(out, ev)
		}
	}
	l.watched = true
	return out, seq - 1, l.notify
}
