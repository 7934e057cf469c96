package redis

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// What a replica knows. A commit does not read before it decides: it
// decides on what this replica last knew of every key its script checks —
// the value it last wrote there, or the current value a failed check sent
// back — and a key it knows nothing of counts as absent (a new session,
// no awaiters, a fresh fleet state). The script's checks make that safe:
// when anything differs, the script writes nothing and answers the current
// values of every key it checked, which replace what the replica knew, and
// the group is decided again (commitGroup). So a commit costs one round
// trip when this replica wrote the keys last — a session's next step on
// the replica that decided its last one, or a new session — and two when
// another replica (or an awaiter, or an expiry) changed one since, as many
// as a read before every commit would cost.
//
// Contention. Where other replicas commit to the same partition, what a
// replica knows of the partition's counter is usually out of date, and a
// commit on it would mostly run its script twice, which costs Redis more
// than a read. So after a conflict a replica reads a partition's keys
// first (one pipelined read, then the script) for contendedFor; a replica
// alone on its partitions stays at one round trip.
//
// known is bounded, and forgets the keys it learned longest ago: a
// session a replica wrote is the one whose next transaction is likely
// soon (its retry's start or abandonment, its next step), and forgetting
// it costs that transaction a conflict (the script runs twice, and the
// partition reads first for contendedFor). It keeps two generations: keys
// go into young, and when young holds maxKnown/2 keys it becomes old and
// the old generation is dropped; a key is found in either, and so stays
// known for at least maxKnown/2 later keys. (Forgetting at random, as a
// map's order would, drops a key written a moment ago as readily as one
// from long ago: in a failure storm, where every session's next
// transaction is its abandonment a grace later, that made each decision
// from the second round on cost a third more; docs/benchmarks.md.)
type known struct {
	mu         sync.Mutex
	young, old map[string]knownValue
}

// maxKnown bounds how many keys a replica remembers.
const maxKnown = 1 << 15

// knownValue is a key's value as last seen: raw for a string ("" when
// absent), fields for a hash.
//
// keptSession is, for a session key, the session whose snapshot raw is:
// sess is the engine.Session this replica's last commit of the key wrote
// raw from, so that the next group on the session decides on it instead
// of unmarshalling and restoring raw again (recall). It is set only by a
// successful commit that wrote the snapshot from it, or that decided on
// it and did not mark it changed (commit.keep; a transition that changed
// it unmarked would not be written at all), never for a value learned or
// read (a failed check's answer, refresh), and it travels with raw: a
// value replaced for any reason (a conflict, an unknown outcome, forget,
// eviction, an absent key) drops it. It belongs to one group at a time:
// recall takes it out (take), and only that group's successful commit
// puts a session back, so one that a failed or conflicted attempt mutated
// is never used again.
//
// Its indexed travels with sess: until when the retry index key of each
// of sess's retained retries lives, as this replica last wrote it (see
// indexRetries).
//
// revision is raw's revision suffix once a commit checked or wrote raw
// (see checkLarge), else "" (checkLarge then takes it from raw): it
// travels with raw like keptSession, but stays when a group takes the
// session, as raw does.
type knownValue struct {
	raw      string
	fields   map[string]string
	revision string
	keptSession
}

func newKnown() *known { return &known{young: map[string]knownValue{}} }

// lookup returns what is known of key and whether anything is; k.mu is
// held.
func (k *known) lookup(key string) (knownValue, bool) {
	if v, ok := k.young[key]; ok {
		return v, true
	}
	v, ok := k.old[key]
	return v, ok
}

// get returns what is known of key (the zero value: absent).
func (k *known) get(key string) knownValue {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, _ := k.lookup(key)
	return v
}

// take returns what is known of key, like get, and removes its session
// from what is known (see knownValue.sess): the caller now owns it.
func (k *known) take(key string) knownValue {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, _ := k.lookup(key)
	if v.sess != nil {
		k.put(key, knownValue{raw: v.raw, fields: v.fields, revision: v.revision})
	}
	return v
}

// read records a key's value as read from Redis (refresh): like set, but a
// session known for the same raw value stays known, since it is still the
// session raw holds.
func (k *known) read(key string, v knownValue) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if old, _ := k.lookup(key); old.sess != nil && old.raw == v.raw && v.fields == nil {
		return
	}
	k.put(key, v)
}

// set records key's value; an absent key (raw "" and no fields) is
// forgotten, which is the same.
func (k *known) set(key string, v knownValue) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.put(key, v)
}

// put is set with k.mu held: the key moves to the young generation, which
// becomes the old one once it holds maxKnown/2 keys.
func (k *known) put(key string, v knownValue) {
	delete(k.old, key)
	if v.raw == "" && len(v.fields) == 0 {
		delete(k.young, key)
		return
	}
	k.young[key] = v
	if len(k.young) >= maxKnown/2 {
		k.old, k.young = k.young, make(map[string]knownValue, maxKnown/2)
	}
}

// len reports how many keys are known.
func (k *known) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.young) + len(k.old)
}

// forget drops what is known of keys (after an error that leaves their
// values unknown).
func (k *known) forget(keys []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range keys {
		delete(k.young, key)
		delete(k.old, key)
	}
}

// learn records the current values a failed commit script sent back, one
// per check, in the order of the checks.
func (k *known) learn(checks []check, current []any) {
	for i, c := range checks {
		if i >= len(current) {
			return
		}
		switch c.kind {
		case "h", "w":
			flat, _ := current[i].([]any)
			fields := make(map[string]string, len(flat)/2)
			for j := 0; j+1 < len(flat); j += 2 {
				f, _ := flat[j].(string)
				v, _ := flat[j+1].(string)
				fields[f] = v
			}
			k.set(c.key, knownValue{fields: fields})
		default:
			raw, _ := current[i].(string)
			k.set(c.key, knownValue{raw: raw})
		}
	}
}

// contendedFor is how long a partition's commits read first after a
// conflict.
const contendedFor = time.Second

// conflicted notes a conflict of a commit to partition p.
func (s *Store) conflicted(p int) {
	s.contention[p].Store(time.Now().Add(contendedFor).UnixNano())
}

// contended reports whether commits to partition p read first.
func (s *Store) contended(p int) bool {
	return time.Now().UnixNano() < s.contention[p].Load()
}

// refresh reads the keys a group's commit will check — the partition's
// counters, the sessions' snapshots and awaiter entries, the fleet states —
// into what the replica knows.
func (s *Store) refresh(ctx context.Context, p int, ids, fleetKeys []string) error {
	keys := []string{s.keys.countersKey(p)}
	for _, k := range fleetKeys {
		keys = append(keys, s.keys.fleetKey(p, k))
	}
	for _, id := range ids {
		keys = append(keys, s.keys.sessionKey(id))
	}
	gets := make([]*redis.StringCmd, len(keys))
	aws := make([]*redis.MapStringStringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, k := range keys {
			gets[i] = pl.Get(ctx, k)
		}
		for i, id := range ids {
			aws[i] = pl.HGetAll(ctx, s.keys.awaitersKey(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return unavailable("reading", err)
	}
	for i, k := range keys {
		v, err := gets[i].Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return unavailable("reading", err)
		}
		s.known.read(k, knownValue{raw: v})
	}
	for i, id := range ids {
		s.known.set(s.keys.awaitersKey(id), knownValue{fields: aws[i].Val()})
	}
	return nil
}
