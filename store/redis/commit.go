package redis

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"google.golang.org/protobuf/encoding/protowire"
)

// Commits. A group's transitions are decided in Go on what this replica
// knows of the keys they depend on (known.go), then written by one
// server-side script, commitScript, which first checks that those keys
// still hold what the decision assumed — the partition's sequence counter,
// each session's snapshot (by its revision or SHA-1, see checkLarge), each
// session's awaiter entries and each fleet state — and only then runs the
// writes, or none of them.
// Redis runs a script atomically, so a decision is one atomic server-side
// script over its partition's slot (with the single layout, over several
// slots of one Redis). A script that finds a difference writes nothing and
// answers the current values: the group is decided again on them, as after
// a failed WATCH (commitGroup). One round trip per group commit when the
// replica knew right, two when it did not.

// errConflict is a commit whose reads changed before its script ran.
var errConflict = errors.New("redis store: the state changed since it was read")

// commitScript checks, then writes. KEYS are every key the commit checks
// or writes; ARGV holds the number of checks, each check (kind, key index,
// expected), then each write (argument count, command, key index or
// channel, arguments). Kinds: v, the key's string value ("" when absent);
// s, the SHA-1 of it; r, the value's last bytes, as many as expected has
// (a session snapshot's revision, see checkLarge); h, a hash's fields and
// values, sorted, NUL-separated; w, nothing at all: a session's awaiter
// hash, which every writer of it changes the session's revision with
// (awaiters.go), so the session's own check covers it, and which is read
// only when the commit fails. It answers 1 once written, or {0, current}:
// current holds every checked key's value (nil when absent, a hash as its
// HGETALL), for the replica to decide again on (known.go).
//
// Most of Redis' time in a commit is this script's own interpretation,
// not the commands it calls, so the loops are written for Lua 5.1's
// interpreter: ARGV is indexed directly (no closure call per argument),
// and a write's arguments go to redis.call straight from ARGV by
// unpack's range, without a table built for each write.
var commitScript = redis.NewScript(`
local argv, keys, call = ARGV, KEYS, redis.call
local ok, current, later = true, {}, {}
local a = 2
for i = 1, tonumber(argv[1]) do
  local kind, key, want = argv[a], keys[tonumber(argv[a + 1])], argv[a + 2]
  a = a + 3
  local value, got
  if kind == 'r' then
    got = call('GETRANGE', key, -#want, -1)
    value = false -- read whole only if the commit fails, below
    later[i] = 'GET'
  elseif kind == 'w' then
    got, value = want, false
    later[i] = 'HGETALL'
  elseif kind == 'h' then
    value = call('HGETALL', key)
    local fields = {}
    for j = 1, #value, 2 do
      fields[#fields + 1] = value[j] .. '\0' .. value[j + 1]
    end
    table.sort(fields)
    got = table.concat(fields, '\0')
  else
    value = call('GET', key)
    if kind == 's' then
      got = value and redis.sha1hex(value) or ''
    else
      got = value or ''
    end
  end
  current[i] = value
  if got ~= want then
    ok = false
  end
end
if not ok then
  for i, cmd in pairs(later) do
    current[i] = call(cmd, keys[tonumber(argv[3 * i])])
  end
  return {0, current}
end
local n = #argv
while a <= n do
  local count, name, key = tonumber(argv[a]), argv[a + 1], argv[a + 2]
  if name ~= 'PUBLISH' then
    key = keys[tonumber(key)]
  end
  call(name, key, unpack(argv, a + 3, a + 1 + count))
  a = a + 2 + count
end
return 1
`)

// commit collects a group commit's checks and writes. Its write methods
// mirror the Redis commands of the same names.
type commit struct {
	keys   []string
	index  map[string]int
	checks []any
	list   []check // the checks, in order
	writes []any
	// after is each checked key's value once the writes ran: what the
	// replica knows of it after a successful commit.
	after map[string]*knownValue
	// sessions are the sessions the checked session keys hold once the
	// commit succeeded, with their retry index expiries, by key (see keep).
	sessions map[string]keptSession
}

// keptSession is a session a replica keeps with what it knows of its key
// (see keep and knownValue).
//
// snap is the snapshot this replica wrote from sess (the key's raw value),
// which indexed's spans point into; "" when sess was decoded.
type keptSession struct {
	sess    *engine.Session
	indexed []indexedRetry
	snap    string
}

// check is one of a commit's checks: its kind and key.
type check struct{ kind, key string }

func newCommit() *commit {
	return &commit{index: map[string]int{}, after: map[string]*knownValue{}}
}

