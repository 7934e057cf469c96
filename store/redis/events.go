package redis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The event log. A group commit appends its partition's events as one
// stream entry: its id is the group's last sequence (SEQ-0), its field g
// the events (retryd.v1.Event), each as a length-prefixed record, in
// sequence order. One XADD per group, not one per event, is most of what
// the log costs Redis at saturation, where a dozen decisions share a
// commit. A reader that resumes after sequence n reads from the entry
// n+1-0 on and skips the events it holds up to n: an entry holds every
// event of its id's group, so none is missed.
//
// Entries of schemas 1 to 4, one event each in the field e, read the same
// way, so a converted log stays readable.

// eventsField and eventField are an entry's field names: several events,
// or one.
const (
	eventsField = "g"
	eventField  = "e"
)

// appendEvents adds to a commit the XADD of the group's events (txns'
// events in order, already numbered), when there are any.
func (s *Store) appendEvents(ctx context.Context, c *commit, p int, txns []*txn) error {
	var entry []byte
	n, last := 0, uint64(0)
	for _, t := range txns {
		for _, ev := range t.events {
			b, err := ev.MarshalVT()
			if err != nil {
				return fmt.Errorf("redis store: encoding event: %w", err)
			}
			entry = protowire.AppendBytes(entry, b)
			n, last = n+1, ev.GetSequence()
		}
	}
	if n == 0 {
		return nil
	}
	id := strconv.FormatUint(last, 10) + "-0"
	c.XAdd(ctx, s.keys.eventsKey(p), s.trim(p, last, n), id, eventsField, entry)
	return nil
}

// trim is the XADD trimming of partition p's stream once an entry of n
// events ending at sequence last is appended, keeping about
// partitionLogSize events. With one partition sequences are gapless, so
// the entries of the last partitionLogSize sequences are kept exactly
// (MINID). With several they are not (see sequenceBase): the stream keeps
// partitionLogSize events' worth of entries at the partition's recent
// average of events per entry (MAXLEN), which is about as many.
func (s *Store) trim(p int, last uint64, n int) []any {
	size := s.partitionLogSize()
	if s.keys.partitions() == 1 {
		return []any{"MINID", "~", max(int64(last)-int64(size)+1, 0)}
	}
	q := s.queues[p] // written by the partition's leader only
	if q.perEntry == 0 {
		q.perEntry = float64(n)
	}
	q.perEntry += (float64(n) - q.perEntry) / 16
	return []any{"MAXLEN", "~", max(int(float64(size)/max(q.perEntry, 1)), readBatch)}
}

// decodeEvents returns the events of a stream entry after sequence after,
// in order.
func decodeEvents(m redis.XMessage, after uint64) ([]*retrydv1.Event, error) {
	if v, ok := m.Values[eventField].(string); ok {
		ev, err := decodeEvent(m.ID, []byte(v))
		if err != nil || ev.GetSequence() <= after {
			return nil, err
		}
		return []*retrydv1.Event{ev}, nil
	}
	v, ok := m.Values[eventsField].(string)
	if !ok {
		return nil, fmt.Errorf("redis store: event entry %s has no payload", m.ID)
	}
	var out []*retrydv1.Event
	for b := []byte(v); len(b) > 0; {
		rec, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, fmt.Errorf("redis store: event entry %s is damaged: %w", m.ID, protowire.ParseError(n))
		}
		b = b[n:]
		ev, err := decodeEvent(m.ID, rec)
		if err != nil {
			return nil, err
		}
		if ev.GetSequence() > after {
			out = append(out, ev)
		}
	}
	return out, nil
}

func decodeEvent(id string, b []byte) (*retrydv1.Event, error) {
	ev := &retrydv1.Event{}
	if err := proto.Unmarshal(b, ev); err != nil {
		return nil, fmt.Errorf("redis store: event entry %s is damaged: %w", id, err)
	}
	return ev, nil
}
