// Package memory is retryd's default store: every session lives in this
// process, sharded by session id so unrelated sessions never contend on one
// lock. Pending retries wait in one timer heap (not a goroutine each), idle
// sessions expire after a TTL, and the event log is a bounded ring.
//
// Nothing survives a restart: a restarted server starts every chain again
// at retry 1.
package memory

import (
	"context"
	"crypto/rand"
	"hash/maphash"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
)

var _ service.Store = (*Store)(nil)

const shardCount = 64

// Config tunes a Store. Zero fields take the defaults.
type Config struct {
	// ChainTTL is how long an idle session (no pending retry) is kept.
	// Default 1h.
	ChainTTL time.Duration
	// AbandonGrace is how long a due retry waits for an awaiter before it is
	// cancelled as abandoned. Default 60s.
	AbandonGrace time.Duration
	// EventLogSize is how many events the log retains. Default 100000.
	EventLogSize int
	// Now replaces time.Now (tests).
	Now func() time.Time
	// NewID replaces the random 128-bit retry id generator (tests).
	NewID func() string
	// Rand replaces the jitter source (tests).
	Rand interface{ Float64() float64 }
}

// Store is the in-memory store. Create it with New and stop it with Close.
type Store struct {
	cfg    Config
	seed   maphash.Seed
	shards [shardCount]shard
	index  [shardCount]indexShard
	log    *eventLog
	timers *timerHeap

	awaiters atomic.Int64

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type shard struct {
	mu       sync.Mutex
	sessions map[string]*engine.Session
}

type indexShard struct {
	mu      sync.Mutex
	retries map[string]*engine.Retry
}

type globalRand struct{}

func (globalRand) Float64() float64 { return mrand.Float64() }

// New starts a Store and its timer and expiry goroutines.
func New(cfg Config) *Store {
	if cfg.ChainTTL <= 0 {
		cfg.ChainTTL = time.Hour
	}
	if cfg.AbandonGrace <= 0 {
		cfg.AbandonGrace = time.Minute
	}
	if cfg.EventLogSize <= 0 {
		cfg.EventLogSize = 100_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NewID == nil {
		cfg.NewID = rand.Text
	}
	if cfg.Rand == nil {
		cfg.Rand = globalRand{}
	}
	s := &Store{
		cfg:     cfg,
		seed:    maphash.MakeSeed(),
		log:     newEventLog(cfg.EventLogSize),
		timers:  newTimerHeap(),
		closing: make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].sessions = make(map[string]*engine.Session)
		s.index[i].retries = make(map[string]*engine.Retry)
	}
	s.wg.Add(2)
	go s.runTimers()
	go s.runExpiry()
	return s
}

// Close ends every AwaitRetry stream with Cancelled (reason shutdown) and
// every WatchEvents stream, and stops the store's goroutines. Nothing is
// recorded: shutdown is not a decision.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.timers.stop()
	})
	s.wg.Wait()
}

func (s *Store) env() engine.Env {
	return engine.Env{Now: s.cfg.Now(), Rand: s.cfg.Rand, NewID: s.cfg.NewID}
}

func (s *Store) shardOf(sessionID string) *shard {
	return &s.shards[maphash.String(s.seed, sessionID)%shardCount]
}

func (s *Store) indexOf(retryID string) *indexShard {
	return &s.index[maphash.String(s.seed, retryID)%shardCount]
}

func (s *Store) lookup(retryID string) (*engine.Retry, error) {
	ix := s.indexOf(retryID)
	ix.mu.Lock()
	r := ix.retries[retryID]
	ix.mu.Unlock()
	if r == nil {
		return nil, &engine.Error{Kind: engine.KindNotFound, Message: "no retry " + retryID}
	}
	return r, nil
}

func (s *Store) indexRetry(r *engine.Retry) {
	ix := s.indexOf(r.ID)
	ix.mu.Lock()
	ix.retries[r.ID] = r
	ix.mu.Unlock()
}

func (s *Store) unindex(rs []*engine.Retry) {
	for _, r := range rs {
		ix := s.indexOf(r.ID)
		ix.mu.Lock()
		delete(ix.retries, r.ID)
		ix.mu.Unlock()
	}
}

// FailedStep implements service.Store.
func (s *Store) FailedStep(_ context.Context, f engine.Failure) (engine.FailOutcome, error) {
	id := f.Request.GetSessionId()
	sh := s.shardOf(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	env := s.env()
	sess := sh.sessions[id]
	fresh := sess == nil
	if fresh {
		sess = engine.NewSession(id, env.Now)
	}
	out, err := sess.Fail(env, f)
	if err != nil {
		return engine.FailOutcome{}, err
	}
	if fresh {
		sh.sessions[id] = sess
	}
	s.log.append(out.Events...)
	if r := out.Scheduled; r != nil {
		s.indexRetry(r)
		s.timers.push(r.Due, r, timerDue)
	}
	s.unindex(out.Forgotten)
	return out, nil
}

// AwaitRetry implements service.Store.
func (s *Store) AwaitRetry(ctx context.Context, retryID string, send func(*retrydv1.AwaitRetryResponse) error) error {
	r, err := s.lookup(retryID)
	if err != nil {
		return err
	}
	sh := s.shardOf(r.SessionID)
	sh.mu.Lock()
	term := r.Terminal()
	watching := term == nil
	if watching {
		r.Awaiters++
		s.awaiters.Add(1)
	}
	state := r.State()
	if sess := sh.sessions[r.SessionID]; watching && sess != nil && !s.cfg.Now().Before(r.Due) {
		// Due already, and now an agent is here: this is the start. The
		// stream still reports the pending state first, then Started.
		if ev, ok := sess.Start(s.env(), r); ok {
			s.log.append(ev)
		}
	}
	sh.mu.Unlock()

	leave := func() {
		sh.mu.Lock()
		r.Awaiters--
		sh.mu.Unlock()
		s.awaiters.Add(-1)
	}
	if err := send(&retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_State{State: state}}); err != nil {
		if watching {
			leave()
		}
		return err
	}
	if !watching {
		return send(term)
	}
	select {
	case <-r.Done:
		leave()
		return send(r.Terminal())
	case <-ctx.Done():
		leave()
		return ctx.Err()
	case <-s.closing:
		leave()
		sc := r.Scheduled
		return send(&retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_Cancelled{Cancelled: &retrydv1.RetryCancelled{
			RetryId: r.ID, Reason: retrydv1.CancelReason_CANCEL_REASON_SHUTDOWN,
			Turn: sc.GetTurn(), Step: sc.GetStep(), RetryNumber: sc.GetRetryNumber(),
		}}})
	}
}

