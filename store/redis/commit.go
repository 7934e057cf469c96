package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Commits. A group's transitions are decided in Go on what one pipelined
// read returned, then written by one server-side script, commitScript,
// which first checks that nothing it read has changed since — the
// partition's sequence counter, each session's snapshot (by its SHA-1),
// each session's awaiter entries and each fleet state read — and only
// then runs the writes, or none of them. Redis runs a script atomically,
// so a decision is one atomic server-side script over its partition's slot
// (with the single layout, over several slots of one Redis). A script that
// finds a change writes nothing and answers 0: the group is read and
// decided again, as a WATCH that failed would be (commitGroup). Two round
// trips per group commit: the read and the script.

// errConflict is a commit whose reads changed before its script ran.
var errConflict = errors.New("redis store: the state changed since it was read")

// commitScript checks, then writes. KEYS are every key the commit checks
// or writes; ARGV holds the number of checks, each check (kind, key index,
// expected), then each write (argument count, command, key index or
// channel, arguments). Kinds: v, the key's string value ("" when absent);
// s, the SHA-1 of it; h, a hash's fields and values, sorted, NUL-separated.
var commitScript = redis.NewScript(`
local a = 1
local function arg()
  local v = ARGV[a]
  a = a + 1
  return v
end
for _ = 1, tonumber(arg()) do
  local kind, key, want = arg(), KEYS[tonumber(arg())], arg()
  local got
  if kind == 'v' then
    got = redis.call('GET', key) or ''
  elseif kind == 's' then
    local v = redis.call('GET', key)
    got = v and redis.sha1hex(v) or ''
  else
    local kv = redis.call('HGETALL', key)
    local fields = {}
    for i = 1, #kv, 2 do
      fields[#fields + 1] = kv[i] .. '\0' .. kv[i + 1]
    end
    table.sort(fields)
    got = table.concat(fields, '\0')
  end
  if got ~= want then
    return 0
  end
end
while a <= #ARGV do
  local n, name = tonumber(arg()), arg()
  local args = {}
  for i = 1, n do
    args[i] = arg()
  end
  if name ~= 'PUBLISH' then
    args[1] = KEYS[tonumber(args[1])]
  end
  redis.call(name, unpack(args))
end
return 1
`)

// commit collects a group commit's checks and writes. Its write methods
// mirror the Redis commands of the same names.
type commit struct {
	keys   []string
	index  map[string]int
	checks []any
	n      int // checks
	writes []any
}

func newCommit() *commit { return &commit{index: map[string]int{}} }

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
	c.n++
}

// checkSum: the key still holds a value of this SHA-1 (sum of "" for
// absent).
func (c *commit) checkSum(k, sum string) {
	c.checks = append(c.checks, "s", c.key(k), sum)
	c.n++
}

// checkHash: the hash still holds exactly these fields and values.
func (c *commit) checkHash(k string, fields map[string]string) {
	c.checks = append(c.checks, "h", c.key(k), canonicalHash(fields))
	c.n++
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

// Set is SET key value [PX ttl].
func (c *commit) Set(_ context.Context, key string, value any, ttl time.Duration) {
	if ttl > 0 {
		c.write("SET", key, value, "PX", ms(ttl))
		return
	}
	c.write("SET", key, value)
}

// Del is DEL of each key.
func (c *commit) Del(_ context.Context, keys ...string) {
	for _, k := range keys {
		c.write("DEL", k)
	}
}

// HDel is HDEL key fields….
func (c *commit) HDel(_ context.Context, key string, fields ...string) {
	args := make([]any, len(fields))
	for i, f := range fields {
		args[i] = f
	}
	c.write("HDEL", key, args...)
}

// PExpire is PEXPIRE key ttl.
func (c *commit) PExpire(_ context.Context, key string, ttl time.Duration) {
	c.write("PEXPIRE", key, ms(ttl))
}

// XAdd is XADD stream MAXLEN ~ n id e payload.
func (c *commit) XAdd(_ context.Context, stream string, maxLen int, id string, payload []byte) {
	c.write("XADD", stream, "MAXLEN", "~", maxLen, id, "e", payload)
}

// ZAdd is ZADD key score member.
func (c *commit) ZAdd(_ context.Context, key string, score float64, member string) {
	c.write("ZADD", key, strconv.FormatFloat(score, 'f', -1, 64), member)
}

// ZRem is ZREM key member.
func (c *commit) ZRem(_ context.Context, key, member string) { c.write("ZREM", key, member) }

// HIncrBy is HINCRBY key field n.
func (c *commit) HIncrBy(_ context.Context, key, field string, n int64) {
	c.write("HINCRBY", key, field, n)
}

// Publish is PUBLISH channel message (a channel is not a key).
func (c *commit) Publish(_ context.Context, channel, message string) {
	c.writes = append(c.writes, 2, "PUBLISH", channel, message)
}

// run runs the commit's script: nil once written, errConflict when a check
// failed (nothing was written), else the error.
func (c *commit) run(ctx context.Context, rdb redis.Scripter) error {
	args := make([]any, 0, 1+len(c.checks)+len(c.writes))
	args = append(args, c.n)
	args = append(args, c.checks...)
	args = append(args, c.writes...)
	n, err := commitScript.Run(ctx, rdb, c.keys, args...).Int()
	switch {
	case err != nil:
		return err
	case n == 0:
		return errConflict
	}
	return nil
}
