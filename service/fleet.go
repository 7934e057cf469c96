package service

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/retryd/retryd/config"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxFleetProviders bounds how many (tenant, provider) states the service
// keeps: provider names come from requests, so without a bound a caller
// could grow the map without end. Past it, states idle for idleFleetState
// are dropped (an idle state is close to a fresh one: a refilled budget, an
// empty window); a provider that still finds no room is decided by its
// policy alone, and that is logged.
const (
	maxFleetProviders = 10_000
	idleFleetState    = 10 * time.Minute
)

// SharedFleet is implemented by stores whose replicas share one fleet
// state per (tenant, provider) — the Redis store. FailedStep's state is
// read and saved in the session's own transaction (see engine.Failure's
// FleetKey); these are the other operations on it.
type SharedFleet interface {
	// FleetState reads the state under key; a missing one is the zero
	// (fresh) state.
	FleetState(ctx context.Context, key string) (fleet.ProviderState, error)
	// UpdateFleet applies fn to the state under key atomically.
	UpdateFleet(ctx context.Context, key string, fn func(*fleet.ProviderState)) error
}

// Partitioned is implemented by stores that keep their state in
// partitions, each with its own fleet state (the Redis store's
// partitioned key layout, see store/redis/layout.go).
type Partitioned interface {
	// Partitions returns the number of partitions.
	Partitions() int
}

