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
// or writes. ARGV[1] is the commit's plan, bytes the script reads with
// string.byte (no Lua string is made of them): the number of checks (two
// bytes), each check (its kind, one byte, and its key's index in KEYS, two
// bytes), then each write (its form, one byte, its key's index, two bytes,
// 0 for none, and for form G the number of its arguments, two bytes). The
// rest of ARGV are the arguments, in the plan's order: a check's expected
// value (none for kind w), a write's values. Check kinds: v, the key's
// string value ("" when absent); s, the SHA-1 of it; r, the value's last
// bytes, as many as expected has (a session snapshot's revision, see
// checkLarge); h, a hash's fields and values, sorted, NUL-separated; w,
// nothing at all: a session's awaiter hash, which every writer of it
// changes the session's revision with (awaiters.go), so the session's own
// check covers it, and which is read only when the commit fails. Write
// forms: P, SET key value PX ms; S, SET key value; Z, ZADD key score
// member; G, any command: its name, then its arguments, after the key when
// it has one (PUBLISH's channel is not a key). It answers 1 once written,
// or {0, current}: current holds every checked key's value (nil when
// absent, a hash as its HGETALL), for the replica to decide again on
// (known.go).
//
// Every argument costs Redis work before the script runs: it is parsed,
// made a Lua string (hashed whole), stored in ARGV and collected again
// (BenchmarkCommitScriptCost). So a decision's usual writes take only
// their values as arguments, the command names and options are the
// script's own constants, and the plan that says which write and which
// key is one argument for the whole commit: 5 arguments per decision
// instead of 15.
var commitScript = redis.NewScript(`
local argv, keys, call, byte, unpack = ARGV, KEYS, redis.call, string.byte, unpack
local plan = argv[1]
local n1, n2 = byte(plan, 1, 2)
local n = n1 * 256 + n2
local ok, current = true, {}
local p, v = 3, 2
for i = 1, n do
  local kind, k1, k2 = byte(plan, p, p + 2)
  local key = keys[k1 * 256 + k2]
  p = p + 3
  local value, got, want = false, '', ''
  if kind ~= 119 then -- w: nothing to compare
    want = argv[v]
    v = v + 1
    if kind == 114 then -- r
      got = call('GETRANGE', key, -#want, -1)
    elseif kind == 104 then -- h
      value = call('HGETALL', key)
      local fields = {}
      for j = 1, #value, 2 do
        fields[#fields + 1] = value[j] .. '\0' .. value[j + 1]
      end
      table.sort(fields)
      got = table.concat(fields, '\0')
    else
      value = call('GET', key)
      if kind == 115 then -- s
        got = value and redis.sha1hex(value) or ''
      else -- v
        got = value or ''
      end
    end
  end
  current[i] = value
  if got ~= want then
    ok = false
  end
end
if not ok then
  -- The values checked by their last bytes or not at all are read whole
  -- only now.
  p = 3
  for i = 1, n do
    local kind, k1, k2 = byte(plan, p, p + 2)
    p = p + 3
    if kind == 114 then
      current[i] = call('GET', keys[k1 * 256 + k2])
    elseif kind == 119 then
      current[i] = call('HGETALL', keys[k1 * 256 + k2])
    end
  end
  return {0, current}
end
local last = #plan
while p <= last do
  local form, k1, k2 = byte(plan, p, p + 2)
  local key = keys[k1 * 256 + k2]
  p = p + 3
  if form == 80 then -- P
    call('SET', key, argv[v], 'PX', argv[v + 1])
    v = v + 2
  elseif form == 90 then -- Z
    call('ZADD', key, argv[v], argv[v + 1])
    v = v + 2
  elseif form == 83 then -- S
    call('SET', key, argv[v])
    v = v + 1
  else -- G
    local c1, c2 = byte(plan, p, p + 1)
    local count = c1 * 256 + c2
    p = p + 2
    if key then
      call(argv[v], key, unpack(argv, v + 1, v + count - 1))
    else
      call(unpack(argv, v, v + count - 1))
    end
    v = v + count
  end
end
return 1
`)

// maxCommitKeys is the most keys one commit can name: the plan gives a
// key's index in two bytes.
const maxCommitKeys = 1<<16 - 1

