package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
)

// Group commit. A replica queues each partition's transitions and commits
// them in groups: one read of what the group depends on, the engine's
// transitions in Go, one commit script (commit.go) that writes them all.

// txn is one transaction's view of a session and what it changes.
type txn struct {
	id string
	// keptSession is the session, nil when it does not exist (create it
	// to write one), and its retry index expiries as this replica last
	// wrote them (nil: unknown, write them all); write updates them.
	keptSession
	awaiters map[string]int64
	expired  []string // awaiter entries whose lease ended, deleted on a save
	env      engine.Env
	before   population // the session's population as read
	// needed is when the session as read needed its timer (see need), 0
	// when there was no session; pending is its pending retry's id then.
	// A commit sets the timer only when these say it must (writeTimer).
	needed  float64
	pending string

	save bool // write the session's snapshot
	// gone is the session as it was when it expired in this transaction
	// (sess is then nil, unless a later transition of the group created
	// the session anew): its keys are deleted, its events still logged.
	gone      *engine.Session
	write     bool // write anything at all
	events    []*retrydv1.Event
	forgotten []*engine.Retry
	// wake is the session's timer as a timer's handler sets it, when set
	// (nil then removes it); otherwise a commit sets it by writeTimer's
	// rule. legacy are timer members of older schemas to remove.
	wake    *float64
	wakeSet bool
	legacy  []string
	// fleets are the fleet states of the group (see fleet.go), shared by
	// every transition of the group; those changed are saved with it.
	fleets *fleetView
}

func (t *txn) changed(evs ...*retrydv1.Event) {
	t.save, t.write = true, true
	t.events = append(t.events, evs...)
}

// Env implements store.Txn.
func (t *txn) Env() engine.Env { return t.env }

// Session implements store.Txn.
func (t *txn) Session() *engine.Session { return t.sess }

// Create implements store.Txn.
func (t *txn) Create() *engine.Session {
	t.sess = engine.NewSession(t.id, t.env.Now)
	return t.sess
}

// Record implements store.Txn: the session is written with the group,
// and a new pending retry sets its timer (writeTimer).
func (t *txn) Record(evs ...*retrydv1.Event) { t.changed(evs...) }

// Forget implements store.Txn.
func (t *txn) Forget(rs []*engine.Retry) { t.forgotten = append(t.forgotten, rs...) }

// setWake sets the session's timer to at (nil: none), as the handler of
// a timer that fell due does.
func (t *txn) setWake(at *float64) {
	t.wake, t.wakeSet, t.write = at, true, true
}

// score is a time's score in the timer set.
func score(at time.Time) *float64 {
	v := float64(at.UnixMilli())
	return &v
}

// queue is one partition's transitions waiting for a group commit;
// leading is set while one caller commits a group (see update).
type queue struct {
	mu      sync.Mutex
	reqs    []*request
	leading bool
	// perEntry is the recent average number of events per stream entry
	// of the partition's commits (see trim); only the leader uses it.
	perEntry float64
}

// request is one call's transition, waiting for a group commit.
type request struct {
	id    string
	fleet string // the fleet state the transition decides with, if any
	fn    func(*txn) error
	done  chan error    // the outcome
	lead  chan struct{} // this caller now commits the next group
	// bound is when the call fails UNAVAILABLE unless it is answered by
	// then: the store URL's unavailable_after from when it queued.
	bound time.Time
}

