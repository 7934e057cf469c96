package redis

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Migration. Two older versions of each layout are converted.
//
// Schemas 3 (single) and 4 (partitioned) are the layouts of schemas 5 and
// 6 with two differences, neither in the data: an awaiter entry's write
// did not change its session's revision (commits compared the awaiter
// hash instead), and each event was a stream entry of its own (field e),
// which the readers of schemas 5 and 6 still read (events.go). So the
// conversion is the schema key alone. Replicas of schemas 3 and 4 must
// not run meanwhile or afterwards: their awaiters would change a session
// unseen by the newer replicas' commits.
//
// Schemas 1 (single) and 2 (partitioned) are schemas 3 and 4 with two
// differences more: every event was also appended to a stream of its
// session's own (retryd:{SESSION}:events, or retryd:{TAG}:e:SESSION), and
// each partition kept its last sequence in the key seq and its population
// in the hash stats, where the later schemas keep both in the one string
// counters (stats.go). So their conversion is, per partition, one script
// that writes counters from seq and stats and deletes those two; then the
// steps of schemas 3 and 4. The sessions' own streams are left to their
// TTL (the chain TTL plus a minute at most): nothing reads them any more,
// and every event in them is in its partition's stream as well.
//
// Replicas of an older layout must not run meanwhile or afterwards: so
// Open converts only when the store URL asks for it with migrate=SCHEMA,
// SCHEMA being the version found, and otherwise refuses with a
// SchemaError saying so.
const (
	countersSchemaVersion            = 3
	countersPartitionedSchemaVersion = 4
)

// migrateScript converts one partition: KEYS are seq, stats and counters.
// A partition whose seq and stats are both absent (new, or converted
// already by a conversion that stopped halfway) is left alone. It answers
// the counters written, or false.
var migrateScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 then
  return false
end
local seq = redis.call('GET', KEYS[1]) or '0'
local st = redis.call('HMGET', KEYS[2], 'sessions', 'chains', 'pending')
local value = seq .. ' ' .. (st[1] or '0') .. ' ' .. (st[2] or '0') .. ' ' .. (st[3] or '0')
redis.call('SET', KEYS[3], value)
redis.call('DEL', KEYS[1], KEYS[2])
return value
`)

// migrate converts the data of the older version from of this layout,
// whose value the schema key, key, holds, to this one: each step, then the
// schema key, if it still holds what the step found. Every step can run
// again: a conversion that stopped halfway is finished by the next one.
func (s *Store) migrate(ctx context.Context, key string, from int) error {
	want := s.keys.schema()
	if from < countersSchemaVersion {
		for p := range s.keys.partitions() {
			base := s.keys.base(p)
			keys := []string{base + "seq", base + "stats", s.keys.countersKey(p)}
			if err := migrateScript.Run(ctx, s.rdb, keys).Err(); err != nil && err != redis.Nil {
				return fmt.Errorf("redis store: converting partition %d of schema %q at %s: %w", p, s.keys.schemaOf(from), s.target, err)
			}
		}
	}
	found := s.keys.schemaOf(from)
	swapped, err := swapScript.Run(ctx, s.rdb, []string{key}, found, want).Int()
	if err != nil {
		return fmt.Errorf("redis store: writing %s at %s: %w", key, s.target, err)
	}
	if swapped == 0 {
		now, err := s.rdb.Get(ctx, key).Result()
		if err != nil || now != want {
			return fmt.Errorf("redis store: %s changed while converting schema %q to %q at %s: %q (%v)", key, found, want, s.target, now, err)
		}
	}
	s.cfg.Log.Info("redis store: converted the data to the current key layout", "key", key, "from", found, "to", want)
	return nil
}

// swapScript sets KEYS[1] to ARGV[2] if it holds ARGV[1]: 1 if it did.
var swapScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
`)
