package memory

import (
	"sync"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// eventLog is the bounded, ordered event log: a ring of the newest events,
// each numbered by a sequence that increases by one per event. Readers wait
// on notify, which is closed and replaced on every append.
type eventLog struct {
	mu     sync.Mutex
	ring   []*retrydv1.Event
	last   uint64 // sequence of the newest event; 0 when empty
	notify chan struct{}
}

func newEventLog(size int) *eventLog {
	return &eventLog{ring: make([]*retrydv1.Event, size), notify: make(chan struct{})}
}

// append numbers and stores events. Callers hold their session's shard lock,
// so one session's events enter the log in the order they happened.
func (l *eventLog) append(evs ...*retrydv1.Event) {
	if len(evs) == 0 {
		return
	}
	l.mu.Lock()
	for _, ev := range evs {
		l.last++
		ev.Sequence = l.last
		l.ring[(l.last-1)%uint64(len(l.ring))] = ev
	}
	close(l.notify)
	l.notify = make(chan struct{})
	l.mu.Unlock()
}

// read returns up to limit retained events after sequence after (of one
// session when sessionID is set), the sequence to resume after, and a
// channel closed by the next append.
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
		if sessionID == "" || ev.GetSessionId() == sessionID {
			out = append(out, ev)
		}
	}
	return out, seq - 1, l.notify
}
