package redis

import (
	"context"
	"fmt"
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
			id := l.retryID(p, "ABCDEF-1")
			if got, ok := l.retryPartition(id); !ok || got != p {
				t.Errorf("%d partitions: retryPartition(%q) = %d, %v, want %d", n, id, got, ok, p)
			}
		}
		for _, id := range []string{"ABC", "ABC-", "ABC-x", "ABC-01", fmt.Sprintf("ABC-%d", n)} {
			if p, ok := l.retryPartition(id); ok {
				t.Errorf("%d partitions: retryPartition(%q) = %d, want none", n, id, p)
			}
		}
	}
}
