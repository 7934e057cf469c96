package store

import (
	"time"

	"github.com/retryd/retryd/engine"
)

// Fleet protection's glue, the same in every backend: a transition that
// decides with a provider's fleet state reads it in the session's
// transaction (Txn.Fleet) and saves what the engine returned in the same
// one (Txn.SaveFleet). A failure decides with the configuration the
// service passes; a retry's start and its cancellation with the state its
// fleet key names (engine.Retry.FleetKey), decided with the configuration
// kept beside that state, so any replica that starts or cancels it counts
// it out of its provider's queue at once.

// FleetTTL is how long a backend keeps a fleet state nobody decided with:
// by then its budget has refilled and its window emptied, and a fresh
// state is as good.
const FleetTTL = time.Hour

// fleetOf returns the fleet protection of r's provider, as the
// transaction reads it: nil when r was not admitted by fleet protection,
// or when no state is kept for it any more (it expired).
func fleetOf(t Txn, r *engine.Retry) *engine.Fleet {
	key := r.FleetKey()
	if key == "" {
		return nil
	}
	fl, ok := t.Fleet(key)
	if !ok {
		return nil
	}
	return &fl
}

// save keeps a fleet state a transition changed (nil: none).
func save(t Txn, fl *engine.Fleet) {
	if fl != nil {
		t.SaveFleet(*fl)
	}
}
