package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/store"
)

// Timers. Every session has one member in its partition's timer set,
// " SESSION" (timerMember), polled by every replica. Its score is at or
// before the earliest time the session may need a replica: its pending
// retry's due time while an agent awaits it, the retry's abandon time
// while none does, and without a pending retry the session's expiry
// (need). One member per session, not one per retry beside one for the
// expiry, and an unawaited retry's timer at its abandon time, not at its
// due time and then again at its abandon time, is what keeps timers to
// about one ZADD per retry and one handling of each.
//
// Who sets it:
//   - a commit, when the session's pending retry changed (scheduled,
//     started, cancelled), when the session is new, or when the session
//     now needs its timer earlier than before (writeTimer): a write that
//     changes none of that (a success, a repeated report) leaves it;
//   - an agent that attaches to a retry, with ZADD LT of the retry's due
//     time (awaiters.go), in the script that gives the session a new
//     revision;
//   - the replica whose transaction handles the timer once it fell due
//     (woken), which sets it to exactly when the session next needs it:
//     a later time too, such as a start held by fleet protection.
//
// So the timer may be early, never late: an early one finds nothing to do
// and is set again.

// timerMember names a session in the timer set: session ids come after a
// space. Schemas up to 4 had members "RETRY SESSION" for retries as well,
// which the poller still handles, once, as its session's timer.
func timerMember(sessionID string) string { return " " + sessionID }

// pendingID is a session's pending retry's id, or "".
func pendingID(sess *engine.Session) string {
	if r := sess.Pending(); r != nil {
		return r.ID
	}
	return ""
}

// need is when sess may next need its timer, in Unix milliseconds (see
// above); awaiters are its live awaiter entries per retry. An abandon time
// is the grace after the due time: the grace after Redis came back
// (abandonAt) is later, and a timer early is harmless.
func (s *Store) need(sess *engine.Session, awaiters map[string]int64) float64 {
	at := s.expiresAt(sess)
	if r := sess.Pending(); r != nil {
		due := r.Due()
		if awaiters[r.ID] == 0 {
			due = due.Add(s.cfg.AbandonGrace)
		}
		if due.Before(at) {
			at = due
		}
	}
	return *score(at)
}

// writeTimer adds the session's timer write to a commit, if it needs one:
// for a commit that wrote the session, its need when its pending retry
// changed, when it is new, or when it needs its timer earlier than before;
// what a timer's handler set (the earlier of the two when a later
// transition of the group wrote the session too). Anything else leaves the
// timer where it is, at or before the need. The timer of a session that is
// gone is removed.
func (s *Store) writeTimer(ctx context.Context, pl *commit, p int, t *txn) {
	key, member := s.keys.timersKey(p), timerMember(t.id)
	for _, m := range t.legacy {
		pl.ZRem(ctx, key, m)
	}
	if t.sess == nil {
		if t.gone != nil || t.wakeSet {
			pl.ZRem(ctx, key, member)
		}
		return
	}
	at, set := 0.0, false
	if t.wakeSet && t.wake != nil && t.gone == nil {
		at, set = *t.wake, true
	}
	if t.save {
		need := s.need(t.sess, t.awaiters)
		if t.gone != nil || t.needed == 0 || pendingID(t.sess) != t.pending || need < t.needed {
			if !set || need < at {
				at = need
			}
			set = true
		}
	}
	if set {
		pl.ZAdd(ctx, key, at, member)
	}
}

// wake handles a session's timer that fell due: legacy, when not "", is
// the member of an older schema that fired it, which goes.
func (s *Store) wake(ctx context.Context, sessionID, legacy string) error {
	return s.update(ctx, sessionID, func(t *txn) error {
		if legacy != "" {
			t.legacy, t.write = append(t.legacy, legacy), true
		}
		return s.woken(t)
	})
}

// woken is the transition of a session whose timer fell due: its pending
// retry moves on (store.Tick); without one, the session expires once its TTL
// passed; the timer is set to when the session next needs it, or removed
// with the session.
func (s *Store) woken(t *txn) error {
	if t.sess == nil {
		t.setWake(nil)
		return nil
	}
	var next time.Time
	if r := t.sess.Pending(); r != nil {
		next = store.Tick(t, r, t.awaiters[r.ID] > 0, s.abandonAt(r))
	}
	if t.sess.Pending() == nil {
		next = s.expiresAt(t.sess)
		if !t.env.Now.Before(next) {
			t.events = append(t.events, t.sess.Expire(t.env)...)
			// Transitions after this one in the group see no session.
			t.gone, t.sess, t.write = t.sess, nil, true
			t.setWake(nil)
			return nil
		}
	}
	t.setWake(score(next))
	return nil
}

