// Package memory is retryd's default store: every session lives in this
// process, sharded by session id so unrelated sessions never contend on one
// lock. Pending retries wait in one timer heap (not a goroutine each), idle
// sessions expire after a TTL, and the event log is a bounded ring.
//
// On its own nothing survives a restart: a restarted server starts every
// chain again at retry 1. A durable store (store/file) keeps this store's
// sessions, timers and log and adds two hooks: Config.Persist makes every
// change durable before it becomes visible, and Config.Restore starts the
// store from what was recovered.
package memory

import (
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryd/retryd/engine"
	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
)

var (
	_ store.Backend   = (*Store)(nil)
	_ store.DueSource = (*Store)(nil)
)

const shardCount = 64

// DefaultEventLogSize is how many events the log retains by default.
const DefaultEventLogSize = store.DefaultEventLogSize

// Config tunes a Store. Zero fields take the defaults.
type Config struct {
	// Options are the settings every store takes; the event log retains
	// exactly EventLogSize events. The store logs nothing.
	store.Options

	// Persist, when set, is called after every change of session state and
	// before anyone can observe it: before the call that made the change
	// returns, before an awaiter hears of a start or cancellation, before
	// the change's events are readable. It is called with the changed
	// sessions' shard lock held, from many goroutines at once (one per
	// shard at most), and must return only once the changes are durable.
	// If it fails, the change is undone, its events are dropped (their
	// sequence numbers are never used), and the call that made it fails
	// with store.ErrUnavailable.
	Persist func(changes []Change) error
	// Restore, when set, is the state New starts from: the sessions, the
	// retained events and the last sequence number handed out.
	Restore *State
}

// Change is one session's durable change, handed to Config.Persist.
type Change struct {
	// SessionID names the session.
	SessionID string
	// Session is the session's whole state after the change, or nil when
	// the store forgot the session (it expired). It shares the session's
	// records: marshal it before Persist returns.
	Session *statev1.Session
	// Events are the events the change recorded, in order, numbered with
	// their final sequences.
	Events []*retrydv1.Event
}

// State is what a durable store recovered, for New to start from.
type State struct {
	// Sessions are the restored sessions.
	Sessions []*engine.Session
	// Events are the retained events in sequence order; gaps are allowed.
	Events []*retrydv1.Event
	// LastSequence is the last sequence number handed out; numbering
	// continues after it.
	LastSequence uint64
}

// persistRetryDelay is how long the timer loop waits before it tries again
// to record a start or an abandonment that could not be persisted.
const persistRetryDelay = time.Second

// timerWorkers bounds how many due timers a persisting store handles at
// once: each waits for its write, and concurrent writes share one sync.
const timerWorkers = 256

// timerBatch bounds how many due timers the timer goroutine takes from the
// heap at once.
const timerBatch = 256

// Store is the in-memory store. Create it with New and stop it with Close.
type Store struct {
	cfg    Config
	seed   maphash.Seed
	shards [shardCount]shard
	index  [shardCount]indexShard
	log    *eventLog
	timers *timerHeap

	awaiters atomic.Int64
	fleets   fleetStates // see fleet.go
	// started is when the store started: a restored retry that fell due
	// before gets a whole abandon grace from then (abandonAt).
	started time.Time

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type shard struct {
	mu       sync.Mutex
	sessions table[engine.Session] // by id
	// done holds a channel per retry of the shard that a stream awaits,
	// closed and dropped once the retry's end is committed (release): a
	// retry nobody awaits never has one.
	done map[*engine.Retry]chan struct{}
	// txn is the shard's transaction (see begin).
	txn txn
}

type indexShard struct {
	mu      sync.Mutex
	retries table[engine.Retry] // by id
}

func sessionID(s *engine.Session) string { return s.ID }
func retryID(r *engine.Retry) string     { return r.ID }

// New starts a Store and its timer and expiry goroutines.
func New(cfg Config) *Store {
	cfg.Options = cfg.Options.WithDefaults()
	s := &Store{
		cfg:     cfg,
		seed:    maphash.MakeSeed(),
		log:     newEventLog(cfg.EventLogSize),
		timers:  newTimerHeap(),
		closing: make(chan struct{}),
		started: cfg.Options.Now(),
	}
	for i := range s.shards {
		s.shards[i].sessions = newTable(sessionID)
		s.index[i].retries = newTable(retryID)
	}
	if st := cfg.Restore; st != nil {
		s.restore(st)
	}
	s.wg.Add(2)
	go s.runTimers()
	go s.runExpiry()
	return s
}

// Close ends every AwaitRetry stream with Cancelled (reason shutdown) and
// every WatchEvents stream, and stops the store's goroutines. Nothing is
// recorded: shutdown is not a decision.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.timers.stop()
	})
	s.wg.Wait()
	return nil
}