// key returns a key's index in KEYS (1-based, as Lua counts).
func (c *commit) key(k string) string {
	i, ok := c.index[k]
	if !ok {
		c.keys = append(c.keys, k)
		i = len(c.keys)
		c.index[k] = i
	}
	return strconv.Itoa(i)
}

// checkValue: the key still holds value ("" for absent).
func (c *commit) checkValue(k, value string) {
	c.checks = append(c.checks, "v", c.key(k), value)
	c.list = append(c.list, check{"v", k})
	c.after[k] = &knownValue{raw: value}
}

// checkLarge: the session key k still holds value ("" for absent),
// compared so that the value itself does not travel. revision is value's
// revision suffix (see revisionSuffix) when this replica wrote value
// itself, else "", and then it is taken from value: every snapshot ends
// with a random token chosen for it alone, so the script compares the
// stored value's last bytes with it, whoever wrote it. Only a value
// without one (absent, or a snapshot that does not end with a revision)
// is compared by the SHA-1 of the whole value, which Redis computes in
// Lua: for a snapshot of a few kilobytes, a tenth of Redis' instructions
// per decision.
func (c *commit) checkLarge(k, value, revision string) {
	if revision == "" && value != "" {
		revision = revisionSuffix(unsafe.Slice(unsafe.StringData(value), len(value)))
	}
	if revision != "" {
		c.checks = append(c.checks, "r", c.key(k), revision)
		c.list = append(c.list, check{"r", k})
	} else {
		// The value is hashed in place: a snapshot is kilobytes, and
		// sha1.Sum neither keeps nor changes what it reads.
		c.checks = append(c.checks, "s", c.key(k), sum(unsafe.Slice(unsafe.StringData(value), len(value)), value != ""))
		c.list = append(c.list, check{"s", k})
	}
	c.after[k] = &knownValue{raw: value, revision: revision}
}

// checkHash: the hash still holds exactly these fields and values.
func (c *commit) checkHash(k string, fields map[string]string) {
	c.checks = append(c.checks, "h", c.key(k), canonicalHash(fields))
	c.list = append(c.list, check{"h", k})
	c.after[k] = &knownValue{fields: maps.Clone(fields)}
}

// checkAwaiters: a session's awaiter hash, known to hold these fields,
// is covered by the session's own check (kind w: nothing is compared; a
// failed commit sends the hash back).
func (c *commit) checkAwaiters(k string, fields map[string]string) {
	c.checks = append(c.checks, "w", c.key(k), "")
	c.list = append(c.list, check{"w", k})
	c.after[k] = &knownValue{fields: maps.Clone(fields)}
}

// sum is what a check of kind s expects of a value read; absent is "".
func sum(value []byte, present bool) string {
	if !present {
		return ""
	}
	h := sha1.Sum(value)
	return hex.EncodeToString(h[:])
}

