package store

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store/await"
)

// Store is the service's store: every RPC's rule over a Backend.
type Store struct {
	b Backend
}

// New returns the rules over b.
func New(b Backend) *Store { return &Store{b: b} }

// FailedStep decides a validated failure (Fail) in a transaction of its
// session.
func (s *Store) FailedStep(ctx context.Context, f engine.Failure) (engine.FailOutcome, error) {
	var key string
	if f.Fleet != nil {
		key = f.Fleet.Key
	}
	op := failOps.Get().(*failOp)
	op.f = f
	if err := s.b.Update(ctx, f.Request.GetSessionId(), key, op); err != nil {
		// Not pooled again: the backend may still apply it (see Update).
		return engine.FailOutcome{}, err
	}
	out := op.out
	*op = failOp{}
	failOps.Put(op)
	return out, nil
}

// failOp is FailedStep's transition, pooled: the storm of first failures a
// provider outage brings is this call, and it allocates nothing for its
// transition. An op goes back to the pool only once Update said it is
// done with.
type failOp struct {
	f   engine.Failure
	out engine.FailOutcome
}

var failOps = sync.Pool{New: func() any { return new(failOp) }}

// Apply implements Transition.
func (op *failOp) Apply(t Txn) error {
	var err error
	op.out, err = Fail(t, op.f)
	return err
}

// Fail is FailedStep's rule: engine.Session.Fail on the session, created
// when there is none, with the fleet state f names as the transaction
// reads it, recorded with what it changed.
func Fail(t Txn, f engine.Failure) (engine.FailOutcome, error) {
	sess := t.Session()
	if sess == nil {
		sess = t.Create()
	}
	if f.Fleet != nil {
		// The state as the transaction reads it, decided with the
		// configuration the service decides with now.
		st, _ := t.Fleet(f.Fleet.Key)
		f.Fleet = &engine.Fleet{Key: f.Fleet.Key, Config: f.Fleet.Config, State: st.State}
	}
	out, err := sess.Fail(t.Env(), f)
	if err != nil {
		return engine.FailOutcome{}, err
	}
	save(t, out.Fleet)
	if len(out.Events) == 0 {
		return out, nil // a repeated report changes nothing
	}
	t.Record(out.Events...)
	t.Forget(out.Forgotten)
	return out, nil
}

// Locate returns the session that retains retry retryID; the service
// answers not found unless it is in the caller's scope.
func (s *Store) Locate(ctx context.Context, retryID string) (string, error) {
	return s.b.Locate(ctx, retryID)
}

// AwaitRetry runs the await protocol (package await) for one stream of a
// located retry.
func (s *Store) AwaitRetry(ctx context.Context, sessionID, retryID string, send func(*retrydv1.AwaitRetryResponse) error) error {
	return await.Retry(ctx, s.b.Await(sessionID, retryID), s.b.Now, send)
}

// The rules below answer with a response their transition fills: each
// transition is a value that holds its response, one allocation for both.

// CancelRetry cancels one pending retry of a located retry's session; a
// terminal one is reported as it is.
func (s *Store) CancelRetry(ctx context.Context, sessionID, retryID string) (*retrydv1.CancelRetriesResponse, error) {
	op := &cancelRetry{retryID: retryID}
	if err := s.b.Update(ctx, sessionID, "", op); err != nil {
		return nil, err
	}
	op.resp.Retries = op.states[:]
	return &op.resp, nil
}

type cancelRetry struct {
	retryID string
	resp    retrydv1.CancelRetriesResponse
	states  [1]*retrydv1.RetryState
}

// Apply implements Transition.
func (op *cancelRetry) Apply(t Txn) error {
	sess := t.Session()
	var r *engine.Retry
	if sess != nil {
		r = sess.Retry(op.retryID)
	}
	if r == nil {
		return notFound("no retry " + op.retryID)
	}
	out := sess.Cancel(t.Env(), r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, fleetOf(t, r))
	if len(out.Events) > 0 {
		t.Record(out.Events...)
		save(t, out.Fleet)
	}
	op.states[0] = r.State()
	return nil
}

// CancelSession cancels a session's pending retry and open delegation.
func (s *Store) CancelSession(ctx context.Context, sessionID string) (*retrydv1.CancelRetriesResponse, error) {
	op := &cancelSession{sessionID: sessionID}
	if err := s.b.Update(ctx, sessionID, "", op); err != nil {
		return nil, err
	}
	return &op.resp, nil
}

