// Package await is the AwaitRetry protocol, written once for every store
// over a few primitives each store provides (Store, Awaiter).
//
// The protocol: a stream first receives the retry's state; a retry that
// already ended then receives its one terminal message at once. Otherwise
// the stream counts as an awaiter of the retry from then on (a due retry
// starts only while an agent awaits it, and is abandoned when none did
// within the grace); a retry that is due already starts now, since an
// agent is here, though the stream still reports the pending state first.
// The stream then waits for the one terminal message — Started, or
// Cancelled with its reason, or Cancelled (shutdown) when the store stops
// — sends it and ends.
package await

import (
	"context"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// View is a retry as a store read it.
type View struct {
	// State is the retry's state.
	State *retrydv1.RetryState
	// Terminal is its terminal message, nil while it is pending.
	Terminal *retrydv1.AwaitRetryResponse
	// Due is when it falls due.
	Due time.Time
}

// Store is what a store provides to the protocol, for one stream.
type Store interface {
	// Look finds and reads the stream's retry: a not-found engine.Error
	// when there is none.
	Look(ctx context.Context) (View, error)
	// Attach counts one more awaiter of the retry Look found, and reads it
	// again with that awaiter counted.
	Attach(ctx context.Context) (Awaiter, View, error)
}

// Awaiter is one stream's hold on a retry, from Attach to Detach.
type Awaiter interface {
	// Start starts the retry if it is still pending and due: its awaiter
	// is here. A start fleet protection holds back (engine.Session.Start)
	// waits for the time it names, on the store's timer; a store that
	// cannot record the start returns its error.
	Start(ctx context.Context) error
	// Wait returns the retry's terminal message once it has one — or
	// Cancelled (reason shutdown) when the store stops first — or ctx's
	// error when the caller leaves.
	Wait(ctx context.Context) (*retrydv1.AwaitRetryResponse, error)
	// Detach stops counting the awaiter.
	Detach()
}

// Retry runs the protocol for one AwaitRetry stream; now is the store's
// decision clock.
func Retry(ctx context.Context, s Store, now func() time.Time, send func(*retrydv1.AwaitRetryResponse) error) error {
	v, err := s.Look(ctx)
	if err != nil {
		return err
	}
	if v.Terminal != nil {
		if err := send(stateOf(v)); err != nil {
			return err
		}
		return send(v.Terminal)
	}
	a, v, err := s.Attach(ctx)
	if err != nil {
		return err
	}
	defer a.Detach()
	if v.Terminal == nil && !now().Before(v.Due) {
		// Due already, and now an agent is here: this is the start. The
		// stream still reports the pending state first, then Started.
		if err := a.Start(ctx); err != nil {
			return err
		}
	}
	if err := send(stateOf(v)); err != nil {
		return err
	}
	term, err := a.Wait(ctx)
	if err != nil {
		return err
	}
	return send(term)
}

func stateOf(v View) *retrydv1.AwaitRetryResponse {
	return &retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_State{State: v.State}}
}
