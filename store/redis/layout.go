package redis

import (
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	"github.com/retryd/retryd/store"
)

// The key layouts. Both keep a session's keys under one hash tag; they
// differ in where the state that is not a session's own lives.
//
// Schema 1, the single layout (standalone Redis and Sentinel, the
// default): a session's keys carry the tag {SESSION}; the sequence
// counter, the timer set, the global stream, the population counters, the
// fleet states and the retry index are keys of no tag, shared by every
// session. One counter numbers every event: the log has one gapless order
// across the fleet. Every transaction spans several slots, so it does not
// run on Redis Cluster.
//
// Schema 2, the partitioned layout (Redis Cluster, or ?partitions=N on any
// Redis): sessions are spread over N partitions by a hash of their id, and
// every key of partition p — its sessions' keys, its sequence counter,
// timer set, stream, counters, fleet states and retry index — carries the
// partition's hash tag, so one transaction touches one slot. The tags are
// chosen so that the partitions spread evenly over Cluster's 16384 slots
// (partition p's tag hashes into the p-th N-th of them), hence over its
// masters. A retry id ends in -p, its partition, so AwaitRetry and
// CancelRetries find it without an index across slots. Events are
// numbered per partition (see sequence), so the log is ordered per session
// and per partition; WatchEvents of every session merges the partitions in
// sequence order (watch.go).
type layout struct {
	prefix string
	// tags[p] is partition p's hash tag; nil in the single layout.
	tags []string
}

const (
	// MaxPartitions bounds ?partitions=N.
	MaxPartitions = 1024
	// DefaultClusterPartitions is the number of partitions on Redis
	// Cluster when the URL names none: a few per master of a usual cluster,
	// so that adding masters spreads the load, and few enough that every
	// replica can poll every partition's timers.
	DefaultClusterPartitions = 16
	// clusterSlots is Redis Cluster's number of hash slots.
	clusterSlots = 16384
)

func singleLayout(prefix string) layout { return layout{prefix: prefix} }

// partitionedLayout returns the layout of n partitions (1 ≤ n ≤
// MaxPartitions).
func partitionedLayout(prefix string, n int) layout {
	l := layout{prefix: prefix, tags: make([]string, n)}
	for p := range n {
		lo, hi := p*clusterSlots/n, (p+1)*clusterSlots/n
		for k := 0; ; k++ {
			tag := strconv.Itoa(p) + "." + strconv.Itoa(k)
			if slot := int(keySlot(tag)); slot >= lo && slot < hi {
				l.tags[p] = tag
				break
			}
		}
	}
	return l
}

// schema is the value of the schema key this layout writes and reads.
func (l layout) schema() string {
	if l.tags == nil {
		return l.schemaOf(SchemaVersion)
	}
	return l.schemaOf(PartitionedSchemaVersion)
}

// schemaOf is the value of the schema key that version v of this
// layout writes: v, and the number of partitions in the partitioned one.
func (l layout) schemaOf(v int) string {
	if l.tags == nil {
		return strconv.Itoa(v)
	}
	return strconv.Itoa(v) + " partitions=" + strconv.Itoa(len(l.tags))
}

// olderVersions are the older versions of this layout that migrate
// converts, oldest first.
func (l layout) olderVersions() []int {
	if l.tags == nil {
		return []int{countersSchemaVersion - 2, countersSchemaVersion}
	}
	return []int{countersPartitionedSchemaVersion - 2, countersPartitionedSchemaVersion}
}

// partitioned reports whether this is the partitioned layout.
func (l layout) partitioned() bool { return l.tags != nil }

// partitions returns the number of partitions (1 in the single layout).
func (l layout) partitions() int { return max(len(l.tags), 1) }

// partition returns the partition of a session.
func (l layout) partition(sessionID string) int {
	if len(l.tags) <= 1 {
		return 0
	}
	return int(crc32.ChecksumIEEE([]byte(sessionID)) % uint32(len(l.tags)))
}

