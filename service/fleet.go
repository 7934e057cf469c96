package service

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryd/retryd/config"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxFleetProviders bounds how many (tenant, provider) the service
// protects at once: provider names come from requests, so without a bound
// a caller could have the stores keep states without end. Past it, entries
// idle for idleFleetState are dropped (an idle state is close to a fresh
// one: a refilled budget, an empty window); a provider that still finds no
// room is decided by its policy alone, and that is logged.
const (
	maxFleetProviders = 10_000
	idleFleetState    = 10 * time.Minute
)

// checkFleetStore refuses fleet protection on a store of several
// partitions: each would hold a budget and a circuit of its own per
// provider, so the fleet would retry several budgets' worth and open its
// circuit on a fraction of the evidence — not what the policy file says.
func checkFleetStore(p *config.Policies, b store.Backend) error {
	ps, ok := b.(store.Partitioned)
	if !ok || ps.Partitions() <= 1 || !p.HasFleet() {
		return nil
	}
	return fmt.Errorf("service: the policy file configures fleet protection (fleet:), which keeps one budget and one "+
		"circuit per provider, but the store keeps its state in %d partitions, each with a fleet state of its own; "+
		"use a store of one partition (partitions=1 in the Redis URL) or drop the fleet blocks", ps.Partitions())
}

// FleetKey names a (tenant, provider)'s fleet state in a store.
func FleetKey(tenantID, provider string) string { return tenantID + scopeSeparator + provider }

type fleetKey struct{ tenant, provider string }

// fleetEntry is one protected (tenant, provider): its key in the store
// and its configuration. The state itself lives in the store.
type fleetEntry struct {
	key  string
	cfg  fleet.Config
	used atomic.Int64 // Unix nanoseconds of the last failure or success
}

// fleets is fleet protection as the service sees it: which (tenant,
// provider) the policy file protects (see config.Policies' Fleet), and
// under which key the store keeps its state. The state is the store's:
// FailedStep, a due retry's start and a queued retry's cancellation read
// and save it in the session's own transaction (package store), and a
// success goes through the store's UpdateFleet.
type fleets struct {
	policies *config.Policies
	store    *store.Store
	log      *slog.Logger

	mu      sync.RWMutex // entries are read on every protected failure, added rarely
	entries map[fleetKey]*fleetEntry
}

func newFleets(p *config.Policies, st *store.Store, log *slog.Logger) *fleets {
	return &fleets{policies: p, store: st, log: log, entries: map[fleetKey]*fleetEntry{}}
}

// entry returns the entry of (tenant, provider), creating it; nil when the
// provider is not protected or no room is left.
func (fs *fleets) entry(tenantID, provider string, now time.Time) *fleetEntry {
	cfg, ok := fs.policies.Fleet(provider)
	if !ok {
		return nil
	}
	k := fleetKey{tenantID, provider}
	fs.mu.RLock()
	e := fs.entries[k]
	fs.mu.RUnlock()
	if e == nil {
		e = fs.add(k, cfg, now)
	}
	if e != nil {
		e.used.Store(now.UnixNano())
	}
	return e
}

// add adds the entry of k, unless another call added it meanwhile or no
// room is left.
func (fs *fleets) add(k fleetKey, cfg fleet.Config, now time.Time) *fleetEntry {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if e := fs.entries[k]; e != nil {
		return e
	}
	if len(fs.entries) >= maxFleetProviders {
		fs.sweep(now)
		if len(fs.entries) >= maxFleetProviders {
			fs.log.Warn("fleet protection is tracking too many providers; this one is decided by its policy alone",
				"tenant", k.tenant, "provider", k.provider, "limit", maxFleetProviders)
			return nil
		}
	}
	e := &fleetEntry{key: FleetKey(k.tenant, k.provider), cfg: cfg}
	fs.entries[k] = e
	return e
}

