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
	if err := json.Unmarshal(b, st); err != nil {
		// Damaged state is replaced by a fresh one rather than blocking
		// every decision of the provider: it only ever protects.
		return &fleet.ProviderState{}, nil
	}
	return st, nil
}

// loadFleets reads the fleet states a group's failures decide with.
func (s *Store) loadFleets(ctx context.Context, c *commit, part int, keys []string) (map[string]*fleet.ProviderState, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.StringCmd, len(keys))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, s.keys.fleetKey(part, k))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, unavailable("reading fleet state", err)
	}
	out := make(map[string]*fleet.ProviderState, len(keys))
	for i, k := range keys {
		st, err := decodeFleet(cmds[i])
		if err != nil {
			return nil, err
		}
		c.checkValue(s.keys.fleetKey(part, k), cmds[i].Val())
		out[k] = st
	}
	return out, nil
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

// watchFleet reads a fleet state the group did not read up front (a due
// retry's provider), watching its key first so that the transaction fails
// if another replica changes it meanwhile.
func (s *Store) watchFleet(ctx context.Context, c *commit, part int, states map[string]*fleet.ProviderState, key string) (*fleet.ProviderState, error) {
	if st := states[key]; st != nil {
		return st, nil
	}
	k := s.keys.fleetKey(part, key)
	cmd := s.rdb.Get(ctx, k)
	st, err := decodeFleet(cmd)
	if err != nil {
		return nil, err
	}
	c.checkValue(k, cmd.Val())
	states[key] = st
	return st, nil
}
