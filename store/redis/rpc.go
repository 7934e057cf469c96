package redis

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/await"
)

// The service.Store calls, each a transition committed by update.

// FailedStep implements service.Store.
func (s *Store) FailedStep(ctx context.Context, f engine.Failure) (engine.FailOutcome, error) {
	var out engine.FailOutcome
	if err := s.updateWithFleet(ctx, f.Request.GetSessionId(), f.FleetKey, decide(f, &out)); err != nil {
		return engine.FailOutcome{}, err
	}
	return out, nil
}

// decide is FailedStep's transition; it leaves its outcome in out.
func decide(f engine.Failure, out *engine.FailOutcome) func(*txn) error {
	return func(t *txn) error {
		if t.sess == nil {
			t.sess = engine.NewSession(t.id, t.env.Now)
		}
		var err error
		if *out, err = t.decide(f); err != nil {
			return err
		}
		if len(out.Events) == 0 {
			return nil // a repeated report changes nothing
		}
		t.changed(out.Events...) // a new retry sets the timer (writeTimer)
		t.forgotten = out.Forgotten
		return nil
	}
}

// sessionOf returns the session of a retry id of a session in scope (see
// service.InScope): the one it names, or the retry index's. The caller
// finds the retry in the session, or answers NOT_FOUND.
func (s *Store) sessionOf(ctx context.Context, scope, retryID string) (string, error) {
	if id, ok := retrySession(retryID); ok {
		if !service.InScope(scope, id) {
			return "", notFound("no retry %s", retryID)
		}
		return id, nil
	}
	p, ok := s.keys.retryPartition(retryID)
	if !ok {
		return "", notFound("no retry %s", retryID)
	}
	bctx, cancel := s.bounded(ctx)
	defer cancel()
	id, err := s.rdb.Get(bctx, s.keys.retryKey(p, retryID)).Result()
	if errors.Is(err, redis.Nil) || err == nil && !service.InScope(scope, id) {
		return "", notFound("no retry %s", retryID)
	}
	if err != nil {
		return "", s.unavailableWithin(ctx, "reading the retry index", err)
	}
	return id, nil
}

