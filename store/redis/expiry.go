package redis

import (
	"context"
	"time"

	"github.com/retryd/retryd/engine"
)

// Expiry. A session idle for the chain TTL is forgotten, and its open
// chains are logged as closed (reason expired) first, exactly as the memory
// and file stores do, so that the log shows why its numbering restarts. A
// Redis key TTL alone would drop the session silently; so a session
// without a pending retry has its timer (timers.go) at or before its
// expiry, and the replica whose transaction wins handles it: it logs the
// closes and deletes the session's keys, and every other replica's
// transaction finds the session gone and does nothing. The keys' own TTL
// lasts ttlMargin longer: a backstop that bounds Redis' memory when no
// replica runs, and the only case in which a session goes without its
// expired events.

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