// commit collects a group commit's checks and writes. Its write methods
// mirror the Redis commands of the same names.
type commit struct {
	keys  []string
	index map[string]int
	// checkPlan and writePlan are the checks' and the writes' parts of the
	// script's plan (see commitScript), checks and writes their arguments.
	checkPlan, writePlan []byte
	checks               []any
	list                 []check // the checks, in order
	writes               []any
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
func (c *commit) key(k string) int {
	i, ok := c.index[k]
	if !ok {
		c.keys = append(c.keys, k)
		i = len(c.keys)
		c.index[k] = i
	}
	return i
}

// check adds a check of kind on key k expecting want (nil: nothing).
func (c *commit) check(kind byte, k string, want any) {
	c.checkPlan = appendIndex(append(c.checkPlan, kind), c.key(k))
	if want != nil {
		c.checks = append(c.checks, want)
	}
	c.list = append(c.list, check{string(kind), k})
}

// appendIndex appends i, a key's index or a count, to a plan in two bytes;
// run refuses a commit whose indexes do not fit.
func appendIndex(plan []byte, i int) []byte { return append(plan, byte(i>>8), byte(i)) }

// checkValue: the key still holds value ("" for absent).
func (c *commit) checkValue(k, value string) {
	c.check('v', k, value)
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
		c.check('r', k, revision)
	} else {
		// The value is hashed in place: a snapshot is kilobytes, and
		// sha1.Sum neither keeps nor changes what it reads.
		c.check('s', k, sum(unsafe.Slice(unsafe.StringData(value), len(value)), value != ""))
	}
	c.after[k] = &knownValue{raw: value, revision: revision}
}

// checkHash: the hash still holds exactly these fields and values.
func (c *commit) checkHash(k string, fields map[string]string) {
	c.check('h', k, canonicalHash(fields))
	c.after[k] = &knownValue{fields: maps.Clone(fields)}
}

// checkAwaiters: a session's awaiter hash, known to hold these fields,
// is covered by the session's own check (kind w: nothing is compared; a
// failed commit sends the hash back).
func (c *commit) checkAwaiters(k string, fields map[string]string) {
	c.check('w', k, nil)
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

// write adds any command on key: form G of the plan.
func (c *commit) write(name, key string, args ...any) {
	c.writePlan = appendIndex(appendIndex(append(c.writePlan, 'G'), c.key(key)), len(args)+1)
	c.writes = append(append(c.writes, name), args...)
}

// writeForm adds a write of one of the script's own forms (P, S, Z) on key.
func (c *commit) writeForm(form byte, key string, args ...any) {
	c.writePlan = appendIndex(append(c.writePlan, form), c.key(key))
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
		c.writeForm('P', key, value, ms(ttl))
		return
	}
	c.writeForm('S', key, value)
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
	c.writeForm('Z', key, strconv.FormatFloat(score, 'f', -1, 64), member)
}

// ZRem is ZREM key member.
func (c *commit) ZRem(_ context.Context, key, member string) { c.write("ZREM", key, member) }

// Publish is PUBLISH channel message (a channel is not a key).
func (c *commit) Publish(_ context.Context, channel, message string) {
	c.writePlan = appendIndex(appendIndex(append(c.writePlan, 'G'), 0), 3)
	c.writes = append(c.writes, "PUBLISH", channel, message)
}

// run runs the commit's script: nil once written; errConflict when a
// check failed (nothing was written), with the checked keys' current
// values, one per check; else the error.
func (c *commit) run(ctx context.Context, rdb redis.Scripter) ([]any, error) {
	if len(c.keys) > maxCommitKeys || len(c.list) > maxCommitKeys {
		return nil, fmt.Errorf("redis store: a commit of %d keys and %d checks, more than its plan can name (%d)", len(c.keys), len(c.list), maxCommitKeys)
	}
	plan := make([]byte, 0, 2+len(c.checkPlan)+len(c.writePlan))
	plan = append(appendIndex(plan, len(c.list)), c.checkPlan...)
	plan = append(plan, c.writePlan...)
	args := make([]any, 0, 1+len(c.checks)+len(c.writes))
	args = append(args, plan)
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