// update runs fn on the session in an optimistic transaction and returns
// once it is committed; fn's own errors are returned as they are, and
// nothing of fn is written then.
//
// Every commit checks its partition's sequence counter, so a replica
// commits a partition's transitions in groups, one group at a time: the
// callers queue, one of them (the leader) takes up to maxGroup of them,
// runs them in one read and one commit script (again on fresh state whenever another
// replica won the race, at most maxAttempts times), hands every caller its
// outcome and passes the lead on. Partitions commit independently. The
// commit runs under its own timeout, not the caller's context: a caller
// that left must not strand the queue.
//
// A call ends within the store URL's bound (unavailable_after) from when
// it queued, whatever it queued behind: still queued then, it leaves the
// queue and fails UNAVAILABLE; in a group whose commit is in flight, it
// fails UNAVAILABLE too, while the commit goes on (see send). The leader
// commits in a goroutine of its own, so that its caller, too, is answered
// at its bound.
//
// One group of a partition is in flight at a time, holding every caller
// queued meanwhile (up to maxGroup), so over a slow path a replica commits
// a group per round trip, or per round trip and a half where the host's
// TCP paces a request of tens of kilobytes (BBR: see
// BenchmarkRequestOverPath). Several groups in flight at once would each
// need a connection of their own (go-redis sends one command at a time on
// a connection), each group's commit would check the counters that the
// one before it leaves, and one that reached Redis first would have to be
// decided again; over a 200 ms path with 128 agents such a design
// answered a quarter as many decisions as this one, measured back to
// back, its extra connections starting cold (a dial, then a small
// window). A
// partitioned layout has a group in flight per partition instead, whose
// commits do not depend on each other. What keeps a slow path at a group
// per round trip is that a commit is not cut at its callers' bound: a
// commit cut mid-read closes its connection, and the next group, on a
// cold one, missed its bound too, and so on, down to a few decisions a
// second at 200 ms.
func (s *Store) update(ctx context.Context, id string, fn func(*txn) error) error {
	return s.updateWithFleet(ctx, id, "", fn)
}

// updateWithFleet is update for a transition that also decides with the
// fleet state under fleetKey (when not empty): it is read and saved in the
// same transaction.
func (s *Store) updateWithFleet(ctx context.Context, id, fleetKey string, fn func(*txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := s.keys.partition(id)
	q := s.queues[p]
	bound := s.target.own.unavailableAfter
	req := &request{id: id, fleet: fleetKey, fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1),
		bound: time.Now().Add(bound)}
	q.mu.Lock()
	q.reqs = append(q.reqs, req)
	if !q.leading {
		q.leading = true
		req.lead <- struct{}{}
	}
	q.mu.Unlock()
	expired := time.NewTimer(bound)
	defer expired.Stop()
	for {
		select {
		case err := <-req.done:
			return err
		case <-req.lead:
			go s.lead(p)
		case <-expired.C:
			if q.withdraw(req) {
				return fmt.Errorf("redis store: queued behind a commit: no commit within %s=%v: %w",
					unavailableAfterParam, bound, store.ErrUnavailable)
			}
			// In a group in flight: its commit goes on, and may still be
			// recorded (see send).
			return fmt.Errorf("redis store: committing: no answer within %s=%v: %w",
				unavailableAfterParam, bound, store.ErrUnavailable)
		}
	}
}

// withdraw takes r out of the queue unless a group took it already, and
// reports whether it did; the lead, when r held it, passes on.
func (q *queue) withdraw(r *request) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.reqs, r)
	if i < 0 {
		return false
	}
	q.reqs = slices.Delete(q.reqs, i, i+1)
	select {
	case <-r.lead:
		if len(q.reqs) > 0 {
			q.reqs[0].lead <- struct{}{}
		} else {
			q.leading = false
		}
	default:
	}
	return true
}

// lead commits the group at the head of partition p's queue (the leader's
// own request is its first, unless it left the queue at its bound before
// this goroutine ran) and passes the lead to the next caller. A queue that
// every caller left meanwhile has no group to commit.
func (s *Store) lead(p int) {
	q := s.queues[p]
	q.mu.Lock()
	n := min(len(q.reqs), maxGroup)
	group := slices.Clone(q.reqs[:n])
	q.reqs = slices.Delete(q.reqs, 0, n)
	q.mu.Unlock()

	if len(group) > 0 {
		errs := s.commitGroup(p, group)
		for i, r := range group {
			r.done <- errs[i]
		}
	}

	q.mu.Lock()
	if len(q.reqs) > 0 {
		q.reqs[0].lead <- struct{}{}
	} else {
		q.leading = false
	}
	q.mu.Unlock()
}

