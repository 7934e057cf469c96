package memory

import (
	"context"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/await"
)

// The backend's primitives (store.Backend): a transaction is a session's
// shard lock held from the read of the session to the commit of what the
// rule recorded.

// txn is one session's transaction (store.Txn); its shard lock is held.
type txn struct {
	s       *Store
	id      string
	env     engine.Env
	sess    *engine.Session
	created bool
	cp      *engine.Checkpoint // nil without Persist
	// pending is the session's pending retry when the transaction began:
	// a different one after the commit is new (index it, set its timer).
	pending   *engine.Retry
	changed   bool
	events    []*retrydv1.Event
	forgotten []*engine.Retry
	fleets    fleetLocks // see fleet.go
}

// begin starts a transaction of session id (nil when there is none) in
// shard sh, whose lock is held: the shard's one transaction, reused, since
// the lock allows no other.
func (s *Store) begin(sh *shard, id string, sess *engine.Session) *txn {
	t := &sh.txn
	*t = txn{s: s, id: id, env: s.env(), sess: sess}
	if sess != nil {
		t.cp, t.pending = s.checkpoint(sess), sess.Pending()
	}
	return t
}

// Env implements store.Txn.
func (t *txn) Env() engine.Env { return t.env }

// Session implements store.Txn.
func (t *txn) Session() *engine.Session { return t.sess }

// Create implements store.Txn.
func (t *txn) Create() *engine.Session {
	t.sess, t.created = engine.NewSession(t.id, t.env.Now), true
	t.cp = t.s.checkpoint(t.sess)
	return t.sess
}

// Record implements store.Txn. The events of a transaction that records
// once are the rule's own slice (capped, so a later Record copies it).
func (t *txn) Record(evs ...*retrydv1.Event) {
	t.changed = true
	if t.events == nil {
		t.events = evs[:len(evs):len(evs)]
		return
	}
	t.events = append(t.events, evs...)
}

// Forget implements store.Txn.
func (t *txn) Forget(rs []*engine.Retry) { t.forgotten = append(t.forgotten, rs...) }

