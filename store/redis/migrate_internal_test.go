package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/protobuf/proto"
)

// TestMigrateLegacyLayout: data of the older layouts (schemas 1 and 3,
// and 2 and 4 with partitions) is refused with an error naming the
// parameter that converts it, and converted when the URL has it: the
// sessions, the population, the event log and its numbering carry on, and
// the older layout's keys are gone.
func TestMigrateLegacyLayout(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	for _, tc := range []struct {
		name, query, legacy, want, other string
		counters                         bool // the version kept seq and stats
	}{
		{"single 1", "", "1", "5", "2", true},
		{"single 3", "", "3", "5", "1", false},
		{"partitioned 2", "?partitions=4", "2 partitions=4", "6 partitions=4", "1", true},
		{"partitioned 4", "?partitions=4", "4 partitions=4", "6 partitions=4", "2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url, prefix := srv.URL(0)+tc.query, redistest.Prefix()
			rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
			defer rdb.Close()
			pol := fixedPolicy(t, time.Hour, 3)

			// Sessions written by this layout, then turned into the older
			// one's keys as it wrote them.
			s, err := Open(ctx, Config{URL: url, KeyPrefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			sessions := []string{"a", "b", "c", "d", "e"}
			answers := map[string]*retrydv1.FailedStepResponse{}
			for _, id := range sessions {
				out, err := store.New(s).FailedStep(ctx, failureOf(pol, id, 1, 1))
				if err != nil {
					t.Fatal(err)
				}
				answers[id] = out.Response
			}
			before := s.Stats()
			last := lastSequence(t, s)
			logged := eventLog(t, s)
			s.Close()
			var seqTotal uint64
			for p := range s.keys.partitions() {
				oneEventPerEntry(t, rdb, s.keys.eventsKey(p))
			}
			for p := range s.keys.partitions() {
				if !tc.counters {
					break
				}
				raw, err := rdb.Get(ctx, s.keys.countersKey(p)).Result()
				if errors.Is(err, goredis.Nil) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				c := parseCounters(raw)
				seqTotal += c.seq
				base := s.keys.base(p)
				if err := rdb.Set(ctx, base+"seq", c.seq, 0).Err(); err != nil {
					t.Fatal(err)
				}
				if err := rdb.HSet(ctx, base+"stats", "sessions", c.pop.sessions, "chains", c.pop.chains, "pending", c.pop.pending).Err(); err != nil {
					t.Fatal(err)
				}
				if err := rdb.Del(ctx, s.keys.countersKey(p)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.counters && seqTotal == 0 {
				t.Fatal("no partition has counters")
			}
			// The older layouts had a timer per retry besides the session's,
			// "RETRY SESSION", which the newer one handles once and removes.
			legacyTimer := s.keys.timersKey(s.keys.partition("a"))
			legacyMember := "R0 a"
			if err := rdb.ZAdd(ctx, legacyTimer, goredis.Z{Score: 0, Member: legacyMember}).Err(); err != nil {
				t.Fatal(err)
			}
			schemaKey := prefix + "retryd:schema"
			if err := rdb.Set(ctx, schemaKey, tc.legacy, 0).Err(); err != nil {
				t.Fatal(err)
			}

			// Refused without the parameter, or with another schema's.
			for _, q := range []string{"", "migrate=" + tc.other} {
				u := url
				if q != "" {
					u += map[bool]string{true: "&", false: "?"}[strings.Contains(u, "?")] + q
				}
				_, err := Open(ctx, Config{URL: u, KeyPrefix: prefix})
				var se *SchemaError
				want := "migrate=" + strings.Fields(tc.legacy)[0]
				if !errors.As(err, &se) || se.Found != tc.legacy || se.Want != tc.want || !strings.Contains(err.Error(), want) {
					t.Fatalf("Open %q over schema %q: %v, want a SchemaError naming %s", q, tc.legacy, err, want)
				}
			}
			if v, _ := rdb.Get(ctx, schemaKey).Result(); v != tc.legacy {
				t.Fatalf("a refused Open changed the schema to %q", v)
			}

			migrateURL := url + map[bool]string{true: "&", false: "?"}[strings.Contains(url, "?")] + "migrate=" + strings.Fields(tc.legacy)[0]
			m, err := Open(ctx, Config{URL: migrateURL, KeyPrefix: prefix})
			if err != nil {
				t.Fatalf("Open with migrate: %v", err)
			}
			defer m.Close()
			if v, _ := rdb.Get(ctx, schemaKey).Result(); v != tc.want {
				t.Errorf("schema after the conversion: %q, want %q", v, tc.want)
			}
			for p := range m.keys.partitions() {
				if n, _ := rdb.Exists(ctx, m.keys.base(p)+"seq", m.keys.base(p)+"stats").Result(); n != 0 {
					t.Errorf("partition %d still has %d keys of the older layout", p, n)
				}
			}
			if got := eventLog(t, m); !slices.Equal(got, logged) {
				t.Errorf("the event log after the conversion: %v, before: %v", got, logged)
			}
			if got := m.Stats(); got.Sessions != before.Sessions || got.OpenChains != before.OpenChains ||
				got.PendingRetries != before.PendingRetries || got.Sessions != int64(len(sessions)) {
				t.Errorf("population after the conversion: %+v, before: %+v", got, before)
			}
			for _, id := range sessions {
				out, err := store.New(m).FailedStep(ctx, failureOf(pol, id, 1, 1))
				if err != nil {
					t.Fatalf("FailedStep(%s) repeated after the conversion: %v", id, err)
				}
				if !proto.Equal(out.Response, answers[id]) {
					t.Errorf("FailedStep(%s) repeated after the conversion: %v, before: %v", id, out.Response, answers[id])
				}
			}
			// A new session's events are numbered after every older one.
			if _, err := store.New(m).FailedStep(ctx, failureOf(pol, "f", 1, 1)); err != nil {
				t.Fatal(err)
			}
			if got := lastSequence(t, m); got <= last {
				t.Errorf("the first event after the conversion has sequence %d, the last before it %d", got, last)
			}
			if got := m.Stats().Sessions; got != int64(len(sessions))+1 {
				t.Errorf("sessions after one more: %d", got)
			}

			for deadline := time.Now().Add(5 * time.Second); ; {
				_, err := rdb.ZScore(ctx, legacyTimer, legacyMember).Result()
				if errors.Is(err, goredis.Nil) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the older layout's retry timer is still there: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := rdb.ZScore(ctx, legacyTimer, timerMember("a")).Result(); err != nil {
				t.Errorf("session a's timer after the older one fired: %v", err)
			}

			// Opening again with the parameter left in the URL is a no-op.
			again, err := Open(ctx, Config{URL: migrateURL, KeyPrefix: prefix})
			if err != nil {
				t.Fatalf("Open with migrate over converted data: %v", err)
			}
			again.Close()
		})
	}
}

// eventLog is every event's session and sequence, as WatchEvents
// delivers them.
func eventLog(t *testing.T, s *Store) []string {
	t.Helper()
	var out []string
	err := store.New(s).WatchEvents(context.Background(), &retrydv1.WatchEventsRequest{StopAtEnd: true}, func(ev *retrydv1.Event) error {
		out = append(out, ev.GetSessionId()+"@"+strconv.FormatUint(ev.GetSequence(), 10))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// oneEventPerEntry rewrites a stream as the layouts before schema 5 wrote
// it: one entry per event, its id the event's sequence, field e.
func oneEventPerEntry(t *testing.T, rdb *goredis.Client, stream string) {
	t.Helper()
	ctx := context.Background()
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, stream).Err(); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		evs, err := decodeEvents(m, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			b, err := proto.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			id := strconv.FormatUint(ev.GetSequence(), 10) + "-0"
			if err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: stream, ID: id, Values: []any{eventField, b}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// lastSequence is the largest sequence in the event log.
func lastSequence(t *testing.T, s *Store) uint64 {
	t.Helper()
	var last uint64
	err := store.New(s).WatchEvents(context.Background(), &retrydv1.WatchEventsRequest{StopAtEnd: true}, func(ev *retrydv1.Event) error {
		last = max(last, ev.GetSequence())
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrShutdown) {
		t.Fatal(err)
	}
	if last == 0 {
		t.Fatal("no events")
	}
	return last
}