// base is the start of partition p's keys: retryd:{TAG}: (partitioned), or
// retryd: (single).
func (l layout) base(p int) string {
	if l.tags == nil {
		return l.prefix + "retryd:"
	}
	return l.prefix + "retryd:{" + l.tags[p] + "}:"
}

// Keys of a session.

func (l layout) sessionKey(id string) string {
	if l.tags == nil {
		return l.prefix + "retryd:{" + id + "}:s"
	}
	return l.base(l.partition(id)) + "s:" + id
}

func (l layout) awaitersKey(id string) string {
	if l.tags == nil {
		return l.prefix + "retryd:{" + id + "}:aw"
	}
	return l.base(l.partition(id)) + "a:" + id
}

// Keys of a partition.

// countersKey holds the partition's counters: its last event sequence
// and its population (see counters).
func (l layout) countersKey(p int) string { return l.base(p) + "counters" }
func (l layout) timersKey(p int) string   { return l.base(p) + "timers" }
func (l layout) eventsKey(p int) string   { return l.base(p) + "events" }

// fleetKey is a fleet state's key in partition p.
func (l layout) fleetKey(p int, key string) string { return l.base(p) + "fleet:" + key }

// retryKey is the retry index entry of a retry of partition p: the
// retry's session.
func (l layout) retryKey(p int, retryID string) string { return l.base(p) + "r:" + retryID }

// retryID makes a new retry id of partition p for a session from a
// generated one. When the session id fits, the retry id names it —
// GENERATED_SESSION, GENERATED without an underscore, SESSION of the
// characters a retry id may hold, at most store.MaxRetryIDLen bytes in
// all — and needs no retry index key (see retrySession). Otherwise it is
// the generated id, which with several partitions ends in -p, p the
// partition: AwaitRetry and CancelRetries by id then read the index key.
// So a retry id holds an underscore only to name its session: a generated
// id holds none (rand.Text's never do; a test's generator that makes one
// has it replaced by a hyphen).
func (l layout) retryID(p int, generated, sessionID string) string {
	generated = strings.ReplaceAll(generated, "_", "-")
	if len(generated)+1+len(sessionID) <= store.MaxRetryIDLen && isToken(sessionID) {
		return generated + "_" + sessionID
	}
	if l.tags == nil {
		return generated
	}
	return generated + "-" + strconv.Itoa(p)
}

// retrySession returns the session a retry id names (see retryID); false
// for an id that names none, whose session the retry index knows. A
// retry id comes from a client: the session it names is only a place to
// look, where the retry may not be.
func retrySession(retryID string) (string, bool) {
	_, session, ok := strings.Cut(retryID, "_")
	return session, ok && session != ""
}

// isToken reports whether s holds only the characters of a retry id.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return s != ""
}

// retryPartition returns the partition of a retry id that names no
// session; false when it names none of this layout's.
func (l layout) retryPartition(retryID string) (int, bool) {
	if l.tags == nil {
		return 0, true
	}
	i := strings.LastIndexByte(retryID, '-')
	if i < 0 {
		return 0, false
	}
	digits := retryID[i+1:]
	p, err := strconv.Atoi(digits)
	if err != nil || p < 0 || p >= len(l.tags) || strconv.Itoa(p) != digits {
		return 0, false
	}
	return p, true
}

// Notifications go to one channel, in both layouts: channels are not
// keys, and PUBLISH reaches every node of a Cluster. A group commit
// publishes once, naming every session it changed (see notify.go).
func (l layout) notifyChannel() string { return l.prefix + "retryd:notify" }

// keySlot is Redis Cluster's hash slot of a key (CRC16/XMODEM of its hash
// tag, or of the whole key without one, modulo 16384), as CLUSTER KEYSLOT
// answers it.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % clusterSlots
}

// checkPartitions validates a number of partitions.
func checkPartitions(n int) error {
	if n < 1 || n > MaxPartitions {
		return fmt.Errorf("redis store: partitions=%d: want 1 to %d", n, MaxPartitions)
	}
	return nil
}
