package redis

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/service"
)

var _ service.StatsSource = (*Store)(nil)

// Population gauges. Counting sessions, open chains and pending retries by
// scanning Redis would cost a SCAN of every key per metrics scrape; instead
// the commits that change sessions keep three counters in the hash
// retryd:stats (one per partition). A commit knows each session as it read
// it (and checks it is unchanged) and as it writes it, so it adds the exact
// difference, with HINCRBY inside the same commit script: the counters
// change atomically with the sessions, on whichever replica. A scrape reads
// them with one HMGET per partition.
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

// count adds the counters' changes to a commit.
func (s *Store) count(ctx context.Context, pl *commit, p int, d population) {
	for _, f := range []struct {
		name string
		n    int64
	}{{"sessions", d.sessions}, {"chains", d.chains}, {"pending", d.pending}} {
		if f.n != 0 {
			pl.HIncrBy(ctx, s.keys.statsKey(p), f.name, f.n)
		}
	}
}

// Stats implements service.StatsSource with one HMGET of the counters.
func (s *Store) Stats() service.Stats {
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	cmds := make([]*redis.SliceCmd, s.keys.partitions())
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for p := range cmds {
			cmds[p] = pl.HMGet(ctx, s.keys.statsKey(p), "sessions", "chains", "pending")
		}
		return nil
	})
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if err == nil {
		var st service.Stats
		for _, c := range cmds {
			vals := c.Val()
			st.Sessions += counter(vals[0])
			st.OpenChains += counter(vals[1])
			st.PendingRetries += counter(vals[2])
		}
		s.stats = st
	}
	st := s.stats
	st.Awaiters = s.awaiting.Load()
	return st
}

// counter reads one HMGET value: absent is 0, and so is a negative count
// (see the drift above).
func counter(v any) int64 {
	str, _ := v.(string)
	n, err := strconv.ParseInt(str, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}
