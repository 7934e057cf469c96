package redis

import (
	"context"
	"github.com/retryd/retryd/store"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestGroupEventsOneEntry: a group commit appends its events as one
// stream entry whose id is its last sequence, and WatchEvents, resumed
// after any sequence (inside an entry too), delivers every later event
// once, in order, for every session and for one.
func TestGroupEventsOneEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Shared(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	s := openReplica(t, srv.URL(0), redistest.Prefix(), newFakeClock(), &atomic.Int64{}, false)
	pol := fixedPolicy(t, time.Hour, 3)

	commit := func(sessions ...string) {
		t.Helper()
		group := make([]*request, len(sessions))
		for i, id := range sessions {
			var out engine.FailOutcome
			group[i] = &request{id: id, fn: decide(failureOf(pol, id, 1, 1), &out), bound: time.Now().Add(time.Minute)}
		}
		for i, err := range s.commitGroup(0, group) {
			if err != nil {
				t.Fatalf("decision %d of the group: %v", i, err)
			}
		}
	}
	commit("a", "b", "c")
	commit("d")
	commit("e", "f")

	msgs, err := rdb.XRange(ctx, s.keys.eventsKey(0), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 3 {
		t.Fatalf("three group commits made %d stream entries", len(msgs))
	}
	var all []*retrydv1.Event
	for _, m := range msgs {
		evs, err := decodeEvents(m, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 || m.ID != strconv.FormatUint(evs[len(evs)-1].GetSequence(), 10)+"-0" {
			t.Fatalf("entry %s holds %d events, want its id to be the last one's sequence", m.ID, len(evs))
		}
		all = append(all, evs...)
	}
	if len(all) < 6 {
		t.Fatalf("six decisions logged %d events", len(all))
	}
	for i, ev := range all {
		if ev.GetSequence() != uint64(i+1) {
			t.Fatalf("event %d has sequence %d", i, ev.GetSequence())
		}
	}

	for after := range uint64(len(all)) + 1 {
		for _, session := range []string{"", "a", "d", "f"} {
			var got []uint64
			err := store.New(s).WatchEvents(ctx, &retrydv1.WatchEventsRequest{SessionId: session, AfterSequence: after, StopAtEnd: true},
				func(ev *retrydv1.Event) error {
					got = append(got, ev.GetSequence())
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			var want []uint64
			for _, ev := range all {
				if ev.GetSequence() > after && (session == "" || ev.GetSessionId() == session) {
					want = append(want, ev.GetSequence())
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("WatchEvents(session %q, after %d) = %v, want %v", session, after, got, want)
			}
		}
	}
}