// restore loads recovered state: the sessions and their retained retries
// (indexed), one timer per pending retry, and the event log. A retry that
// fell due while the server was down is given a whole abandon grace from
// now (abandonAt): no agent could await it before.
func (s *Store) restore(st *State) {
	s.log.restore(st.Events, st.LastSequence)
	for _, sess := range st.Sessions {
		sh, h := s.shardOf(sess.ID)
		sh.sessions.put(h, sess)
		for _, r := range sess.Retries() {
			s.indexRetry(r)
		}
		if r := sess.Pending(); r != nil {
			s.timers.push(r.Due(), r)
		}
	}
}

// change is one session's transition waiting to be committed.
type change struct {
	sess   *engine.Session
	cp     *engine.Checkpoint // nil without Persist
	forget bool
	events []*retrydv1.Event
}

// checkpoint captures sess before a transition, when a failed write may
// have to undo it.
func (s *Store) checkpoint(sess *engine.Session) *engine.Checkpoint {
	if s.cfg.Persist == nil {
		return nil
	}
	return sess.Checkpoint()
}

// commit makes transitions durable (with Persist) and then visible: their
// events become readable and the awaiters of retries they ended are
// released. Callers hold the sessions' shard lock, so nothing observes a
// session between its transition and the outcome of its write. If the
// write fails, every session is reverted to its checkpoint and the events'
// sequences are abandoned: the transitions never happened.
func (s *Store) commit(changes ...change) error {
	if s.cfg.Persist == nil {
		for _, c := range changes {
			s.log.append(c.events...)
			s.release(c.sess)
		}
		return nil
	}
	var events []*retrydv1.Event
	for _, c := range changes {
		events = append(events, c.events...)
	}
	// Number the events before the snapshot is taken: a stored response
	// carries its event, and the durable copy must carry the final number.
	res := s.log.reserve(events)
	out := make([]Change, len(changes))
	for i, c := range changes {
		out[i] = Change{SessionID: c.sess.ID, Events: c.events}
		if !c.forget {
			out[i].Session = c.sess.Snapshot()
		}
	}
	if err := s.cfg.Persist(out); err != nil {
		s.log.resolve(res, false)
		for _, c := range changes {
			c.sess.Revert(c.cp)
		}
		return fmt.Errorf("memory: persist: %w: %w", store.ErrUnavailable, err)
	}
	s.log.resolve(res, true)
	for _, c := range changes {
		s.release(c.sess)
	}
	return nil
}

// release commits a session's transitions (engine.Session.Commit) and
// wakes the streams that await the retries they ended; the session's
// shard lock is held.
func (s *Store) release(sess *engine.Session) {
	if settled := sess.Settled(); len(settled) > 0 {
		sh, _ := s.shardOf(sess.ID)
		for _, r := range settled {
			if ch, ok := sh.done[r]; ok {
				close(ch)
				delete(sh.done, r)
			}
		}
	}
	sess.Commit()
}

// doneOf returns the channel closed once r's end is committed; the shard
// lock is held and r is pending.
func (sh *shard) doneOf(r *engine.Retry) <-chan struct{} {
	ch, ok := sh.done[r]
	if !ok {
		if sh.done == nil {
			sh.done = map[*engine.Retry]chan struct{}{}
		}
		ch = make(chan struct{})
		sh.done[r] = ch
	}
	return ch
}

func (s *Store) env() engine.Env {
	return engine.Env{Now: s.cfg.Now(), Rand: s.cfg.Rand, NewID: s.cfg.NewID}
}

