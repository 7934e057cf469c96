package store

import (
	"context"
	"errors"
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

// Backend returns the backend the rules run over.
func (s *Store) Backend() Backend { return s.b }

// Close closes the backend.
func (s *Store) Close() error { return s.b.Close() }

// FailedStep decides a validated failure (Fail) in a transaction of its
// session.
func (s *Store) FailedStep(ctx context.Context, f engine.Failure) (engine.FailOutcome, error) {
	var out engine.FailOutcome
	var key string
	if f.Fleet != nil {
		key = f.Fleet.Key
	}
	err := s.b.Update(ctx, f.Request.GetSessionId(), key, func(t Txn) error {
		var err error
		out, err = Fail(t, f)
		return err
	})
	if err != nil {
		return engine.FailOutcome{}, err
	}
	return out, nil
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

// CancelRetry cancels one pending retry of a located retry's session; a
// terminal one is reported as it is.
func (s *Store) CancelRetry(ctx context.Context, sessionID, retryID string) (*retrydv1.CancelRetriesResponse, error) {
	var state *retrydv1.RetryState
	err := s.b.Update(ctx, sessionID, "", func(t Txn) error {
		sess := t.Session()
		var r *engine.Retry
		if sess != nil {
			r = sess.Retry(retryID)
		}
		if r == nil {
			return notFound("no retry " + retryID)
		}
		out := sess.Cancel(t.Env(), r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, fleetOf(t, r))
		if len(out.Events) > 0 {
			t.Record(out.Events...)
			save(t, out.Fleet)
		}
		state = r.State()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &retrydv1.CancelRetriesResponse{Retries: []*retrydv1.RetryState{state}}, nil
}

// CancelSession cancels a session's pending retry and open delegation.
func (s *Store) CancelSession(ctx context.Context, sessionID string) (*retrydv1.CancelRetriesResponse, error) {
	resp := &retrydv1.CancelRetriesResponse{}
	err := s.b.Update(ctx, sessionID, "", func(t Txn) error {
		sess := t.Session()
		if sess == nil {
			return notFound("no session " + sessionID)
		}
		var fl *engine.Fleet
		if r := sess.Pending(); r != nil {
			fl = fleetOf(t, r)
		}
		out := sess.CancelAll(t.Env(), fl)
		t.Record(out.Events...)
		save(t, out.Fleet)
		resp.Retries, resp.DelegationsCancelled = out.States, 0
		if out.Delegation {
			resp.DelegationsCancelled = 1
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// StepSucceeded closes a session's open chains. A success on a session
// retryd has never seen records nothing: there is no chain to close.
func (s *Store) StepSucceeded(ctx context.Context, req *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	resp := &retrydv1.StepSucceededResponse{}
	err := s.b.Update(ctx, req.GetSessionId(), "", func(t Txn) error {
		sess := t.Session()
		if sess == nil {
			return nil
		}
		closed, evs, err := sess.Succeed(t.Env(), req.GetTurn(), req.GetStep())
		if err != nil {
			return err
		}
		t.Record(evs...) // even without events the latest position moved
		resp.Closed = closed
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
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