// CancelRetry implements service.Store.
func (s *Store) CancelRetry(_ context.Context, retryID string) (*retrydv1.CancelRetriesResponse, error) {
	r, err := s.lookup(retryID)
	if err != nil {
		return nil, err
	}
	sh := s.shardOf(r.SessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sess := sh.sessions[r.SessionID]; sess != nil {
		s.log.append(sess.Cancel(s.env(), r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED)...)
	}
	return &retrydv1.CancelRetriesResponse{Retries: []*retrydv1.RetryState{r.State()}}, nil
}

// CancelSession implements service.Store.
func (s *Store) CancelSession(_ context.Context, sessionID string) (*retrydv1.CancelRetriesResponse, error) {
	sh := s.shardOf(sessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sess := sh.sessions[sessionID]
	if sess == nil {
		return nil, &engine.Error{Kind: engine.KindNotFound, Message: "no session " + sessionID}
	}
	states, delegation, evs := sess.CancelAll(s.env())
	s.log.append(evs...)
	resp := &retrydv1.CancelRetriesResponse{Retries: states}
	if delegation {
		resp.DelegationsCancelled = 1
	}
	return resp, nil
}

// StepSucceeded implements service.Store. A success on a session retryd
// has never seen records nothing: there is no chain to close.
func (s *Store) StepSucceeded(_ context.Context, req *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	sh := s.shardOf(req.GetSessionId())
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sess := sh.sessions[req.GetSessionId()]
	if sess == nil {
		return &retrydv1.StepSucceededResponse{}, nil
	}
	closed, evs, err := sess.Succeed(s.env(), req.GetTurn(), req.GetStep())
	if err != nil {
		return nil, err
	}
	s.log.append(evs...)
	return &retrydv1.StepSucceededResponse{Closed: closed}, nil
}

// GetChains implements service.Store.
func (s *Store) GetChains(_ context.Context, sessionID string) (*retrydv1.GetChainsResponse, error) {
	sh := s.shardOf(sessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sess := sh.sessions[sessionID]
	if sess == nil {
		return nil, &engine.Error{Kind: engine.KindNotFound, Message: "no session " + sessionID}
	}
	return sess.Chains(), nil
}

// WatchEvents implements service.Store.
func (s *Store) WatchEvents(ctx context.Context, req *retrydv1.WatchEventsRequest, send func(*retrydv1.Event) error) error {
	after := req.GetAfterSequence()
	for {
		batch, last, notify := s.log.read(after, req.GetSessionId(), 512)
		for _, ev := range batch {
			if err := send(ev); err != nil {
				return err
			}
		}
		after = last
		if len(batch) == 512 {
			continue
		}
		if req.GetStopAtEnd() {
			return nil
		}
		select {
		case <-notify:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return service.ErrShutdown
		}
	}
}

// runTimers starts due retries that have an awaiter, and cancels as
// abandoned the ones nobody awaited within the grace.
func (s *Store) runTimers() {
	defer s.wg.Done()
	for {
		e, ok := s.timers.next(s.cfg.Now)
		if !ok {
			return
		}
		r := e.retry
		sh := s.shardOf(r.SessionID)
		sh.mu.Lock()
		sess := sh.sessions[r.SessionID]
		switch {
		case sess == nil || r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING:
		case e.kind == timerDue && r.Awaiters > 0:
			if ev, ok := sess.Start(s.env(), r); ok {
				s.log.append(ev)
			}
		case e.kind == timerDue:
			s.timers.push(r.Due.Add(s.cfg.AbandonGrace), r, timerAbandon)
		case r.Awaiters == 0:
			s.log.append(sess.Cancel(s.env(), r, retrydv1.CancelReason_CANCEL_REASON_ABANDONED)...)
		}
		sh.mu.Unlock()
	}
}

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
			s.expire(s.cfg.Now().Add(-s.cfg.ChainTTL))
		}
	}
}

func (s *Store) expire(before time.Time) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for id, sess := range sh.sessions {
			if sess.Pending() == nil && sess.Updated.Before(before) {
				s.log.append(sess.Expire(s.env())...)
				delete(sh.sessions, id)
				s.unindex(sess.Retries())
			}
		}
		sh.mu.Unlock()
	}
}

// Stats implements service.StatsSource: it scans every shard, so it is
// meant for metrics scrapes, not hot paths.
func (s *Store) Stats() service.Stats {
	st := service.Stats{Awaiters: s.awaiters.Load()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Sessions += int64(len(sh.sessions))
		for _, sess := range sh.sessions {
			st.OpenChains += int64(sess.OpenChains())
			if sess.Pending() != nil {
				st.PendingRetries++
			}
		}
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
		n += len(sh.sessions)
		sh.mu.Unlock()
	}
	return n
}
