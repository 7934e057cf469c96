package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/store"
)

var _ store.Backend = (*Store)(nil)

// Population gauges. Counting sessions, open chains and pending retries by
// scanning Redis would cost a SCAN of every key per metrics scrape; instead
// the commits that change sessions keep them in the partition's counters
// key, beside its last event sequence (see counters). A commit knows each
// session as it read it (and checks it is unchanged) and as it writes it,
// and it checks the counters key too, so it writes the exact new values in
// the same SET that moves the sequence on: the counters change atomically
// with the sessions, on whichever replica, at no command of their own. A
// scrape reads them with one GET per partition.
//
// The counters are of the whole Redis (every replica reports the same
// values: aggregate them with max, not sum); awaiters are the connected
// AwaitRetry streams of this replica (sum them). They drift only when a
// session's keys disappear without a transaction: when Redis drops them at
// their backstop TTL because no replica ran for ttlMargin past their
// expiry, or when someone deletes keys by hand. A scrape never reports a
// negative count.

// statsTimeout bounds the HMGET of a scrape; past it the last values read
// are reported again.
const statsTimeout = time.Second

// population is what one session adds to the counters.
type population struct {
	sessions, chains, pending int64
}

func populationOf(sess *engine.Session) population {
	if sess == nil {
		return population{}
	}
	p := population{sessions: 1, chains: int64(sess.OpenChains())}
	if sess.Pending() != nil {
		p.pending = 1
	}
	return p
}

func (p population) add(q population) population {
	return population{p.sessions + q.sessions, p.chains + q.chains, p.pending + q.pending}
}

// delta is what the transaction changes in the counters.
func (t *txn) delta() population {
	after := populationOf(t.sess) // nil once expired
	return population{after.sessions - t.before.sessions, after.chains - t.before.chains,
		after.pending - t.before.pending}
}

// counters is the value of a partition's counters key: the sequence of
// its last event and its population, as "SEQ SESSIONS CHAINS PENDING"
// (absent: all 0).
type counters struct {
	seq uint64
	pop population
}

// parseCounters reads a counters key's value; a field that does not parse
// counts as 0.
func parseCounters(raw string) counters {
	var c counters
	f := strings.Fields(raw)
	get := func(i int) int64 {
		if i >= len(f) {
			return 0
		}
		n, _ := strconv.ParseInt(f[i], 10, 64)
		return n
	}
	if len(f) > 0 {
		c.seq, _ = strconv.ParseUint(f[0], 10, 64)
	}
	c.pop = population{get(1), get(2), get(3)}
	return c
}

// String is the counters key's value.
func (c counters) String() string {
	return strconv.FormatUint(c.seq, 10) + " " + strconv.FormatInt(c.pop.sessions, 10) + " " +
		strconv.FormatInt(c.pop.chains, 10) + " " + strconv.FormatInt(c.pop.pending, 10)
}

// Stats implements store.Backend with one HMGET of the counters.
func (s *Store) Stats() store.Stats {
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	cmds := make([]*redis.StringCmd, s.keys.partitions())
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for p := range cmds {
			cmds[p] = pl.Get(ctx, s.keys.countersKey(p))
		}
		return nil
	})
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if err == nil || errors.Is(err, redis.Nil) {
		var st store.Stats
		for _, c := range cmds {
			pop := parseCounters(c.Val()).pop
			st.Sessions += max(pop.sessions, 0)
			st.OpenChains += max(pop.chains, 0)
			st.PendingRetries += max(pop.pending, 0)
		}
		s.stats = st
	}
	st := s.stats
	st.Awaiters = s.awaiting.Load()
	return st
}