// commitGroup runs a group of partition p's transitions in one optimistic
// commit (apply, commit.go), again on fresh state while another replica
// changed what it read, and returns each one's outcome. Its callers may
// have been answered already (see updateWithFleet): the outcome then only
// tells this replica what Redis holds.
//
// Nothing of the group is sent after its earliest caller's bound, when
// that caller is answered UNAVAILABLE: a call answered while its commit
// was still unsent must not be recorded later, when a Redis that was away
// comes back. The commit's context is cancelled at that bound, which ends
// whatever has not reached the wire yet (a wait for a pooled connection,
// a dial, a new connection's handshake, a retry of go-redis, a read of
// the next attempt), while a request already written keeps reading its
// answer: go-redis sets a read's deadline from the context's deadline
// (commitTimeout) when the read starts, and does not watch its Done.
func (s *Store) commitGroup(p int, group []*request) []error {
	wire, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	first := group[0].bound
	for _, r := range group[1:] {
		if r.bound.Before(first) {
			first = r.bound
		}
	}
	ctx, stopSending := context.WithCancel(wire)
	defer stopSending()
	unsent := time.AfterFunc(time.Until(first), stopSending)
	defer unsent.Stop()
	errs := make([]error, len(group))
	for attempt := range maxAttempts {
		err := s.apply(ctx, p, group, errs)
		switch {
		case err == nil:
			return errs
		case !errors.Is(err, errConflict):
			switch {
			case errors.Is(err, store.ErrUnavailable):
			case ctx.Err() != nil && wire.Err() == nil:
				err = fmt.Errorf("redis store: committing: given up at the bound of the group's first call (%s=%v): %v: %w",
					unavailableAfterParam, s.target.own.unavailableAfter, err, store.ErrUnavailable)
			default:
				err = s.unavailableWithin(wire, "committing", err)
			}
			for i := range errs {
				errs[i] = err
			}
			return errs
		}
		time.Sleep(time.Duration(mrand.Int64N(int64(attempt+1) * int64(200*time.Microsecond))))
	}
	for i := range errs {
		errs[i] = fmt.Errorf("redis store: %d transactions lost to concurrent writers: %w", maxAttempts, store.ErrUnavailable)
	}
	return errs
}

// errPathDead is a commit given up because Redis, probed on the side
// while the commit's answer was late, did not answer the probe in time.
var errPathDead = errors.New("redis store: the commit's answer is late and Redis does not answer a PING")

// send runs a commit's script and returns its answer (as commit.run).
//
// The commit's wire deadline is not its callers' bound. A commit whose
// answer is later than unavailable_after keeps waiting for it on its
// connection as long as Redis, probed on the side with a PING each
// unavailable_after, answers; it is given up at the first probe that gets
// no answer within twice that bound (errPathDead): a PING that finds no
// idle connection dials one, three round trips with HELLO, which on a
// slow path and a loaded machine may take most of one bound, and a probe
// that fails on a path that answers gives up a commit whose connection
// still carries it, so the next group goes out on a new, cold one. It is
// given up at the latest at ctx's deadline
// (commitTimeout, or go-redis' read timeout, 5 s unless the URL sets
// read_timeout). A slow path thus keeps the connection, which a cut
// would close (go-redis closes a connection on a deadline mid-read): the
// commit's answer arrives, the replica knows what Redis holds, and the
// partition's next group goes out on a warm connection in one round trip.
// A dead path (a blackhole) gives the commit up within three bounds: the
// partition is not stalled behind a request that TCP retransmits with a
// growing backoff, and after the heal the next group goes out at once on
// a connection that answers.
//
// A commit given up may still run in Redis (its request may be on its
// way): what the replica knew of the checked keys is forgotten, and the
// next commit, checking them as unknown, learns them (known.go). The
// goroutine waiting for its answer ends at its read's deadline (go-redis
// sets it when the read starts: the read timeout or ctx's deadline).
func (s *Store) send(ctx context.Context, p int, c *commit) ([]any, error) {
	type answer struct {
		current []any
		err     error
	}
	answered := make(chan answer, 1)
	go func() {
		current, err := c.run(ctx, s.rdb)
		answered <- answer{current, err}
	}()
	bound := s.target.own.unavailableAfter
	late := time.NewTimer(bound)
	defer late.Stop()
	// The probes outlive ctx's cancellation at the callers' bound, as the
	// commit's read does; they end with send.
	pctx, stopProbes := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProbes()
	probed := make(chan error, 1)
	for {
		select {
		case a := <-answered:
			return a.current, a.err
		case <-late.C:
			go func() {
				bctx, cancel := context.WithTimeout(pctx, 2*bound)
				defer cancel()
				probed <- s.probe(bctx, p)
			}()
		case err := <-probed:
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errPathDead, err)
			}
			late.Reset(bound)
		}
	}
}

