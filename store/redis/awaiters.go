package redis

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Awaiters. A retry starts when it is due and an agent awaits it on any
// replica, and is abandoned when nobody awaited it within the grace; so
// every replica must know how many AwaitRetry streams wait for a retry,
// including those held by other replicas, and a replica that dies (kill -9,
// a lost node) must stop counting at once.
//
// Each stream therefore owns one field of retryd:{SESSION}:aw, named
// "RETRYID TOKEN" (TOKEN is random per stream), whose value is the unix
// millisecond at which its lease ends. The stream's own goroutine writes it
// when it attaches, renews it every awaiterRenew while it waits, and
// deletes it when it leaves; a field counts only while its lease runs. A
// dead replica's fields stop counting within awaiterLease and are deleted
// by the next transaction that writes the session. Only the owner ever
// writes a field, so a renewal can never bring back a field its stream
// already deleted; a transaction may delete an expired field of a stream
// that is merely late, and that stream's next renewal writes it again.
//
// A commit does not compare the awaiter hash (that was an HGETALL per
// decision): every write of it changes the session snapshot's revision
// as well, in one script (awaiterScript), so the session's revision check
// fails whenever the awaiters changed since the replica knew them, and
// the failed commit sends the hash back (commit.go, kind w). A session
// key that does not exist gets no new entry: the stream then finds no
// retry and ends NOT_FOUND.
//
// Leases compare wall clocks of different replicas (and Redis holds none of
// them): replicas' clocks must agree to well within awaiterLease, as they
// must for due times anyway.
const (
	// awaiterLease is how long an awaiter entry counts without a renewal.
	awaiterLease = 6 * time.Second
	// awaiterRenew is how often a waiting stream renews its entry; a
	// stream wakes at least every recheckInterval, so an entry is renewed
	// at least twice before its lease ends.
	awaiterRenew = 2 * time.Second
)

// awaiter is one AwaitRetry stream's entry in its session's awaiter hash,
// and its hold on the retry (see awaitStore).
type awaiter struct {
	s          *Store
	sessionKey string
	key        string
	field      string
	renewed    time.Time
	// timers and member are the session's timer; due, until the first
	// write, is the retry's due time (Unix milliseconds) to move it to.
	timers, member, due string

	sessionID, retryID string
}

// awaiterField names one stream's entry: retry ids never hold a space.
func awaiterField(retryID, token string) string { return retryID + " " + token }

// countAwaiters returns the live awaiter entries per retry of one awaiter
// hash, and the fields whose lease ended (to be deleted). now is in unix
// milliseconds.
func countAwaiters(fields map[string]string, now int64) (live map[string]int64, expired []string) {
	live = map[string]int64{}
	for f, v := range fields {
		retryID, _, _ := strings.Cut(f, " ")
		until, err := strconv.ParseInt(v, 10, 64)
		if err != nil || until <= now {
			expired = append(expired, f)
			continue
		}
		live[retryID]++
	}
	return live, expired
}

// attach registers a stream as an awaiter of a retry of a session that
// falls due at due: the session's timer moves there if it was later (an
// unawaited retry's timer waits for its abandon time, see timers.go).
func (s *Store) attach(ctx context.Context, sessionID, retryID string, due time.Time) (*awaiter, error) {
	a := &awaiter{s: s, sessionKey: s.keys.sessionKey(sessionID), key: s.keys.awaitersKey(sessionID),
		field: awaiterField(retryID, rand.Text())}
	p := s.keys.partition(sessionID)
	a.timers, a.member, a.due = s.keys.timersKey(p), timerMember(sessionID), strconv.FormatInt(due.UnixMilli(), 10)
	if err := a.renew(ctx); err != nil {
		return nil, err
	}
	a.due = "" // set once: a renewal leaves the timer alone
	s.awaiting.Add(1)
	return a, nil
}

// renew writes the entry with a fresh lease (again, if a transaction
// deleted it while this stream was late). It runs under the store URL's
// unavailable_after like a call's round trips: a stream whose replica
// cannot reach Redis ends UNAVAILABLE within the bound, so its agent
// re-attaches elsewhere, instead of waiting out the Redis client's own
// read timeouts and retries (the stream's context has no deadline).
func (a *awaiter) renew(ctx context.Context) error {
	now := time.Now()
	bctx, cancel := a.s.bounded(ctx)
	defer cancel()
	ttl := a.s.cfg.ChainTTL + a.s.cfg.AbandonGrace + ttlMargin
	err := a.s.writeAwaiter(bctx, a, strconv.FormatInt(now.Add(awaiterLease).UnixMilli(), 10), ms(ttl))
	if err != nil {
		return a.s.unavailableWithin(ctx, "registering an awaiter", err)
	}
	a.renewed = now
	return nil
}

// renewIfDue renews the entry once awaiterRenew passed since the last time.
func (a *awaiter) renewIfDue(ctx context.Context) error {
	if time.Since(a.renewed) < awaiterRenew {
		return nil
	}
	return a.renew(ctx)
}

// Detach implements await.Awaiter: it deletes the entry. It runs when the
// stream ends, also when the caller left, so it has a context of its own,
// bounded by unavailable_after since the stream's end waits for it; if
// Redis cannot be reached the entry stops counting when its lease ends.
func (a *awaiter) Detach() {
	a.s.awaiting.Add(-1)
	dctx, cancel := a.s.bounded(context.Background())
	defer cancel()
	_ = a.s.writeAwaiter(dctx, a, "", 0)
}

// awaiterScript writes one awaiter entry and gives the session snapshot a
// new revision. KEYS: the session, its awaiter hash, its partition's
// timer set. ARGV: the revision field's head (revisionHead), a new token,
// the entry's field, its lease ("" deletes it), the hash's TTL in
// milliseconds, the session's timer member and the score to move it to if
// it is later ("": leave it). A snapshot that
// ends with a revision gets the new token in its place; one without (only
// a snapshot written by hand) gets a revision field appended, which
// protobuf reads as the field's value. A new entry is written only while
// the session exists; a deletion that deletes nothing changes nothing.
var awaiterScript = redis.NewScript(`
local key, aw = KEYS[1], KEYS[2]
local head, tok, field, lease = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = redis.call('STRLEN', key)
if lease == '' then
  if redis.call('HDEL', aw, field) == 0 or n == 0 then
    return 0
  end
elseif n == 0 then
  return 0
else
  redis.call('HSET', aw, field, lease)
  redis.call('PEXPIRE', aw, ARGV[5])
  if ARGV[7] ~= '' then
    redis.call('ZADD', KEYS[3], 'LT', ARGV[7], ARGV[6])
  end
end
local m = #head + #tok
if n >= m and redis.call('GETRANGE', key, n - m, n - #tok - 1) == head then
  redis.call('SETRANGE', key, n - #tok, tok)
else
  redis.call('APPEND', key, head .. tok)
end
return 1
`)

// writeAwaiter runs awaiterScript for a's entry: lease "" deletes it.
func (s *Store) writeAwaiter(ctx context.Context, a *awaiter, lease string, ttl int64) error {
	return awaiterScript.Run(ctx, s.rdb, []string{a.sessionKey, a.key, a.timers},
		revisionHead, newRevision(), a.field, lease, ttl, a.member, a.due).Err()
}