// checkFleetStore refuses fleet protection on a store of several
// partitions: each would hold a budget and a circuit of its own per
// provider, so the fleet would retry several budgets' worth and open its
// circuit on a fraction of the evidence — not what the policy file says.
func checkFleetStore(p *config.Policies, store Store) error {
	ps, ok := store.(Partitioned)
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

// fleetEntry is one (tenant, provider)'s fleet state and its own lock, so
// that providers never wait for each other. With a SharedFleet store it
// holds only the configuration: the state lives in the store.
type fleetEntry struct {
	mu    sync.Mutex
	key   string
	cfg   fleet.Config
	state fleet.ProviderState
	rng   *rand.Rand
	used  time.Time
}

// fleets keeps fleet protection: per tenant and provider, for providers
// the policy file protects (see config.Policies' Fleet) — in this process,
// or in the store when it is a SharedFleet. It also remembers which
// provider each retry it admitted belongs to, so that the retry's start or
// cancellation (seen in the event log) takes it out of the provider's
// queue.
type fleets struct {
	policies *config.Policies
	shared   SharedFleet // nil: the state is kept here
	now      func() time.Time
	log      *slog.Logger

	mu      sync.RWMutex // entries are read on every protected failure, added rarely
	entries map[fleetKey]*fleetEntry
	queued  map[string]*fleetEntry // retry id → its provider's entry
}

func newFleets(p *config.Policies, store Store, now func() time.Time, log *slog.Logger) *fleets {
	fs := &fleets{policies: p, now: now, log: log, entries: map[fleetKey]*fleetEntry{}, queued: map[string]*fleetEntry{}}
	fs.shared, _ = store.(SharedFleet)
	return fs
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
	if e != nil {
		return e
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if e := fs.entries[k]; e != nil {
		return e // another call added it meanwhile
	}
	if len(fs.entries) >= maxFleetProviders {
		fs.sweep(now)
		if len(fs.entries) >= maxFleetProviders {
			fs.log.Warn("fleet protection is tracking too many providers; this one is decided by its policy alone",
				"tenant", tenantID, "provider", provider, "limit", maxFleetProviders)
			return nil
		}
	}
	e = &fleetEntry{key: FleetKey(tenantID, provider), cfg: cfg,
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), used: now}
	fs.entries[k] = e
	return e
}

// sweep drops idle entries with nothing queued; fs.mu is held.
func (fs *fleets) sweep(now time.Time) {
	for k, e := range fs.entries {
		e.mu.Lock()
		idle := now.Sub(e.used) > idleFleetState && e.state.Queued == 0
		e.mu.Unlock()
		if idle {
			delete(fs.entries, k)
		}
	}
}

// hook prepares fleet protection for one failure: it puts the hook into f
// (with f's FleetKey when the store keeps the state) and returns it, or
// returns nil when the provider is not protected.
func (fs *fleets) hook(f *engine.Failure, tenantID string, now time.Time) *fleetHook {
	if fs == nil || f.Policy == nil {
		return nil
	}
	e := fs.entry(tenantID, f.Request.GetProvider(), now)
	if e == nil {
		return nil
	}
	h := &fleetHook{entry: e}
	f.Fleet = h
	if fs.shared != nil {
		f.FleetKey = e.key
	}
	return h
}

// fleetHook implements engine.FleetHook for one failure.
type fleetHook struct {
	entry *fleetEntry
	// bound is the store's copy of the state (SharedFleet), which the
	// store's transaction serialises; nil: the entry's own, under its lock.
	bound *fleet.ProviderState
	// admitted is set when the fleet let a retry through: it is queued
	// until the event log shows it started or cancelled.
	admitted bool
}

var _ engine.FleetHook = (*fleetHook)(nil)

// Bind implements engine.FleetHook. A store may run a transition again
// (its transaction lost a race): each run starts from its fresh copy.
func (h *fleetHook) Bind(state *fleet.ProviderState) { h.bound, h.admitted = state, false }

// Decided records the failure with the provider and puts a scheduled retry
// to the fleet: it may be delegated (normal mode) or start later.
func (h *fleetHook) Decided(p *policy.Policy, a policy.Attempt, d policy.Decision, now time.Time) policy.Decision {
	e := h.entry
	e.mu.Lock()
	defer e.mu.Unlock()
	e.used = now
	state := &e.state
	if h.bound != nil {
		state = h.bound
	}
	// Always mode reports one provider failure twice (downstream first,
	// then declined): count it once. In a half-open round every report is
	// taken as a probe's outcome: first attempts are never held, so they
	// are as good evidence of the provider's health as the probes.
	if fleet.ProviderFault(a.Code) && a.Downstream != retrydv1.Downstream_DOWNSTREAM_DECLINED {
		state.Failed(e.cfg, now, fleet.Failure{Probe: true, RetryAfter: fleet.RetryAfterOf(a.RetryAfter)})
	}
	if !d.Schedule {
		return d
	}
	v := state.Admit(e.cfg, now, fleet.RetryOf(p, d, a), e.rng)
	if v.Delegate {
		reason := retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED
		if v.Reason == fleet.ReasonCircuitOpen {
			reason = retrydv1.DelegateReason_DELEGATE_REASON_FLEET_CIRCUIT_OPEN
		}
		return policy.Decision{Reason: reason, Detail: v.Detail}
	}
	h.admitted = true
	if v.Source != fleet.SourcePolicy {
		d.DelayMs = uint64(v.Delay / time.Millisecond)
		d.Source = delaySourceOf(v.Source)
		d.Detail = v.Detail
	}
	return d
}

func delaySourceOf(s fleet.Source) retrydv1.DelaySource {
	switch s {
	case fleet.SourceBudget:
		return retrydv1.DelaySource_DELAY_SOURCE_FLEET_BUDGET
	case fleet.SourceCircuit:
		return retrydv1.DelaySource_DELAY_SOURCE_CIRCUIT_OPEN
	case fleet.SourcePacing:
		return retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_PACING
	}
	return retrydv1.DelaySource_DELAY_SOURCE_UNSPECIFIED
}

// update applies fn to the entry's state, wherever it lives. A shared
// state that cannot be updated is logged: the operations that use this
// (successes, queue accounting) are best effort, the decision itself is
// not.
func (fs *fleets) update(ctx context.Context, e *fleetEntry, now time.Time, fn func(*fleet.ProviderState)) {
	e.mu.Lock()
	e.used = now
	if fs.shared == nil {
		fn(&e.state)
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	if err := fs.shared.UpdateFleet(ctx, e.key, fn); err != nil {
		fs.log.WarnContext(ctx, "fleet state not updated", "key", e.key, "err", err)
	}
}

// scheduled remembers the provider of a retry the fleet admitted. A retry
// that was admitted but not recorded (the store refused the change) leaves
// the queue at once — unless the store keeps the state, where a refused
// transition saved nothing.
func (fs *fleets) scheduled(ctx context.Context, h *fleetHook, out engine.FailOutcome, err error, now time.Time) {
	if h == nil || !h.admitted {
		return
	}
	if err != nil || out.Scheduled == nil {
		if fs.shared == nil {
			fs.update(ctx, h.entry, now, func(st *fleet.ProviderState) { st.Dropped(h.entry.cfg, now) })
		}
		return
	}
	fs.mu.Lock()
	fs.queued[out.Scheduled.ID] = h.entry
	fs.mu.Unlock()
}

// settled takes a started or cancelled retry out of its provider's queue.
// A start was counted by the gate (StartGate.Start) already; a cancelled
// retry is known only to the replica that scheduled it, so with shared
// state it is counted once, and a replica that dies leaves its retries
// counted as queued until the state expires.
func (fs *fleets) settled(ctx context.Context, retryID string, started bool, now time.Time) {
	if fs == nil {
		return
	}
	fs.mu.Lock()
	e := fs.queued[retryID]
	delete(fs.queued, retryID)
	fs.mu.Unlock()
	if e != nil && !started {
		fs.update(ctx, e, now, func(st *fleet.ProviderState) { st.Dropped(e.cfg, now) })
	}
}

// Observe is fleet protection's consumer of the event log: a retry that
// started or was cancelled leaves its provider's queue.
func (fs *fleets) Observe(_ context.Context, ev *retrydv1.Event) {
	switch k := ev.GetKind().(type) {
	case *retrydv1.Event_Started:
		fs.settled(context.Background(), k.Started.GetRetryId(), true, fs.now())
	case *retrydv1.Event_Cancelled:
		fs.settled(context.Background(), k.Cancelled.GetRetryId(), false, fs.now())
	}
}

// succeeded credits the provider's budget and window with a success.
func (fs *fleets) succeeded(ctx context.Context, tenantID, provider string, now time.Time) {
	if fs == nil || provider == "" {
		return
	}
	if e := fs.entry(tenantID, provider, now); e != nil {
		fs.update(ctx, e, now, func(st *fleet.ProviderState) { st.Succeeded(e.cfg, now, fleet.Success{Probe: true}) })
	}
}

// snapshot reads (tenant, provider)'s state.
func (fs *fleets) snapshot(ctx context.Context, tenantID, provider string, now time.Time) (fleet.Snapshot, bool, error) {
	cfg, ok := fs.policies.Fleet(provider)
	if !ok {
		return fleet.Snapshot{}, false, nil
	}
	if fs.shared != nil {
		st, err := fs.shared.FleetState(ctx, FleetKey(tenantID, provider))
		if err != nil {
			return fleet.Snapshot{}, true, err
		}
		return st.Snapshot(cfg, now), true, nil
	}
	fs.mu.RLock()
	e := fs.entries[fleetKey{tenantID, provider}]
	fs.mu.RUnlock()
	if e == nil {
		return fleet.ProviderState{}.Snapshot(cfg, now), true, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state.Snapshot(e.cfg, now), true, nil
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

// StartGate is fleet protection asked when a retry falls due: a retry
// admitted before its provider's circuit opened must not start while it is
// open, and while it is half-open only the probes start. Stores that
// implement GatedStore are given one by New.
type StartGate interface {
	// FleetKey returns the key of the fleet state that gates retries of
	// provider in the stored session, and false when the provider is not
	// protected.
	FleetKey(sessionID, provider string) (string, bool)
	// Start asks whether a due retry may start now: held, until when.
	// state is the store's copy of the fleet state (SharedFleet stores,
	// read in the transaction that would start the retry) or nil (the
	// gate keeps it).
	Start(sessionID, provider string, state *fleet.ProviderState, now time.Time) (at time.Time, held bool)
}

// GatedStore is a store that asks a StartGate before a due retry starts.
type GatedStore interface {
	SetStartGate(StartGate)
}

var _ StartGate = (*fleets)(nil)

// FleetKey implements StartGate.
func (fs *fleets) FleetKey(sessionID, provider string) (string, bool) {
	if _, ok := fs.policies.Fleet(provider); !ok {
		return "", false
	}
	tenantID, _ := SplitSessionID(sessionID)
	return FleetKey(tenantID, provider), true
}

// Start implements StartGate.
func (fs *fleets) Start(sessionID, provider string, state *fleet.ProviderState, now time.Time) (time.Time, bool) {
	tenantID, _ := SplitSessionID(sessionID)
	e := fs.entry(tenantID, provider, now)
	if e == nil {
		return time.Time{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.used = now
	if state == nil {
		state = &e.state
	}
	// The deadline is not known here: a held retry waits, and its agent's
	// own deadline ends the wait (it cancels, or abandons the retry).
	v := state.Start(e.cfg, now, fleet.Pending{}, e.rng)
	if v.Action != fleet.StartLater {
		return time.Time{}, false
	}
	return v.At, true
}