// probe PINGs the Redis that holds partition p's keys (with a Cluster
// URL, the master of its slot).
func (s *Store) probe(ctx context.Context, p int) error {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, s.keys.countersKey(p))
		if err != nil {
			return err
		}
		return node.Ping(ctx).Err()
	}
	return s.rdb.Ping(ctx).Err()
}

// loaded is one session as a transaction reads it.
type loaded struct {
	// sess is nil when the session does not exist or is damaged; indexed
	// are its retry index expiries as this replica last wrote them, nil
	// for a session decoded from its snapshot.
	keptSession
	// awaiters counts the live awaiter entries per retry; expired names the
	// entries whose lease ended (see awaiters.go).
	awaiters map[string]int64
	expired  []string
	// damaged is why a session's data could not be read.
	damaged error
}

// load reads sessions with their awaiter counts (GetChains, AwaitRetry:
// a commit decides on what the replica knows instead, see recall). A
// session whose data is damaged is nil, with its error in damaged.
func (s *Store) load(ctx context.Context, ids []string) ([]loaded, error) {
	gets := make([]*redis.StringCmd, len(ids))
	aws := make([]*redis.MapStringStringCmd, len(ids))
	bctx, cancel := s.bounded(ctx)
	defer cancel()
	_, err := s.rdb.Pipelined(bctx, func(pl redis.Pipeliner) error {
		for i, id := range ids {
			gets[i] = pl.Get(bctx, s.keys.sessionKey(id))
			aws[i] = pl.HGetAll(bctx, s.keys.awaitersKey(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, s.unavailableWithin(ctx, "reading sessions", err)
	}
	// Leases are wall-clock times of the replicas, not the decision clock.
	now := time.Now().UnixMilli()
	out := make([]loaded, len(ids))
	for i, id := range ids {
		b, err := gets[i].Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, s.unavailableWithin(ctx, "reading session", err)
		}
		out[i] = decodeSession(id, b, aws[i].Val(), now)
	}
	return out, nil
}

// recall makes the group's sessions of what this replica knows of them
// (known.go) — the session its last commit wrote a snapshot from when it
// still knows that one (knownValue.sess), else the known snapshot
// decoded — and adds the checks that what it knows still holds — of
// their keys and of the partition's counters — to c.
func (s *Store) recall(c *commit, p int, ids []string) (out []loaded, ctr counters) {
	raw := s.known.get(s.keys.countersKey(p)).raw
	c.checkValue(s.keys.countersKey(p), raw)
	now := time.Now().UnixMilli()
	out = make([]loaded, len(ids))
	for i, id := range ids {
		v := s.known.take(s.keys.sessionKey(id))
		fields := s.known.get(s.keys.awaitersKey(id)).fields
		c.checkLarge(s.keys.sessionKey(id), v.raw, v.revision)
		c.checkAwaiters(s.keys.awaitersKey(id), fields)
		if v.sess != nil && !s.decodeAlways {
			out[i] = reuseSession(v.keptSession, fields, now)
		} else {
			out[i] = decodeSession(id, []byte(v.raw), fields, now)
		}
	}
	return out, parseCounters(raw)
}

// loadOne reads one session (nil when it does not exist).
func (s *Store) loadOne(ctx context.Context, id string) (*engine.Session, error) {
	out, err := s.load(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	return out[0].sess, out[0].damaged
}

// apply runs a group's transitions on freshly read sessions and, if any
// changed something, writes them all in one commit script, provided
// nothing it read changed meanwhile (errConflict otherwise). errs receives
// each transition's own refusal; an error returned fails the whole group.
func (s *Store) apply(ctx context.Context, p int, group []*request, errs []error) error {
	var ids []string
	index := map[string]int{}
	for _, r := range group {
		if _, ok := index[r.id]; !ok {
			index[r.id] = len(ids)
			ids = append(ids, r.id)
		}
	}
	var fleetKeys []string
	for _, r := range group {
		if r.fleet != "" && !slices.Contains(fleetKeys, r.fleet) {
			fleetKeys = append(fleetKeys, r.fleet)
		}
	}
	if s.contended(p) {
		rctx, cancel := s.bounded(ctx)
		err := s.refresh(rctx, p, ids, fleetKeys)
		cancel()
		if err != nil {
			return err
		}
	}
	c := newCommit()
	sessions, ctr := s.recall(c, p, ids)
	last := ctr.seq
	fleets := s.newFleetView(c, p)
	env := s.env()
	txns := make([]*txn, len(ids))
	for i, id := range ids {
		l := sessions[i]
		txns[i] = &txn{id: id, keptSession: l.keptSession, awaiters: l.awaiters, expired: l.expired, env: s.sessionEnv(env, p, id),
			before: populationOf(l.sess), fleets: fleets}
		if l.sess != nil {
			txns[i].needed, txns[i].pending = s.need(l.sess, l.awaiters), pendingID(l.sess)
		}
	}
	for i, r := range group {
		// Damaged data refuses the calls that touch it, and only them.
		if errs[i] = sessions[index[r.id]].damaged; errs[i] == nil {
			errs[i] = r.fn(txns[index[r.id]])
		}
	}
	base := s.sequenceBase(last)
	seq := base
	write := false
	for _, t := range txns {
		write = write || t.write
		for _, ev := range t.events {
			seq++
			ev.Sequence = seq
		}
	}
	if seq == base {
		seq = last // no events: the counter stays
	}
	// Even a group that writes nothing runs the script, with its checks
	// alone: its answers (a repeated report's, a refusal) were decided on
	// what this replica knew, which the checks confirm.
	if write {
		if err := s.writeAll(ctx, c, p, txns, fleets, ctr, seq); err != nil {
			return err
		}
	}
	for i, t := range txns {
		// A transition that changed nothing (a repeated report, a refusal,
		// a timer set again) leaves the session as its known snapshot has
		// it, as the memory store keeps it: it stays the key's session.
		if !t.save && t.gone == nil && t.sess != nil && t.sess == sessions[i].sess {
			c.keep(s.keys.sessionKey(t.id), t.keptSession)
		}
	}
	switch current, err := s.send(ctx, p, c); {
	case err == nil:
		for _, t := range txns {
			if t.sess != nil {
				t.sess.Commit()
			}
		}
		c.remember(s.known)
		return nil
	case errors.Is(err, errConflict):
		s.known.learn(c.list, current)
		s.conflicted(p)
		return err
	default:
		// Whether the script ran is unknown: so are the keys' values.
		s.known.forget(c.checkedKeys())
		return unavailable("writing sessions", err)
	}
}

// writeAll adds a group's writes to its commit: the sessions' (see
// write), the fleet states and the partition's counters, which were ctr
// and now hold seq as the last sequence.
func (s *Store) writeAll(ctx context.Context, c *commit, p int, txns []*txn, fleets *fleetView, ctr counters, seq uint64) error {
	var pop population
	var changed []string
	for _, t := range txns {
		var snap []byte
		var spans []retrySpan
		if t.save && t.sess != nil {
			var err error
			if snap, spans, err = encodeSession(t.sess, t.keptSession); err != nil {
				return fmt.Errorf("redis store: encoding session %q: %w", t.id, err)
			}
		}
		if err := s.write(ctx, c, p, t, snap, spans); err != nil {
			return err
		}
		if snap != nil {
			t.snap = unsafe.String(unsafe.SliceData(snap), len(snap)) // see commit.Set
			c.keep(s.keys.sessionKey(t.id), t.keptSession)
		}
		pop = pop.add(t.delta())
		if t.save || t.gone != nil {
			changed = append(changed, t.id)
		}
	}
	if err := s.appendEvents(ctx, c, p, txns); err != nil {
		return err
	}
	if len(changed) > 0 {
		c.Publish(ctx, s.keys.notifyChannel(), notice(changed))
	}
	if next := (counters{seq, ctr.pop.add(pop)}); next != ctr {
		c.Set(ctx, s.keys.countersKey(p), next.String(), 0)
	}
	return fleets.write(ctx)
}

// keyTTL is how long Redis keeps a session's keys after a write. Expiry
// itself is a timer (see expiry.go); the key TTL is only the backstop that
// bounds Redis' memory when no replica runs to handle that timer, so it
// lasts ttlMargin longer.
func (s *Store) keyTTL(sess *engine.Session, now time.Time) time.Duration {
	return max(s.expiresAt(sess).Sub(now), 0) + ttlMargin
}

// indexRetries adds to a commit the writes that keep each retained
// retry's index key (retry id → session id, for AwaitRetry and
// CancelRetries by id) alive at least as long as the session key, which
// the commit sets to live ttl from now.
//
// Each index key written lives one chain TTL longer than that, and a key
// is written again only once less than half a chain TTL of that lead is
// left (or when this replica does not know it: a session decoded from its
// snapshot has no expiries, so every key is written). Refreshing every
// key on every write cost a SET per retained retry, up to
// engine.MaxRetainedRetries of them per decision on a long session, for
// keys that were nowhere near expiring. The half-TTL margin also absorbs
// a step back of this replica's clock between two commits. An index key
// outliving its session is harmless: lookups read the session, and
// forgetting a session deletes its retries' keys (forget); the TTL only
// bounds Redis' memory when no replica runs.
//
// spans are where each retry's encoding is in the snapshot written, which
// the new expiries keep with them (see encodeSession).
func (s *Store) indexRetries(ctx context.Context, pl *commit, p int, t *txn, ttl time.Duration, spans []retrySpan) {
	now := t.env.Now.UnixMilli()
	need := now + ms(ttl)      // the session key's expiry
	lead := ms(s.cfg.ChainTTL) // how much longer an index key lives
	retries := t.sess.Retries()
	indexed := make([]indexedRetry, len(retries))
	for i, r := range retries {
		until := int64(0)
		for _, x := range t.indexed {
			if x.id == r.ID {
				until = x.until
				break
			}
		}
		if _, named := retrySession(r.ID); named {
			until = math.MaxInt64 // no index key: the id names the session
		}
		if until < need+lead/2 {
			until = need + lead
			pl.Set(ctx, s.keys.retryKey(p, r.ID), t.id, time.Duration(until-now)*time.Millisecond)
		}
		indexed[i] = indexedRetry{r.ID, until, spans[i]}
	}
	t.indexed = indexed
}

// unindex deletes a retry's index key, if it has one.
func (s *Store) unindex(ctx context.Context, pl *commit, p int, retryID string) {
	if _, named := retrySession(retryID); !named {
		pl.Del(ctx, s.keys.retryKey(p, retryID))
	}
}

// write adds one session's changes to a commit; spans are where snap
// holds each retained retry (see encodeSession).
func (s *Store) write(ctx context.Context, pl *commit, p int, t *txn, snap []byte, spans []retrySpan) error {
	id := t.id
	if t.gone != nil {
		s.forget(ctx, pl, p, t)
	}
	if snap != nil {
		ttl := s.keyTTL(t.sess, t.env.Now)
		pl.setSnapshot(ctx, s.keys.sessionKey(id), snap, ttl)
		s.indexRetries(ctx, pl, p, t, ttl, spans)
		// The awaiter hash exists only while a stream attached (attach
		// gives it a TTL of its own); an absent one, which the commit
		// checks, needs none.
		if len(t.expired) > 0 {
			pl.HDel(ctx, s.keys.awaitersKey(id), t.expired...)
		}
		if len(t.awaiters) > 0 {
			pl.PExpire(ctx, s.keys.awaitersKey(id), ttl)
		}
	}
	for _, r := range t.forgotten {
		s.unindex(ctx, pl, p, r.ID)
	}
	s.writeTimer(ctx, pl, p, t)
	return nil
}