// sweep drops idle entries; fs.mu is held. An entry holds no state, only
// the key and configuration, so one dropped while its retries are queued
// loses nothing: their start and cancellation find the state by the key
// each retry keeps.
func (fs *fleets) sweep(now time.Time) {
	for k, e := range fs.entries {
		if now.Sub(time.Unix(0, e.used.Load())) > idleFleetState {
			delete(fs.entries, k)
		}
	}
}

// protect puts the fleet protection of f's provider into f (its key in
// the store and its configuration), when the provider is protected.
func (fs *fleets) protect(f *engine.Failure, tenantID string, now time.Time) {
	if fs == nil || f.Policy == nil {
		return
	}
	if e := fs.entry(tenantID, f.Request.GetProvider(), now); e != nil {
		f.Fleet = &engine.Fleet{Key: e.key, Config: e.cfg}
	}
}

// update reports r to the entry's state in the store. A state that cannot
// be updated is logged: a success's credit is best effort, the decision
// itself is not.
func (fs *fleets) update(ctx context.Context, e *fleetEntry, r fleet.Report, now time.Time) {
	if err := fs.store.UpdateFleet(ctx, e.key, e.cfg, r, now); err != nil {
		fs.log.WarnContext(ctx, "fleet state not updated", "key", e.key, "report", r, "err", err)
	}
}

// succeeded credits the provider's budget and window with a success.
func (fs *fleets) succeeded(ctx context.Context, tenantID, provider string, now time.Time) {
	if fs == nil || provider == "" {
		return
	}
	if e := fs.entry(tenantID, provider, now); e != nil {
		fs.update(ctx, e, fleet.ReportSucceeded, now)
	}
}

// snapshot reads (tenant, provider)'s state from the store.
func (fs *fleets) snapshot(ctx context.Context, tenantID, provider string, now time.Time) (fleet.Snapshot, bool, error) {
	cfg, ok := fs.policies.Fleet(provider)
	if !ok {
		return fleet.Snapshot{}, false, nil
	}
	st, err := fs.store.FleetState(ctx, FleetKey(tenantID, provider))
	if err != nil {
		return fleet.Snapshot{}, true, err
	}
	return st.Snapshot(cfg, now), true, nil
}

// GetProviderState implements RetryService.GetProviderState.
func (s *Service) GetProviderState(ctx context.Context, req *retrydv1.GetProviderStateRequest) (*retrydv1.GetProviderStateResponse, error) {
	var v validator
	if req.GetProvider() == "" {
		v.add("provider", "required")
	} else {
		v.label("provider", req.GetProvider(), true)
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	now := s.now()
	tenantID, _ := SplitSessionID(scopeOf(ctx))
	resp := &retrydv1.GetProviderStateResponse{Provider: req.GetProvider()}
	snap, ok, err := s.fleets.snapshot(ctx, tenantID, req.GetProvider(), now)
	if err != nil {
		return nil, toStatus(err)
	}
	if !ok {
		return resp, nil
	}
	resp.Protected = true
	resp.BudgetTokens, resp.BudgetCapacity = snap.Tokens, snap.Capacity
	resp.FailureRate, resp.WindowSamples = snap.FailureRate, uint32(min(snap.Failures+snap.Successes, 1<<32-1))
	resp.Circuit = circuitOf(snap.Circuit)
	if snap.Circuit == fleet.Open {
		resp.OpenUntil = timestamppb.New(snap.OpenUntil)
	}
	if snap.EarliestStart.After(now) {
		resp.EarliestStart = timestamppb.New(snap.EarliestStart)
	}
	resp.QueuedRetries = uint32(min(snap.Queued, 1<<32-1))
	return resp, nil
}

func circuitOf(c fleet.Circuit) retrydv1.CircuitState {
	switch c {
	case fleet.Open:
		return retrydv1.CircuitState_CIRCUIT_STATE_OPEN
	case fleet.HalfOpen:
		return retrydv1.CircuitState_CIRCUIT_STATE_HALF_OPEN
	}
	return retrydv1.CircuitState_CIRCUIT_STATE_CLOSED
}