type cancelSession struct {
	sessionID string
	resp      retrydv1.CancelRetriesResponse
}

// Apply implements Transition.
func (op *cancelSession) Apply(t Txn) error {
	sess := t.Session()
	if sess == nil {
		return notFound("no session " + op.sessionID)
	}
	var fl *engine.Fleet
	if r := sess.Pending(); r != nil {
		fl = fleetOf(t, r)
	}
	out := sess.CancelAll(t.Env(), fl)
	t.Record(out.Events...)
	save(t, out.Fleet)
	op.resp.Retries, op.resp.DelegationsCancelled = out.States, 0
	if out.Delegation {
		op.resp.DelegationsCancelled = 1
	}
	return nil
}

// StepSucceeded closes a session's open chains. A success on a session
// retryd has never seen records nothing: there is no chain to close.
func (s *Store) StepSucceeded(ctx context.Context, req *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	op := &stepSucceeded{req: req}
	if err := s.b.Update(ctx, req.GetSessionId(), "", op); err != nil {
		return nil, err
	}
	return &op.resp, nil
}

type stepSucceeded struct {
	req  *retrydv1.StepSucceededRequest
	resp retrydv1.StepSucceededResponse
}

// Apply implements Transition.
func (op *stepSucceeded) Apply(t Txn) error {
	sess := t.Session()
	if sess == nil {
		return nil
	}
	closed, evs, err := sess.Succeed(t.Env(), op.req.GetTurn(), op.req.GetStep())
	if err != nil {
		return err
	}
	t.Record(evs...) // even without events the latest position moved
	op.resp.Closed = closed
	return nil
}

// GetChains snapshots a session.
func (s *Store) GetChains(ctx context.Context, sessionID string) (*retrydv1.GetChainsResponse, error) {
	var resp *retrydv1.GetChainsResponse
	err := s.b.Read(ctx, sessionID, func(sess *engine.Session) error {
		if sess == nil {
			return notFound("no session " + sessionID)
		}
		resp = sess.Chains()
		return nil
	})
	return resp, err
}

// watchBatch is how many events WatchEvents reads at once.
const watchBatch = 512

// WatchEvents streams the event log: the retained events after the
// request's sequence, then each as it is appended, until the caller
// leaves, the store closes (ErrShutdown), or, with stop_at_end, the log's
// end.
func (s *Store) WatchEvents(ctx context.Context, req *retrydv1.WatchEventsRequest, send func(*retrydv1.Event) error) error {
	r := s.b.Events(req.GetSessionId(), req.GetAfterSequence())
	var recheck *time.Timer
	defer func() {
		if recheck != nil {
			recheck.Stop()
		}
	}()
	for {
		b, err := r.Next(ctx)
		if err != nil {
			return err
		}
		if err := s.watched(ctx, req, r, b, send, &recheck); err != errContinue {
			return err
		}
	}
}

// errContinue is watched's answer when the stream goes on.
var errContinue = errors.New("continue")

// watched sends one batch and waits for the next; b.Release is called
// once, whatever happens.
func (s *Store) watched(ctx context.Context, req *retrydv1.WatchEventsRequest, r EventReader, b Batch,
	send func(*retrydv1.Event) error, recheck **time.Timer,
) error {
	defer b.Release()
	for _, ev := range b.Events {
		if err := send(ev); err != nil {
			return err
		}
	}
	switch {
	case b.More:
		return errContinue
	case req.GetStopAtEnd() && !r.Held():
		return nil
	}
	var again <-chan time.Time
	if b.Recheck > 0 {
		if *recheck == nil {
			*recheck = time.NewTimer(b.Recheck)
		} else {
			(*recheck).Reset(b.Recheck)
		}
		again = (*recheck).C
	}
	select {
	case <-b.Wake:
	case <-again:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.b.Closing():
		return ErrShutdown
	}
	return errContinue
}

// FleetState reads the fleet state under key.
func (s *Store) FleetState(ctx context.Context, key string) (fleet.ProviderState, error) {
	return s.b.FleetState(ctx, key)
}

// UpdateFleet applies a report outside any session's transaction (a
// success).
func (s *Store) UpdateFleet(ctx context.Context, key string, cfg fleet.Config, r fleet.Report, now time.Time) error {
	return s.b.UpdateFleet(ctx, key, cfg, r, now)
}

// notFound is the error of an id the store does not know.
func notFound(msg string) error { return &engine.Error{Kind: engine.KindNotFound, Message: msg} }
