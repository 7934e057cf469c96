package redis

import (
	"sync/atomic"
	"testing"

	"github.com/retryd/retryd/store/redis/redistest"
)

// TestLeadOfAnEmptyQueue: the leader commits in a goroutine of its own,
// and its caller may leave the queue at its bound before that goroutine
// takes a group; the lead then finds the queue empty, commits nothing and
// gives the partition's lead up, so that the next caller leads.
func TestLeadOfAnEmptyQueue(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	s := openReplica(t, srv.URL(0), redistest.Prefix(), newFakeClock(), &atomic.Int64{}, false)
	q := s.queues[0]
	q.mu.Lock()
	q.leading = true
	q.mu.Unlock()
	s.lead(0)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.leading {
		t.Error("the partition still has a leader after the lead of an empty queue")
	}
}
