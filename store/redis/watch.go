package redis

import (
	"cmp"
	"container/heap"
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
)

// Sequences with several partitions. Each partition numbers its own
// events: a transaction's first event gets the larger of the partition's
// last sequence plus one and the committing replica's wall clock in
// microseconds (a hybrid logical clock), the rest follow it. So sequences
// strictly increase within a partition, hence within a session, and
// events of different partitions committed a while apart are ordered by
// their sequences as by their commit times.
//
// That is what lets WatchEvents of every session (watchAll) deliver one
// order across partitions that a client can resume after one sequence: it
// reads every partition's stream and holds each event until no partition
// can still commit an event of a smaller sequence, which is once the
// reader's clock is clockAllowance past the event's sequence (or every
// partition has shown a later one). That holds while the replicas' clocks
// agree within clockAllowance and a commit reaches Redis within it after
// its sequence was taken; an event that arrives later anyway is delivered
// at once, out of order, and a client that resumed after a larger
// sequence misses it (the invariant checker, which checks order per
// session, is not affected). Unfiltered watchers see events clockAllowance
// late; a session's own stream is read directly, without the wait.
const clockAllowance = 250 * time.Millisecond

// sequenceBase is what the first event of a transaction of the partition
// whose last sequence is last comes after.
func (s *Store) sequenceBase(last uint64) uint64 {
	if s.keys.partitions() == 1 {
		return last
	}
	return max(last, uint64(time.Now().UnixMicro())-1)
}

// partitionLogSize is roughly how many events each partition's stream
// keeps: the configured size over the partitions.
func (s *Store) partitionLogSize() int {
	return max(s.cfg.EventLogSize/s.keys.partitions(), readBatch)
}

// mergedReader reads every partition's stream, for WatchEvents of every
// session with several partitions.
type mergedReader struct {
	s    *Store
	read []uint64 // the last sequence read per partition
	held eventHeap
	sent uint64
}

func (s *Store) newMergedReader(after uint64) *mergedReader {
	r := &mergedReader{s: s, read: make([]uint64, s.keys.partitions()), sent: after}
	for p := range r.read {
		r.read[p] = after
	}
	return r
}

// Held implements store.EventReader.
func (r *mergedReader) Held() bool { return r.held.Len() > 0 }

// Next implements store.EventReader: it reads every partition once and
// returns the held events no partition can precede any more.
func (r *mergedReader) Next(ctx context.Context) (store.Batch, error) {
	s := r.s
	notified, release := s.notify.watch("")
	at := time.Now()
	cmds := make([]*redis.XMessageSliceCmd, len(r.read))
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for p := range cmds {
			cmds[p] = pl.XRangeN(ctx, s.keys.eventsKey(p), strconv.FormatUint(r.read[p]+1, 10)+"-0", "+", readBatch)
		}
		return nil
	})
	if err != nil {
		release()
		return store.Batch{}, unavailable("reading events", err)
	}
	// Everything up to watermark has been read from every partition.
	watermark := uint64(at.Add(-clockAllowance).UnixMicro())
	full := false
	for p, c := range cmds {
		msgs := c.Val()
		for _, m := range msgs {
			evs, err := decodeEvents(m, r.read[p])
			if err != nil {
				release()
				return store.Batch{}, err
			}
			for _, ev := range evs {
				heap.Push(&r.held, ev)
				r.read[p] = ev.GetSequence()
			}
		}
		if len(msgs) == readBatch {
			full = true
			watermark = min(watermark, r.read[p])
		}
	}
	var out []*retrydv1.Event
	for r.held.Len() > 0 && (r.held[0].GetSequence() <= watermark || r.held[0].GetSequence() <= r.sent) {
		ev := heap.Pop(&r.held).(*retrydv1.Event)
		out = append(out, ev)
		r.sent = max(r.sent, ev.GetSequence())
	}
	recheck := recheckInterval
	if r.held.Len() > 0 {
		// The oldest held event is released once the clock passes it.
		due := time.UnixMicro(int64(r.held[0].GetSequence())).Add(clockAllowance)
		recheck = min(recheck, max(time.Until(due), time.Millisecond))
	}
	return store.Batch{Events: out, More: full, Wake: notified, Recheck: recheck, Release: release}, nil
}

// eventHeap orders held events by sequence.
type eventHeap []*retrydv1.Event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return cmp.Less(h[i].GetSequence(), h[j].GetSequence())
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*retrydv1.Event)) }
func (h *eventHeap) Pop() any {
	old := *h
	ev := old[len(old)-1]
	*h = slices.Delete(old, len(old)-1, len(old))
	return ev
}