// fire handles retryID's timer when an agent's stream finds it due (see
// awaiter.Start and Wait): its session's timer's transition, if retryID is
// still the session's pending retry; nothing otherwise.
func (s *Store) fire(ctx context.Context, sessionID, retryID string) error {
	return s.update(ctx, sessionID, func(t *txn) error {
		if t.sess == nil || pendingID(t.sess) != retryID {
			return nil
		}
		return s.woken(t)
	})
}

// runTimers polls the timer set for due retries and moves each on.
func (s *Store) runTimers() {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		cancel()
	}()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	lost := false // the last poll failed: Redis was away
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		due, err := s.dueTimers(ctx)
		if err != nil {
			// Redis is away: nothing can start or be abandoned until it is
			// back. Ask again a little later.
			lost = true
			s.reloadSlots(ctx)
			select {
			case <-s.closing:
				return
			case <-time.After(recheckInterval):
			}
			continue
		}
		if lost {
			lost = false
			s.resumed.Store(s.cfg.Now().UnixNano())
		}
		s.fireAll(ctx, due)
	}
}

// reloadSlots has a Cluster client reread the slot map now, once a command
// failed: a master may have died and its replica taken over, which the
// client learns on its own only from a MOVED reply or its periodic reload.
func (s *Store) reloadSlots(ctx context.Context) {
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		c.ReloadState(ctx)
	}
}

// dueTimers reads up to pollBatch due timers of every partition, in one
// pipeline (on Cluster, one per master).
func (s *Store) dueTimers(ctx context.Context) ([][]string, error) {
	now := strconv.FormatInt(s.cfg.Now().UnixMilli(), 10)
	cmds := make([]*redis.StringSliceCmd, s.keys.partitions())
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for p := range cmds {
			cmds[p] = pl.ZRangeArgs(ctx, redis.ZRangeArgs{
				Key: s.keys.timersKey(p), ByScore: true, Start: "-inf", Stop: now, Count: pollBatch,
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	due := make([][]string, len(cmds))
	for p, c := range cmds {
		due[p] = c.Val()
	}
	return due, nil
}

// abandonAt is when a pending retry nobody awaits is cancelled as
// abandoned: the abandon grace after it fell due, or, when it fell due
// while this replica could not reach Redis, the grace after Redis answered
// again, since no agent could attach in between (as the file store gives
// a whole grace after a restart).
func (s *Store) abandonAt(r *engine.Retry) time.Time {
	from := r.Due()
	if resumed := time.Unix(0, s.resumed.Load()); resumed.After(from) {
		from = resumed
	}
	return from.Add(s.cfg.AbandonGrace)
}

// fireAll handles due timers (due[p] are partition p's), each in a
// goroutine of its own so that they share group commits, and returns once
// all are handled. A failure leaves the timer in the set: the next poll
// tries again, or, when the session's data is damaged, the poll after
// damagedRetry (see postpone).
func (s *Store) fireAll(ctx context.Context, due [][]string) {
	var wg sync.WaitGroup
	for p, members := range due {
		for _, m := range members {
			retryID, sessionID, ok := strings.Cut(m, " ")
			switch {
			case !ok || s.keys.partition(sessionID) != p:
				s.rdb.ZRem(ctx, s.keys.timersKey(p), m)
			case retryID == "":
				wg.Go(func() { s.postpone(ctx, p, m, sessionID, s.wake(ctx, sessionID, "")) })
			default: // a retry's member of an older schema
				wg.Go(func() { s.postpone(ctx, p, m, sessionID, s.wake(ctx, sessionID, m)) })
			}
		}
	}
	wg.Wait()
}

// damagedRetry is how long a timer of a session whose data cannot be read
// waits before it is tried again.
const damagedRetry = time.Minute

var _ store.DamagedTimerSource = (*Store)(nil)

// TimersPostponed implements store.DamagedTimerSource.
func (s *Store) TimersPostponed() int64 { return s.postponed.Load() }

// postpone handles a timer's failure: when the session's data is damaged
// (it does not decode), trying again at the next poll would only fail
// again, every 10 ms; the timer moves damagedRetry on instead, with a
// warning, and the session's other calls keep failing as they do until
// someone repairs or deletes its key. Any other failure (Redis away, a
// timeout, a lost race) leaves the timer where it is: the next poll tries
// again, so a network blip delays a retry by the blip, not by a minute.
func (s *Store) postpone(ctx context.Context, p int, member, sessionID string, err error) {
	var d damaged
	if !errors.As(err, &d) || ctx.Err() != nil {
		return
	}
	at := s.cfg.Now().Add(damagedRetry)
	if zerr := s.rdb.ZAdd(ctx, s.keys.timersKey(p), redis.Z{Score: *score(at), Member: member}).Err(); zerr != nil {
		return
	}
	s.postponed.Add(1)
	s.cfg.Log.Warn("redis store: a timer of a session whose data cannot be read; trying again later",
		"session", sessionID, "err", err, "retry_at", at)
}
