package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/retryd/retryd/store/redis/redistest"
)

// TestKeySlot: keySlot agrees with a Cluster node's CLUSTER KEYSLOT, with
// and without hash tags.
func TestKeySlot(t *testing.T) {
	t.Parallel()
	c := redistest.SharedCluster(t)
	rc := c.Client(t)
	ctx := context.Background()
	keys := []string{"", "a", "retryd:schema", "{}", "{}x", "x{}y", "{a}b", "c{a}", "x{a}{b}", "{a", "a}",
		"retryd:{3.7}:s:session-1", "t1-2:retryd:{0.12}:seq", "\x00\xff{\x80}"}
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("session-%d", i), fmt.Sprintf("retryd:{%d.%d}:timers", i%16, i))
	}
	for _, k := range keys {
		want, err := rc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

// TestPartitionedLayout: partition p's tag hashes into the p-th n-th of the
// slots, every key of a partition shares its slot, and retry ids carry
// their partition.
func TestPartitionedLayout(t *testing.T) {
	for _, n := range []int{1, 2, 3, 16, 100, MaxPartitions} {
		l := partitionedLayout("pre:", n)
		for p, tag := range l.tags {
			slot := int(keySlot("{" + tag + "}"))
			if lo, hi := p*clusterSlots/n, (p+1)*clusterSlots/n; slot < lo || slot >= hi {
				t.Fatalf("%d partitions: partition %d's tag %q is in slot %d, want [%d, %d)", n, p, tag, slot, lo, hi)
			}
		}
		for _, session := range []string{"s", "tenant\x1fs", "}{", "a-b-3"} {
			p := l.partition(session)
			slot := keySlot(l.sessionKey(session))
			for _, k := range []string{l.awaitersKey(session), l.countersKey(p), l.timersKey(p),
				l.eventsKey(p), l.fleetKey(p, "t\x1fprovider"), l.retryKey(p, "R")} {
				if keySlot(k) != slot {
					t.Errorf("%d partitions: %q is in slot %d, the session key %q in %d", n, k, keySlot(k), l.sessionKey(session), slot)
				}
			}
			// A retry id names its session when the session's id fits
			// (the partition is the session's), else its partition.
			id := l.retryID(p, "ABCDEF-1", session)
			named, ok := retrySession(id)
			switch fits := session == "s" || session == "a-b-3"; {
			case fits && (!ok || named != session):
				t.Errorf("%d partitions: retry id %q names session %q, %v, want %q", n, id, named, ok, session)
			case !fits && ok:
				t.Errorf("%d partitions: retry id %q of session %q names session %q", n, id, session, named)
			case !fits:
				if got, ok := l.retryPartition(id); !ok || got != p {
					t.Errorf("%d partitions: retryPartition(%q) = %d, %v, want %d", n, id, got, ok, p)
				}
			}
		}
		if id := l.retryID(0, "GEN", strings.Repeat("s", 61)); strings.Contains(id, "_") {
			t.Errorf("%d partitions: retry id %q names a session id one byte too long", n, id)
		}
		if id := l.retryID(0, "GEN_1", "s"); id != "GEN-1_s" {
			t.Errorf("%d partitions: retry id %q of a generated id with an underscore, want GEN-1_s", n, id)
		}
		if id := l.retryID(0, "GEN_1", "s s"); strings.Contains(id, "_") {
			t.Errorf("%d partitions: retry id %q of a session it cannot name holds an underscore", n, id)
		}
		if id := l.retryID(0, "GEN", strings.Repeat("s", 60)); id != "GEN_"+strings.Repeat("s", 60) {
			t.Errorf("%d partitions: a session id of 60 bytes is not in retry id %q", n, id)
		}
		for _, id := range []string{"ABC", "ABC-", "ABC-x", "ABC-01", fmt.Sprintf("ABC-%d", n)} {
			if p, ok := l.retryPartition(id); ok {
				t.Errorf("%d partitions: retryPartition(%q) = %d, want none", n, id, p)
			}
		}
	}
}
