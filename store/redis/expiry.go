package redis

import (
	"context"
	"time"

	"github.com/retryd/retryd/engine"
)

// Expiry. A session idle for the chain TTL is forgotten, and its open
// chains are logged as closed (reason expired) first, exactly as the memory
// and file stores do, so that the log shows why its numbering restarts. A
// Redis key TTL alone would drop the session silently; so every write of a
// session also sets its expiry timer in retryd:timers, next to the retries'
// timers, and the replica whose transaction wins handles it: it logs the
// closes and deletes the session's keys, and every other replica's
// transaction finds the session gone and does nothing. The keys' own TTL
// lasts ttlMargin longer: a backstop that bounds Redis' memory when no
// replica runs, and the only case in which a session goes without its
// expired events.

// A session's expiry timer is at or before its expiry, never after: a
// commit that writes a session whose expiry is no earlier than that of the
// session it replaces leaves the timer where it is (a ZADD in a sorted
// set of every session's timers was a tenth of Redis' time per decision),
// and when it falls due early, expiry sets it again to the session's
// expiry then. Each write that could move the expiry earlier (a pending
// retry's end can: its abandon time no longer holds the session) sets the
// timer. So a session that changes often has its timer moved about once
// per chain TTL instead of on every change.

// expiryTimer is the retry id part of a session's expiry timer member: no
// retry id is empty, so " SESSION" never names a retry.
const expiryTimer = ""

// expiresAt is when a session expires if nothing happens to it: the chain
// TTL after its last change. A session with a pending retry is kept at
// least until the retry was abandoned (then it changes, and its TTL starts
// again), as the memory store keeps it.
func (s *Store) expiresAt(sess *engine.Session) time.Time {
	at := sess.Updated().Add(s.cfg.ChainTTL)
	if r := sess.Pending(); r != nil {
		if abandon := r.Due().Add(s.cfg.AbandonGrace).Add(s.cfg.ChainTTL); abandon.After(at) {
			at = abandon
		}
	}
	return at
}

// expireSession handles a session's expiry timer: it forgets the session
// when it is due, and otherwise sets the timer again.
func (s *Store) expireSession(ctx context.Context, sessionID string) error {
	return s.update(ctx, sessionID, s.expiry)
}

// expiry is expireSession's transition.
func (s *Store) expiry(t *txn) error {
	switch {
	case t.sess == nil:
		t.clearTimer(expiryTimer)
	case t.sess.Pending() != nil || t.env.Now.Before(s.expiresAt(t.sess)):
		t.timer(expiryTimer, score(s.expiresAt(t.sess)))
	default:
		t.events = append(t.events, t.sess.Expire(t.env)...)
		// Transitions after this one in the group see no session.
		t.gone, t.sess, t.write = t.sess, nil, true
		t.clearTimer(expiryTimer)
	}
	return nil
}

// forget queues the deletion of an expired session's keys, before the
// writes of a session created anew in the same transaction; its stream
// keeps its TTL, so that WatchEvents of the session still shows why it
// ended.
func (s *Store) forget(ctx context.Context, pl *commit, p int, t *txn) {
	pl.Del(ctx, s.keys.sessionKey(t.id), s.keys.awaitersKey(t.id))
	for _, r := range t.gone.Retries() {
		s.unindex(ctx, pl, p, r.ID)
	}
}
