package memory

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	"github.com/retryd/retryd/service"
)

// Fleet protection's state: one fleet.ProviderState per key (a tenant and
// a provider), with the configuration it was last decided with, kept in
// this process (by the file store too: a restart starts every provider
// with a full budget and a closed circuit). Each state has a lock of its
// own, so providers never wait for each other. A transition that decides
// with a state holds that lock from reading the state to saving what the
// engine returned, inside the session's shard lock (the order is always
// shard, then state); the durable write of the file store happens after
// it is released.

// fleetTTL is how long a state nobody decided with is kept, as the Redis
// store keeps it: by then its budget has refilled and its window emptied.
const fleetTTL = time.Hour

// fleetState is one key's state.
type fleetState struct {
	mu    sync.Mutex
	cfg   fleet.Config
	state fleet.ProviderState
	saved time.Time
}

// save keeps the state a transition returned; f.mu is held.
func (f *fleetState) save(cfg fleet.Config, st fleet.ProviderState, now time.Time) {
	f.cfg, f.state, f.saved = cfg, st, now
}

// fleetStates are the store's fleet states by key.
type fleetStates struct {
	n  atomic.Int64 // len(m): a store without fleet protection skips the lock
	mu sync.Mutex
	m  map[string]*fleetState
}

// get returns the state under key, creating a fresh one when create is
// set; nil when there is none.
func (fs *fleetStates) get(key string, create bool) *fleetState {
	if !create && fs.n.Load() == 0 {
		return nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.m[key]
	if f == nil && create {
		if fs.m == nil {
			fs.m = map[string]*fleetState{}
		}
		f = &fleetState{}
		fs.m[key] = f
		fs.n.Store(int64(len(fs.m)))
	}
	return f
}

// expire drops the states not saved since before.
func (fs *fleetStates) expire(before time.Time) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for k, f := range fs.m {
		f.mu.Lock()
		old := f.saved.Before(before)
		f.mu.Unlock()
		if old {
			delete(fs.m, k)
		}
	}
	fs.n.Store(int64(len(fs.m)))
}

// decide runs Fail with the fleet state f names (locked from read to
// save) and returns its outcome.
func (s *Store) decide(sess *engine.Session, env engine.Env, f engine.Failure) (engine.FailOutcome, error) {
	if f.FleetKey == "" {
		return sess.Fail(env, f, fleet.ProviderState{})
	}
	fl := s.fleets.get(f.FleetKey, true)
	fl.mu.Lock()
	defer fl.mu.Unlock()
	out, err := sess.Fail(env, f, fl.state)
	if err == nil && out.FleetChanged {
		fl.save(f.FleetConfig, out.Fleet, env.Now)
	}
	return out, err
}

// undecided takes a retry the fleet admitted out of its provider's queue
// when the decision that admitted it could not be made durable. The
// failure it counted and the token it took stay spent.
func (s *Store) undecided(f engine.Failure, out engine.FailOutcome, now time.Time) {
	if !out.FleetQueued {
		return
	}
	fl := s.fleets.get(f.FleetKey, true)
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.save(fl.cfg, fleet.Apply(fl.cfg, fl.state, fleet.ReportDropped, now), now)
}

// start runs Start with the fleet state of r's provider, when the store
// keeps one (a provider never protected has none; neither has one whose
// state expired, which would let every retry start anyway).
func (s *Store) start(sess *engine.Session, env engine.Env, r *engine.Retry) engine.StartOutcome {
	fl := s.fleets.get(service.FleetKeyOf(r.SessionID, r.Provider()), false)
	if fl == nil {
		return sess.Start(env, r, nil)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	out := sess.Start(env, r, &engine.Fleet{Config: fl.cfg, State: fl.state})
	if out.FleetChanged {
		fl.save(fl.cfg, out.Fleet, env.Now)
	}
	return out
}

// FleetState implements service.Store.
func (s *Store) FleetState(_ context.Context, key string) (fleet.ProviderState, error) {
	fl := s.fleets.get(key, false)
	if fl == nil {
		return fleet.ProviderState{}, nil
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	st := fl.state
	st.Window = slices.Clone(st.Window) // the caller may change its copy
	return st, nil
}

// UpdateFleet implements service.Store.
func (s *Store) UpdateFleet(_ context.Context, key string, cfg fleet.Config, r fleet.Report, now time.Time) error {
	fl := s.fleets.get(key, true)
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.save(cfg, fleet.Apply(cfg, fl.state, r, now), now)
	return nil
}