// shardOf returns the shard of a session and the hash of its id, whose
// low bits chose the shard and whose others choose the slot in the
// shard's table: an id is hashed once per lookup.
func (s *Store) shardOf(sessionID string) (*shard, uint64) {
	h := maphash.String(s.seed, sessionID)
	return &s.shards[h%shardCount], h
}

// indexOf is shardOf for the retry index.
func (s *Store) indexOf(retryID string) (*indexShard, uint64) {
	h := maphash.String(s.seed, retryID)
	return &s.index[h%shardCount], h
}

func (s *Store) indexRetry(r *engine.Retry) {
	ix, h := s.indexOf(r.ID)
	ix.mu.Lock()
	ix.retries.put(h, r)
	ix.mu.Unlock()
}

func (s *Store) unindex(rs []*engine.Retry) {
	for _, r := range rs {
		ix, h := s.indexOf(r.ID)
		ix.mu.Lock()
		ix.retries.remove(h, r.ID)
		ix.mu.Unlock()
	}
}

// Due implements store.DueSource: the due time of a retained retry.
// A retry's due time never changes once it is indexed.
func (s *Store) Due(retryID string) (time.Time, bool) {
	ix, h := s.indexOf(retryID)
	ix.mu.Lock()
	r := ix.retries.get(h, retryID)
	ix.mu.Unlock()
	if r == nil {
		return time.Time{}, false
	}
	return r.Due(), true
}

// runTimers starts due retries that have an awaiter, and cancels as
// abandoned the ones nobody awaited within the grace. Without Persist one
// goroutine handles every timer in turn; with it, each timer is handled in
// a goroutine of its own (at most timerWorkers at once), so that starts
// due together share one durable write instead of queueing for one each.
func (s *Store) runTimers() {
	defer s.wg.Done()
	var workers chan struct{}
	if s.cfg.Persist != nil {
		workers = make(chan struct{}, timerWorkers)
	}
	var batch []timerEntry
	for {
		var ok bool
		batch, ok = s.timers.due(s.cfg.Now, batch[:0], timerBatch)
		if !ok {
			return
		}
		for _, e := range batch {
			if workers == nil {
				s.fire(e)
				continue
			}
			workers <- struct{}{}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.fire(e)
				<-workers
			}()
		}
		clear(batch) // drop the retries until the next batch
	}
}

// fire handles one timer: the timer rule, when its retry is still its
// session's pending retry (a retry has a timer entry per deadline it was
// given, and keeps none of them once it ends).
func (s *Store) fire(e timerEntry) { _ = s.tick(e.retry) }

// runExpiry drops sessions idle for longer than the chain TTL.
func (s *Store) runExpiry() {
	defer s.wg.Done()
	every := min(s.cfg.ChainTTL/4, time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
			now := s.cfg.Now()
			s.expire(now.Add(-s.cfg.ChainTTL))
			s.fleets.expire(now.Add(-store.FleetTTL))
		}
	}
}

// expire forgets the sessions idle since before; a shard's expired
// sessions are committed together (one durable write per shard). If the
// write fails they stay, and the next round tries again.
func (s *Store) expire(before time.Time) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		var changes []change
		sh.sessions.all(func(sess *engine.Session) bool {
			if sess.Pending() == nil && sess.Updated().Before(before) {
				cp := s.checkpoint(sess)
				changes = append(changes, change{sess: sess, cp: cp, forget: true, events: sess.Expire(s.env())})
			}
			return true
		})
		if len(changes) > 0 && s.commit(changes...) == nil {
			for _, c := range changes {
				sh.sessions.remove(maphash.String(s.seed, c.sess.ID), c.sess.ID)
				s.unindex(c.sess.Retries())
			}
		}
		sh.mu.Unlock()
	}
}

// Stats implements store.Backend: it scans every shard, so it is meant
// for metrics scrapes, not hot paths.
func (s *Store) Stats() store.Stats {
	st := store.Stats{Awaiters: s.awaiters.Load()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Sessions += int64(sh.sessions.Len())
		sh.sessions.all(func(sess *engine.Session) bool {
			st.OpenChains += int64(sess.OpenChains())
			if sess.Pending() != nil {
				st.PendingRetries++
			}
			return true
		})
		sh.mu.Unlock()
	}
	return st
}

// Len reports how many sessions the store holds.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.sessions.Len()
		sh.mu.Unlock()
	}
	return n
}
