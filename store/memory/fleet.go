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
// it is released. A transaction may look up a state while it holds
// another's lock (SaveFleet, a cancellation over several providers), so
// the map's lock is never held while waiting for a state's: expire takes
// them one after the other.

// fleetState is one key's state.
type fleetState struct {
	key   string
	mu    sync.Mutex
	cfg   fleet.Config
	kept  bool // cfg is the configuration the state was last decided with
	state fleet.ProviderState
	saved time.Time
	// dropped is set, under mu, when expire drops the state: whoever
	// locks it afterwards looks the key up again (lock).
	dropped bool
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
// set; nil when there is none. Use lock to read or change it.
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
		f = &fleetState{key: key}
		fs.m[key] = f
		fs.n.Store(int64(len(fs.m)))
	}
	return f
}

// lock returns the state under key, locked, as get finds or creates it;
// nil when there is none. A state expire dropped between the lookup and
// the lock is taken out of the map (if expire has not yet) and the key
// looked up again.
func (fs *fleetStates) lock(key string, create bool) *fleetState {
	for {
		f := fs.get(key, create)
		if f == nil {
			return nil
		}
		f.mu.Lock()
		if !f.dropped {
			return f
		}
		f.mu.Unlock()
		fs.remove(f)
	}
}

// remove takes a dropped state out of the map, unless a fresh one has
// replaced it already.
func (fs *fleetStates) remove(f *fleetState) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m[f.key] == f {
		delete(fs.m, f.key)
		fs.n.Store(int64(len(fs.m)))
	}
}

// expire drops the states not saved since before. It reads the map, then
// locks each state in turn without the map's lock: holding the map's
// lock while waiting for a state's would deadlock with a transaction that
// holds that state and looks up another key.
func (fs *fleetStates) expire(before time.Time) {
	fs.mu.Lock()
	states := make([]*fleetState, 0, len(fs.m))
	for _, f := range fs.m {
		states = append(states, f)
	}
	fs.mu.Unlock()
	for _, f := range states {
		f.mu.Lock()
		old := f.saved.Before(before)
		if old {
			f.dropped = true
		}
		f.mu.Unlock()
		if old {
			fs.remove(f)
		}
	}
}

// fleetLocks are the fleet states a transaction read, locked until the
// rule's transition returns (fleetLocks.unlock), before the durable write;
// queued are those whose save added a queued retry.
type fleetLocks struct {
	held   []*fleetState
	queued []*fleetState
}

// lock returns the state under key locked for the transaction, creating
// it when there is none, and locking it once: a state the transaction
// holds already is found among the held ones, without the map's lock.
func (l *fleetLocks) lock(fs *fleetStates, key string) *fleetState {
	for _, h := range l.held {
		if h.key == key {
			return h
		}
	}
	f := fs.lock(key, true)
	l.held = append(l.held, f)
	return f
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
	f := t.fleets.lock(&t.s.fleets, key)
	st := f.state
	st.Window = slices.Clone(st.Window) // the engine's copy
	return engine.Fleet{Key: key, Config: f.cfg, State: st}, f.kept
}

// SaveFleet implements store.Txn.
func (t *txn) SaveFleet(fl engine.Fleet) {
	f := t.fleets.lock(&t.s.fleets, fl.Key)
	if fl.State.Queued > f.state.Queued {
		t.fleets.queued = append(t.fleets.queued, f)
	}
	f.save(fl.Config, fl.State, t.env.Now)
}

// FleetState implements store.Backend.
func (s *Store) FleetState(_ context.Context, key string) (fleet.ProviderState, error) {
	fl := s.fleets.lock(key, false)
	if fl == nil {
		return fleet.ProviderState{}, nil
	}
	defer fl.mu.Unlock()
	st := fl.state
	st.Window = slices.Clone(st.Window) // the caller may change its copy
	return st, nil
}

// UpdateFleet implements store.Backend.
func (s *Store) UpdateFleet(_ context.Context, key string, cfg fleet.Config, r fleet.Report, now time.Time) error {
	fl := s.fleets.lock(key, true)
	defer fl.mu.Unlock()
	fl.save(cfg, fleet.Apply(cfg, fl.state, r, now), now)
	return nil
}