// retry reads a retained retry, with its awaiter count.
func (s *Store) retry(ctx context.Context, sessionID, retryID string) (*engine.Retry, error) {
	sess, err := s.loadOne(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	var r *engine.Retry
	if sess != nil {
		r = sess.Retry(retryID)
	}
	if r == nil {
		return nil, notFound("no retry %s", retryID)
	}
	return r, nil
}

// AwaitRetry implements service.Store: the protocol of package await,
// over this store's primitives (awaitStore).
func (s *Store) AwaitRetry(ctx context.Context, scope, retryID string, send func(*retrydv1.AwaitRetryResponse) error) error {
	return await.Retry(ctx, &awaitStore{s: s}, s.cfg.Now, scope, retryID, send)
}

// awaitStore is the store as the await protocol sees it, for one stream
// of the retry Look found: a retry is read from its session's key, an
// awaiter is a leased entry in the session's awaiter hash (awaiters.go),
// and a start is the timer's transition (fire).
type awaitStore struct {
	s                  *Store
	sessionID, retryID string
	due                time.Time // the retry's, as Look found it
}

func view(r *engine.Retry) await.View {
	return await.View{State: r.State(), Terminal: r.Terminal(), Due: r.Due()}
}

// Look implements await.Store.
func (a *awaitStore) Look(ctx context.Context, scope, retryID string) (await.View, error) {
	sessionID, err := a.s.sessionOf(ctx, scope, retryID)
	if err != nil {
		return await.View{}, err
	}
	a.sessionID, a.retryID = sessionID, retryID
	r, err := a.s.retry(ctx, sessionID, retryID)
	if err != nil {
		return await.View{}, err
	}
	a.due = r.Due()
	return view(r), nil
}

// Attach implements await.Store: the retry is read again once the
// awaiter's entry is written, so that its count includes this stream.
func (a *awaitStore) Attach(ctx context.Context) (await.Awaiter, await.View, error) {
	s, sessionID, retryID := a.s, a.sessionID, a.retryID
	aw, err := s.attach(ctx, sessionID, retryID, a.due)
	if err != nil {
		return nil, await.View{}, err
	}
	aw.sessionID, aw.retryID = sessionID, retryID
	r, err := s.retry(ctx, sessionID, retryID)
	if err != nil {
		aw.Detach()
		return nil, await.View{}, err
	}
	return aw, view(r), nil
}

// Start implements await.Awaiter.
func (a *awaiter) Start(ctx context.Context) error { return a.s.fire(ctx, a.sessionID, a.retryID) }

// Wait implements await.Awaiter: it reads the retry whenever a
// notification says its session changed, or every recheckInterval (a
// notification lost while the subscription reconnected), renewing the
// awaiter's lease as it goes.
func (a *awaiter) Wait(ctx context.Context) (*retrydv1.AwaitRetryResponse, error) {
	s := a.s
	recheck := time.NewTicker(recheckInterval)
	defer recheck.Stop()
	for {
		notified, release := s.notify.watch(a.sessionID)
		if err := a.renewIfDue(ctx); err != nil {
			release()
			return nil, err
		}
		r, err := s.retry(ctx, a.sessionID, a.retryID)
		if err != nil {
			release()
			return nil, err
		}
		if term := r.Terminal(); term != nil {
			release()
			return term, nil
		}
		if !s.cfg.Now().Before(r.Due()) {
			// Due and still pending although this stream awaits it: its
			// timer found no live awaiter (this one's lease had run out
			// while it was late). Start it now rather than at the abandon
			// timer.
			if err := s.fire(ctx, a.sessionID, a.retryID); err != nil {
				release()
				return nil, err
			}
		}
		select {
		case <-notified:
		case <-recheck.C:
		case <-ctx.Done():
			release()
			return nil, ctx.Err()
		case <-s.closing:
			release()
			return r.ShutdownCancelled(), nil
		}
		release()
	}
}

// CancelRetry implements service.Store.
func (s *Store) CancelRetry(ctx context.Context, scope, retryID string) (*retrydv1.CancelRetriesResponse, error) {
	sessionID, err := s.sessionOf(ctx, scope, retryID)
	if err != nil {
		return nil, err
	}
	var state *retrydv1.RetryState
	err = s.update(ctx, sessionID, func(t *txn) error {
		var r *engine.Retry
		if t.sess != nil {
			r = t.sess.Retry(retryID)
		}
		if r == nil {
			return notFound("no retry %s", retryID)
		}
		if evs := t.sess.Cancel(t.env, r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED); len(evs) > 0 {
			t.changed(evs...)
		}
		state = r.State()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &retrydv1.CancelRetriesResponse{Retries: []*retrydv1.RetryState{state}}, nil
}

// CancelSession implements service.Store.
func (s *Store) CancelSession(ctx context.Context, sessionID string) (*retrydv1.CancelRetriesResponse, error) {
	resp := &retrydv1.CancelRetriesResponse{}
	err := s.update(ctx, sessionID, func(t *txn) error {
		if t.sess == nil {
			return notFound("no session %s", sessionID)
		}
		states, delegation, evs := t.sess.CancelAll(t.env)
		t.changed(evs...)
		resp.Retries, resp.DelegationsCancelled = states, 0
		if delegation {
			resp.DelegationsCancelled = 1
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// StepSucceeded implements service.Store. A success on a session retryd
// has never seen records nothing.
func (s *Store) StepSucceeded(ctx context.Context, req *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	resp := &retrydv1.StepSucceededResponse{}
	err := s.update(ctx, req.GetSessionId(), func(t *txn) error {
		if t.sess == nil {
			return nil
		}
		closed, evs, err := t.sess.Succeed(t.env, req.GetTurn(), req.GetStep())
		if err != nil {
			return err
		}
		t.changed(evs...) // even without events the latest position moved
		resp.Closed = closed
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// GetChains implements service.Store.
func (s *Store) GetChains(ctx context.Context, sessionID string) (*retrydv1.GetChainsResponse, error) {
	sess, err := s.loadOne(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	if sess == nil {
		return nil, notFound("no session %s", sessionID)
	}
	return sess.Chains(), nil
}

// WatchEvents implements service.Store: all events come from the
// partition's stream, or with several partitions from all of theirs
// merged in sequence order (watchAll); a session's are those of its
// partition's stream that name it. Each event is appended once, to its
// partition's stream: a stream per session as well would double the
// appends of every decision and hold a whole stream node per session,
// for the rarer reader of one session, who reads past the other
// sessions' events instead, as the memory store's log does.
func (s *Store) WatchEvents(ctx context.Context, req *retrydv1.WatchEventsRequest, send func(*retrydv1.Event) error) error {
	session := req.GetSessionId()
	key := s.keys.eventsKey(s.keys.partition(session))
	if session == "" && s.keys.partitions() > 1 {
		return s.watchAll(ctx, req, send)
	}
	after := req.GetAfterSequence()
	recheck := time.NewTicker(recheckInterval)
	defer recheck.Stop()
	for {
		notified, release := s.notify.watch(session)
		msgs, err := s.rdb.XRangeN(ctx, key, strconv.FormatUint(after+1, 10)+"-0", "+", readBatch).Result()
		if err != nil {
			release()
			return unavailable("reading events", err)
		}
		for _, m := range msgs {
			evs, err := decodeEvents(m, after)
			if err != nil {
				release()
				return err
			}
			for _, ev := range evs {
				after = ev.GetSequence()
				if session != "" && ev.GetSessionId() != session {
					continue
				}
				if err := send(ev); err != nil {
					release()
					return err
				}
			}
		}
		if len(msgs) == readBatch {
			release()
			continue
		}
		if req.GetStopAtEnd() {
			release()
			return nil
		}
		select {
		case <-notified:
		case <-recheck.C:
		case <-ctx.Done():
			release()
			return ctx.Err()
		case <-s.closing:
			release()
			return service.ErrShutdown
		}
		release()
	}
}
