package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/fleet"
	"github.com/retryd/retryd/service"
)

// Fleet protection state (one fleet.ProviderState per tenant and
// provider, as JSON) lives in retryd:fleet:KEY, so every replica decides
// with one budget and one circuit per provider. FailedStep reads and saves
// it in the session's own commit, which checks it: a decision and
// the budget token it took are committed together or not at all. In the
// single layout the key has no hash tag; in the partitioned layout it is a
// partition's key, so that it shares the session's slot: each partition
// then holds a state of its own. With more than one partition that splits
// a provider's budget and circuit, so the server refuses fleet protection
// there (see Store.Partitions); with one partition there is one state.

var _ service.SharedFleet = (*Store)(nil)

// fleetTTL is how long an untouched fleet state is kept. By then a budget
// has refilled and a window is empty: a new state is as good.
const fleetTTL = time.Hour

// decodeFleet reads a stored state; a missing key is the fresh state.
func decodeFleet(cmd *redis.StringCmd) (*fleet.ProviderState, error) {
	st := &fleet.ProviderState{}
	b, err := cmd.Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return st, nil
	case err != nil:
		return nil, unavailable("reading fleet state", err)
	}
	return decodeFleetJSON(b), nil
}

// decodeFleetJSON decodes a stored state; empty is the fresh state.
func decodeFleetJSON(b []byte) *fleet.ProviderState {
	st := &fleet.ProviderState{}
	if len(b) == 0 {
		return st
	}
	if err := json.Unmarshal(b, st); err != nil {
		// Damaged state is replaced by a fresh one rather than blocking
		// every decision of the provider: it only ever protects.
		return &fleet.ProviderState{}
	}
	return st
}

// recallFleets returns the fleet states a group's failures decide with, as
// this replica knows them, and adds their checks to c.
func (s *Store) recallFleets(c *commit, part int, keys []string) map[string]*fleet.ProviderState {
	if len(keys) == 0 {
		return nil
	}
	out := make(map[string]*fleet.ProviderState, len(keys))
	for _, k := range keys {
		s.recallFleet(c, part, out, k)
	}
	return out
}

// writeFleets adds the group's fleet states to its commit.
func (s *Store) writeFleets(ctx context.Context, p *commit, part int, states map[string]*fleet.ProviderState) error {
	for k, st := range states {
		b, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("redis store: encoding fleet state: %w", err)
		}
		p.Set(ctx, s.keys.fleetKey(part, k), b, fleetTTL)
	}
	return nil
}

// FleetState implements service.SharedFleet.
func (s *Store) FleetState(ctx context.Context, key string) (fleet.ProviderState, error) {
	st, err := decodeFleet(s.rdb.Get(ctx, s.keys.fleetKey(0, key)))
	if err != nil {
		return fleet.ProviderState{}, err
	}
	return *st, nil
}

// UpdateFleet implements service.SharedFleet: an optimistic transaction on
// the one key, run again when a decision or another replica changed it
// meanwhile.
func (s *Store) UpdateFleet(ctx context.Context, key string, fn func(*fleet.ProviderState)) error {
	k := s.keys.fleetKey(0, key)
	for range maxAttempts {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			st, err := decodeFleet(tx.Get(ctx, k))
			if err != nil {
				return err
			}
			fn(st)
			b, err := json.Marshal(st)
			if err != nil {
				return fmt.Errorf("redis store: encoding fleet state: %w", err)
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, k, b, fleetTTL)
				return nil
			})
			return err
		}, k)
		if !errors.Is(err, redis.TxFailedErr) {
			if err != nil && !errors.Is(err, service.ErrUnavailable) {
				return unavailable("updating fleet state", err)
			}
			return err
		}
	}
	return fmt.Errorf("redis store: fleet state %q: %d transactions lost to concurrent writers: %w", key, maxAttempts, service.ErrUnavailable)
}

var _ service.GatedStore = (*Store)(nil)

// SetStartGate implements service.GatedStore: a due retry starts only if
// the gate, deciding on the fleet state read in the same transaction,
// lets it.
func (s *Store) SetStartGate(g service.StartGate) { s.gate.Store(&g) }

// recallFleet returns a fleet state as this replica knows it (one the
// group needs, or a due retry's provider's for the start gate), and adds
// its check to c, once per key.
func (s *Store) recallFleet(c *commit, part int, states map[string]*fleet.ProviderState, key string) *fleet.ProviderState {
	if st := states[key]; st != nil {
		return st
	}
	k := s.keys.fleetKey(part, key)
	raw := s.known.get(k).raw
	c.checkValue(k, raw)
	st := decodeFleetJSON([]byte(raw))
	states[key] = st
	return st
}