// canonicalHash is what commitScript makes of a hash for a check of kind h.
func canonicalHash(fields map[string]string) string {
	pairs := make([]string, 0, len(fields))
	for f, v := range fields {
		pairs = append(pairs, f+"\x00"+v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "\x00")
}

func (c *commit) write(name, key string, args ...any) {
	c.writes = append(c.writes, len(args)+1, name, c.key(key))
	c.writes = append(c.writes, args...)
}

func ms(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// Set is SET key value [PX ttl]. A []byte value is the commit's from then
// on: the caller must not change it, as what the replica knows of a
// checked key shares its bytes (a snapshot is kilobytes, copied for
// nothing on every decision before).
func (c *commit) Set(_ context.Context, key string, value any, ttl time.Duration) {
	if v := c.after[key]; v != nil {
		v.revision = "" // the value's, if any: see setSnapshot
		switch x := value.(type) {
		case []byte:
			v.raw = unsafe.String(unsafe.SliceData(x), len(x))
		case string:
			v.raw = x
		default:
			v.raw = fmt.Sprint(x)
		}
	}
	if ttl > 0 {
		c.write("SET", key, value, "PX", ms(ttl))
		return
	}
	c.write("SET", key, value)
}

// setSnapshot is Set of a session key to a snapshot that ends with its
// revision (see revisionSuffix), which the replica then knows with it.
func (c *commit) setSnapshot(ctx context.Context, key string, snap []byte, ttl time.Duration) {
	c.Set(ctx, key, snap, ttl)
	if v := c.after[key]; v != nil {
		v.revision = revisionSuffix(snap)
	}
}

// revisionSuffix returns the encoded revision field that ends snap, or ""
// when snap does not end with one of revisionLen token bytes (then
// checkLarge compares by SHA-1). The field has the highest number of
// statev1.Session, so protobuf's field order writes it last, after every
// field but unknown ones, which a snapshot made by engine.Session.Snapshot
// has none of.
func revisionSuffix(snap []byte) string {
	n := len(revisionHead) + revisionLen
	if len(snap) < n || string(snap[len(snap)-n:len(snap)-revisionLen]) != revisionHead {
		return ""
	}
	return string(snap[len(snap)-n:])
}

// revisionLen is the length of a snapshot's revision token.
const revisionLen = 16

// revisionHead is what precedes a revision token in a snapshot: the
// field's tag and the token's length.
var revisionHead = string(protowire.AppendVarint(protowire.AppendTag(nil, revisionField, protowire.BytesType), revisionLen))

// newRevision returns a fresh revision token. Tokens only need to differ
// from every other snapshot's of the same key, not to be unpredictable:
// 128 bits of the runtime's generator make a repeat out of reach.
func newRevision() []byte {
	b := make([]byte, revisionLen)
	binary.LittleEndian.PutUint64(b, rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return b
}

// Del is DEL of each key.
func (c *commit) Del(_ context.Context, keys ...string) {
	for _, k := range keys {
		c.write("DEL", k)
		if v := c.after[k]; v != nil {
			*v = knownValue{}
		}
	}
}

// HDel is HDEL key fields….
func (c *commit) HDel(_ context.Context, key string, fields ...string) {
	args := make([]any, len(fields))
	for i, f := range fields {
		args[i] = f
		if v := c.after[key]; v != nil {
			delete(v.fields, f)
		}
	}
	c.write("HDEL", key, args...)
}

// PExpire is PEXPIRE key ttl.
func (c *commit) PExpire(_ context.Context, key string, ttl time.Duration) {
	c.write("PEXPIRE", key, ms(ttl))
}

// XAdd appends one entry, id with one field, to a stream, trimmed as
// trim says: XADD stream TRIM… id field payload (see events.go).
func (c *commit) XAdd(_ context.Context, stream string, trim []any, id, field string, payload []byte) {
	args := append(append([]any{}, trim...), id, field, payload)
	c.write("XADD", stream, args...)
}

// ZAdd is ZADD key score member.
func (c *commit) ZAdd(_ context.Context, key string, score float64, member string) {
	c.write("ZADD", key, strconv.FormatFloat(score, 'f', -1, 64), member)
}

// ZRem is ZREM key member.
func (c *commit) ZRem(_ context.Context, key, member string) { c.write("ZREM", key, member) }

// Publish is PUBLISH channel message (a channel is not a key).
func (c *commit) Publish(_ context.Context, channel, message string) {
	c.writes = append(c.writes, 2, "PUBLISH", channel, message)
}

// run runs the commit's script: nil once written; errConflict when a
// check failed (nothing was written), with the checked keys' current
// values, one per check; else the error.
func (c *commit) run(ctx context.Context, rdb redis.Scripter) ([]any, error) {
	args := make([]any, 0, 1+len(c.checks)+len(c.writes))
	args = append(args, len(c.list))
	args = append(args, c.checks...)
	args = append(args, c.writes...)
	res, err := commitScript.Run(ctx, rdb, c.keys, args...).Result()
	if err != nil {
		return nil, err
	}
	switch v := res.(type) {
	case int64:
		if v == 1 {
			return nil, nil
		}
	case []any:
		if len(v) == 2 {
			current, _ := v[1].([]any)
			return current, errConflict
		}
	}
	return nil, fmt.Errorf("redis store: the commit script answered %v", res)
}

// keep notes that the checked key k holds kept.sess's snapshot once the
// commit ran — the snapshot the commit writes (with Set, already added),
// or the known one, which a transition that changed nothing decided on:
// once the commit succeeded, the replica knows kept as the key's session
// and its retry index expiries (see knownValue).
func (c *commit) keep(k string, kept keptSession) {
	if c.sessions == nil {
		c.sessions = map[string]keptSession{}
	}
	c.sessions[k] = kept
}

// remember records in k what the checked keys hold after a successful
// commit, with the sessions the commit wrote (keep).
func (c *commit) remember(k *known) {
	for key, v := range c.after {
		if kept := c.sessions[key]; kept.sess != nil && v.raw != "" {
			v.keptSession = kept
		}
		k.set(key, *v)
	}
}

// checkedKeys returns the keys the commit checked.
func (c *commit) checkedKeys() []string {
	keys := make([]string, len(c.list))
	for i, chk := range c.list {
		keys[i] = chk.key
	}
	return keys
}
