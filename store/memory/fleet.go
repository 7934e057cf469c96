package memory

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
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

// fleetState is one key's state.
type fleetState struct {
	mu    sync.Mutex
	cfg   fleet.Config
	kept  bool // cfg is the configuration the state was last decided with
	state fleet.ProviderState
	saved time.Time
}

// save keeps the state a transition returned; f.mu is held.
func (f *fleetState) save(cfg fleet.Config, st fleet.ProviderState, now time.Time) {
	f.cfg, f.kept, f.state, f.saved = cfg, true, st, now
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

// fleetLocks are the fleet states a transaction read, locked until the
// rule's transition returns (fleetLocks.unlock), before the durable write;
// queued are those whose save added a queued retry.
type fleetLocks struct {
	held   []*fleetState
	queued []*fleetState
}

// lock returns f locked for the transaction, locking it once.
func (l *fleetLocks) lock(f *fleetState) {
	for _, h := range l.held {
		if h == f {
			return
		}
	}
	f.mu.Lock()
	l.held = append(l.held, f)
}

func (l *fleetLocks) unlock() {
	for _, f := range l.held {
		f.mu.Unlock()
	}
	l.held = nil
}

// undoQueued takes the retries the transaction queued out of their
// provider's queue again: its change was not made durable. The failure it
// counted and the token it took stay spent.
func (l *fleetLocks) undoQueued(now time.Time) {
	for _, f := range l.queued {
		f.mu.Lock()
		f.save(f.cfg, fleet.Apply(f.cfg, f.state, fleet.ReportDropped, now), now)
		f.mu.Unlock()
	}
}

// Fleet implements store.Txn: the state is locked until the transition
// returns (the order is always shard, then state).
func (t *txn) Fleet(key string) (engine.Fleet, bool) {
	f := t.s.fleets.get(key, true)
	t.fleets.lock(f)
	st := f.state
	st.Window = slices.Clone(st.Window) // the engine's copy
	return engine.Fleet{Key: key, Config: f.cfg, State: st}, f.kept
}

// SaveFleet implements store.Txn.
func (t *txn) SaveFleet(fl engine.Fleet) {
	f := t.s.fleets.get(fl.Key, true)
	t.fleets.lock(f)
	if fl.State.Queued > f.state.Queued {
		t.fleets.queued = append(t.fleets.queued, f)
	}
	f.save(fl.Config, fl.State, t.env.Now)
}

// FleetState implements store.Backend.
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

// UpdateFleet implements store.Backend.
func (s *Store) UpdateFleet(_ context.Context, key string, cfg fleet.Config, r fleet.Report, now time.Time) error {
	fl := s.fleets.get(key, true)
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.save(cfg, fleet.Apply(cfg, fl.state, r, now), now)
	return nil
}
