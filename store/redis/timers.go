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
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
)

// Timers. Pending retries' due and abandon times, and sessions' expiries,
// are members of the partitions' timer sets, polled by every replica.

// timerMember names a pending retry in the timer set: retry ids never hold
// a space, session ids come after it.
func timerMember(sessionID, retryID string) string { return retryID + " " + sessionID }

// fire moves a due retry on: Start when an agent awaits it, Cancel
// (abandoned) when its grace passed with none, otherwise it sets the
// retry's next timer. A terminal or forgotten retry leaves the timer set.
func (s *Store) fire(ctx context.Context, sessionID, retryID string) error {
	return s.update(ctx, sessionID, func(t *txn) error {
		var r *engine.Retry
		if t.sess != nil {
			r = t.sess.Retry(retryID)
		}
		now := t.env.Now
		switch {
		case r == nil || r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING:
			t.clearTimer(retryID)
		case now.Before(r.Due()):
			t.setTimer(r, r.Due())
		case t.awaiters[retryID] > 0:
			if out := t.start(r); out.Event != nil {
				t.changed(out.Event)
				t.clearTimer(retryID)
			} else {
				t.setTimer(r, out.HeldUntil) // held by fleet protection
			}
		case now.Before(s.abandonAt(r)):
			t.setTimer(r, s.abandonAt(r))
		default:
			t.changed(t.sess.Cancel(t.env, r, retrydv1.CancelReason_CANCEL_REASON_ABANDONED)...)
			t.clearTimer(retryID)
		}
		return nil
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
			case retryID == expiryTimer:
				wg.Go(func() { s.postpone(ctx, p, m, sessionID, s.expireSession(ctx, sessionID)) })
			default:
				wg.Go(func() { s.postpone(ctx, p, m, sessionID, s.fire(ctx, sessionID, retryID)) })
			}
		}
	}
	wg.Wait()
}

// damagedRetry is how long a timer of a session whose data cannot be read
// waits before it is tried again.
const damagedRetry = time.Minute

var _ service.DamagedTimerSource = (*Store)(nil)

// TimersPostponed implements service.DamagedTimerSource.
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