// Update implements store.Backend.
func (s *Store) Update(_ context.Context, id, _ string, tr store.Transition) error {
	sh, h := s.shardOf(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := s.begin(sh, id, sh.sessions.get(h, id))
	err := tr.Apply(t)
	t.fleets.unlock()
	if err != nil {
		return err
	}
	return s.end(sh, h, t)
}

// end commits a transaction (its shard lock held): the change made
// durable and visible, a new session kept, a new pending retry indexed
// with its timer set, forgotten retries dropped from the index. A change
// that could not be made durable is undone (see commit), with the queued
// retries it added to fleet states.
func (s *Store) end(sh *shard, h uint64, t *txn) error {
	if t.changed {
		if err := s.commit(change{sess: t.sess, cp: t.cp, events: t.events}); err != nil {
			t.fleets.undoQueued(t.env.Now)
			return err
		}
	}
	if t.sess == nil {
		return nil
	}
	if t.created {
		sh.sessions.put(h, t.sess)
	}
	if r := t.sess.Pending(); r != nil && r != t.pending {
		s.indexRetry(r)
		// A retry this transaction made has no awaiter yet (one attaches
		// under this lock, after the commit), so its one timer is its
		// abandonment. An agent that attaches before it is due adds a
		// timer for the due time (Attach), and one that attaches later
		// starts it at once (awaiter.Start): a retry nobody awaits, every
		// retry of a failure storm, costs one firing, not one at its due
		// time that finds no agent and another at the end of the grace.
		s.timers.push(s.abandonAt(r), r)
	}
	s.unindex(t.forgotten)
	return nil
}

// Read implements store.Backend.
func (s *Store) Read(_ context.Context, id string, fn func(*engine.Session) error) error {
	sh, h := s.shardOf(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return fn(sh.sessions.get(h, id))
}

// Locate implements store.Backend.
func (s *Store) Locate(_ context.Context, retryID string) (string, error) {
	ix, h := s.indexOf(retryID)
	ix.mu.Lock()
	r := ix.retries.get(h, retryID)
	ix.mu.Unlock()
	if r == nil {
		return "", &engine.Error{Kind: engine.KindNotFound, Message: "no retry " + retryID}
	}
	return r.SessionID, nil
}

// Now implements store.Backend.
func (s *Store) Now() time.Time { return s.cfg.Now() }

// Closing implements store.Backend.
func (s *Store) Closing() <-chan struct{} { return s.closing }

// tick runs the timer rule (store.Tick) on pending retry r in a
// transaction of its session, and sets r's timer to when the rule next
// needs it. A transition that cannot be made durable is tried again
// after persistRetryDelay.
func (s *Store) tick(r *engine.Retry) error {
	sh, h := s.shardOf(r.SessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := s.begin(sh, r.SessionID, sh.sessions.get(h, r.SessionID))
	if t.sess == nil || t.sess.Pending() != r {
		return nil
	}
	next := store.Tick(t, r, r.Awaiters > 0, s.abandonAt(r))
	t.fleets.unlock()
	if err := s.end(sh, h, t); err != nil {
		s.timers.push(s.cfg.Now().Add(persistRetryDelay), r)
		return err
	}
	if !next.IsZero() {
		s.timers.push(next, r)
	}
	return nil
}

// abandonAt is when pending retry r is cancelled unless an agent awaits
// it: the abandon grace after it fell due, or, for a retry that fell due
// before the store started (restored by the file store), the grace after
// the start, since no agent could await it in between.
func (s *Store) abandonAt(r *engine.Retry) time.Time {
	return maxTime(r.Due(), s.started).Add(s.cfg.AbandonGrace)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Await implements store.Backend: an awaiter is counted in the retry's
// Awaiters and released by its shard's channel for the retry (doneOf,
// release), both under the session's shard lock.
func (s *Store) Await(sessionID, retryID string) await.Store {
	return &awaitStore{s: s, sessionID: sessionID, retryID: retryID}
}

// awaitStore is the store as the await protocol sees it, for one stream:
// r is the retry Look found.
type awaitStore struct {
	s                  *Store
	sessionID, retryID string
	r                  *engine.Retry
}

// view reads r; the shard lock is held.
func view(r *engine.Retry) await.View {
	return await.View{State: r.State(), Terminal: r.Terminal(), Due: r.Due()}
}

// Look implements await.Store.
func (a *awaitStore) Look(context.Context) (await.View, error) {
	sh, h := a.s.shardOf(a.sessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sess := sh.sessions.get(h, a.sessionID); sess != nil {
		a.r = sess.Retry(a.retryID)
	}
	if a.r == nil {
		return await.View{}, &engine.Error{Kind: engine.KindNotFound, Message: "no retry " + a.retryID}
	}
	return view(a.r), nil
}

// Attach implements await.Store. A retry that ended meanwhile counts no
// awaiter: its awaiter only reports the end.
func (a *awaitStore) Attach(context.Context) (await.Awaiter, await.View, error) {
	s, r := a.s, a.r
	sh, _ := s.shardOf(r.SessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if term := r.Terminal(); term != nil {
		return ended{term}, view(r), nil
	}
	r.Awaiters++
	s.awaiters.Add(1)
	if r.Awaiters == 1 && s.cfg.Now().Before(r.Due()) {
		s.timers.push(r.Due(), r) // awaited now: it starts when due (see end)
	}
	// done is made under the lock; received from without it.
	return &awaiter{s: s, sh: sh, r: r, done: sh.doneOf(r)}, view(r), nil
}

// awaiter is one stream counted in its retry's Awaiters.
type awaiter struct {
	s    *Store
	sh   *shard
	r    *engine.Retry
	done <-chan struct{}
}

// Start implements await.Awaiter: the timer rule, now that an agent is
// here.
func (a *awaiter) Start(context.Context) error {
	if a.s.cfg.Now().Before(a.r.Due()) {
		return nil
	}
	// Not recorded: not started; the agent awaits again, the timer still
	// runs.
	return a.s.tick(a.r)
}

// Wait implements await.Awaiter.
func (a *awaiter) Wait(ctx context.Context) (*retrydv1.AwaitRetryResponse, error) {
	select {
	case <-a.done:
		return a.r.Terminal(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-a.s.closing:
		return a.r.ShutdownCancelled(), nil
	}
}

// Detach implements await.Awaiter.
func (a *awaiter) Detach() {
	a.sh.mu.Lock()
	a.r.Awaiters--
	a.sh.mu.Unlock()
	a.s.awaiters.Add(-1)
}

// ended is the awaiter of a retry that ended before it attached.
type ended struct{ term *retrydv1.AwaitRetryResponse }

func (ended) Start(context.Context) error { return nil }

func (e ended) Wait(context.Context) (*retrydv1.AwaitRetryResponse, error) { return e.term, nil }

func (ended) Detach() {}

// readBatch is how many events a reader returns at once.
const readBatch = 512

// Events implements store.Backend.
func (s *Store) Events(sessionID string, after uint64) store.EventReader {
	return &reader{log: s.log, session: sessionID, after: after}
}

// reader reads the ring for one stream.
type reader struct {
	log     *eventLog
	session string
	after   uint64
}

// Next implements store.EventReader.
func (r *reader) Next(context.Context) (store.Batch, error) {
	batch, last, notify := r.log.read(r.after, r.session, readBatch)
	r.after = last
	return store.Batch{Events: batch, More: len(batch) == readBatch, Wake: notify, Release: func() {}}, nil
}

// Held implements store.EventReader: the ring is read in order.
func (*reader) Held() bool { return false }
