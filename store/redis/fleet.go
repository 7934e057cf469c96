package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	"github.com/retryd/retryd/store"
)

// Fleet protection state (one fleet.ProviderState per tenant and
// provider, with its configuration, as JSON) lives in retryd:fleet:KEY, so
// every replica decides with one budget and one circuit per provider.
// FailedStep and the start of a due retry read it and save it in the
// session's own commit, which checks it: a decision and the budget token
// it took are committed together or not at all. In the
// single layout the key has no hash tag; in the partitioned layout it is a
// partition's key, so that it shares the session's slot: each partition
// then holds a state of its own. With more than one partition that splits
// a provider's budget and circuit, so the server refuses fleet protection
// there (see Store.Partitions); with one partition there is one state.

// fleetRecord is a fleet state as the store keeps it: the state, and the
// configuration it is decided with, which a due retry's start needs
// whichever replica starts it. Its JSON is the state's fields with
// "config" beside them, so a state stored without one still reads (as
// one that protects nothing until its next decision).
type fleetRecord struct {
	fleet.ProviderState
	Config *fleet.Config `json:"config,omitempty"`
}

// decodeFleet reads a stored record; a missing key is the fresh state.
func decodeFleet(cmd *redis.StringCmd) (*fleetRecord, error) {
	b, err := cmd.Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return &fleetRecord{}, nil
	case err != nil:
		return nil, unavailable("reading fleet state", err)
	}
	return decodeFleetJSON(b), nil
}

// decodeFleetJSON decodes a stored record; empty is the fresh state.
func decodeFleetJSON(b []byte) *fleetRecord {
	rec := &fleetRecord{}
	if len(b) == 0 {
		return rec
	}
	if err := json.Unmarshal(b, rec); err != nil {
		// Damaged state is replaced by a fresh one rather than blocking
		// every decision of the provider: it only ever protects.
		return &fleetRecord{}
	}
	return rec
}

// fleetView is the fleet states a group's transitions decide with: each
// read once, as this replica knows it, with a check that the commit still
// finds it so; shared by the group's transitions in their order; and the
// ones they changed written with the group.
type fleetView struct {
	s       *Store
	c       *commit
	part    int
	records map[string]*fleetRecord
	changed map[string]bool
}

func (s *Store) newFleetView(c *commit, part int) *fleetView {
	return &fleetView{s: s, c: c, part: part}
}

// get returns the record under key as the group has it.
func (v *fleetView) get(key string) *fleetRecord {
	if rec := v.records[key]; rec != nil {
		return rec
	}
	k := v.s.keys.fleetKey(v.part, key)
	raw := v.s.known.get(k).raw
	v.c.checkValue(k, raw)
	rec := decodeFleetJSON([]byte(raw))
	if v.records == nil {
		v.records = map[string]*fleetRecord{}
	}
	v.records[key] = rec
	return rec
}

// save keeps the state a transition returned, to be written with the
// group.
func (v *fleetView) save(key string, cfg fleet.Config, st fleet.ProviderState) {
	rec := v.get(key)
	rec.ProviderState, rec.Config = st, &cfg
	if v.changed == nil {
		v.changed = map[string]bool{}
	}
	v.changed[key] = true
}

// write adds the changed states to the group's commit.
func (v *fleetView) write(ctx context.Context) error {
	for key := range v.changed {
		b, err := json.Marshal(v.records[key])
		if err != nil {
			return fmt.Errorf("redis store: encoding fleet state: %w", err)
		}
		v.c.Set(ctx, v.s.keys.fleetKey(v.part, key), b, store.FleetTTL)
	}
	return nil
}

// Fleet implements store.Txn: the state as the group has it.
func (t *txn) Fleet(key string) (engine.Fleet, bool) {
	rec := t.fleets.get(key)
	if rec.Config == nil {
		return engine.Fleet{Key: key, State: rec.ProviderState}, false
	}
	return engine.Fleet{Key: key, Config: *rec.Config, State: rec.ProviderState}, true
}

// SaveFleet implements store.Txn: written with the group.
func (t *txn) SaveFleet(fl engine.Fleet) { t.fleets.save(fl.Key, fl.Config, fl.State) }

// FleetState implements store.Backend.
func (s *Store) FleetState(ctx context.Context, key string) (fleet.ProviderState, error) {
	rec, err := decodeFleet(s.rdb.Get(ctx, s.keys.fleetKey(0, key)))
	if err != nil {
		return fleet.ProviderState{}, err
	}
	return rec.ProviderState, nil
}

// UpdateFleet implements store.Backend: an optimistic transaction on
// the one key, run again when a decision or another replica changed it
// meanwhile.
func (s *Store) UpdateFleet(ctx context.Context, key string, cfg fleet.Config, r fleet.Report, now time.Time) error {
	k := s.keys.fleetKey(0, key)
	for range maxAttempts {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			rec, err := decodeFleet(tx.Get(ctx, k))
			if err != nil {
				return err
			}
			rec.ProviderState, rec.Config = fleet.Apply(cfg, rec.ProviderState, r, now), &cfg
			b, err := json.Marshal(rec)
			if err != nil {
				return fmt.Errorf("redis store: encoding fleet state: %w", err)
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, k, b, store.FleetTTL)
				return nil
			})
			return err
		}, k)
		if !errors.Is(err, redis.TxFailedErr) {
			if err != nil && !errors.Is(err, store.ErrUnavailable) {
				return unavailable("updating fleet state", err)
			}
			return err
		}
	}
	return fmt.Errorf("redis store: fleet state %q: %d transactions lost to concurrent writers: %w", key, maxAttempts, store.ErrUnavailable)
}
