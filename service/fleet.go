package service

import (
	"context"
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

type fleetKey struct{ tenant, provider string }

// fleetEntry is one (tenant, provider)'s fleet state and its own lock, so
// that providers never wait for each other.
type fleetEntry struct {
	mu    sync.Mutex
	cfg   fleet.Config
	state fleet.ProviderState
	rng   *rand.Rand
	used  time.Time
}

// fleets keeps the fleet protection state of this process: per tenant and
// provider, for providers the policy file protects (see config.Policies'
// Fleet). It also remembers which provider each admitted, still pending
// retry belongs to, so that its start or cancellation (seen in the event
// log) leaves the provider's queue.
type fleets struct {
	policies *config.Policies
	warn     func(msg string, args ...any)

	mu      sync.Mutex
	entries map[fleetKey]*fleetEntry
	queued  map[string]*fleetEntry // retry id → its provider's entry
}

func newFleets(p *config.Policies, warn func(string, ...any)) *fleets {
	return &fleets{policies: p, warn: warn, entries: map[fleetKey]*fleetEntry{}, queued: map[string]*fleetEntry{}}
}

// entry returns the state of (tenant, provider), creating it; nil when the
// provider is not protected or no room is left.
func (fs *fleets) entry(tenantID, provider string, now time.Time) *fleetEntry {
	cfg, ok := fs.policies.Fleet(provider)
	if !ok {
		return nil
	}
	k := fleetKey{tenantID, provider}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if e := fs.entries[k]; e != nil {
		return e
	}
	if len(fs.entries) >= maxFleetProviders {
		fs.sweep(now)
		if len(fs.entries) >= maxFleetProviders {
			fs.warn("fleet protection is tracking too many providers; this one is decided by its policy alone",
				"tenant", tenantID, "provider", provider, "limit", maxFleetProviders)
			return nil
		}
	}
	e := &fleetEntry{cfg: cfg, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), used: now}
	fs.entries[k] = e
	return e
}

// sweep drops idle states with nothing queued; fs.mu is held.
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

// hook returns the engine's view of the provider's fleet state for one
// failure, or nil when the provider is not protected.
func (fs *fleets) hook(tenantID, provider string, now time.Time) *fleetHook {
	if fs == nil {
		return nil
	}
	if e := fs.entry(tenantID, provider, now); e != nil {
		return &fleetHook{entry: e}
	}
	return nil
}

// fleetHook implements engine.FleetHook for one failure.
type fleetHook struct {
	entry *fleetEntry
	// admitted is set when the fleet let a retry through: it is queued
	// until the event log shows it started or cancelled.
	admitted bool
}

var _ engine.FleetHook = (*fleetHook)(nil)

// Decided records the failure with the provider and puts a scheduled retry
// to the fleet: it may be delegated (normal mode) or start later.
func (h *fleetHook) Decided(p *policy.Policy, a policy.Attempt, d policy.Decision, now time.Time) policy.Decision {
	e := h.entry
	e.mu.Lock()
	defer e.mu.Unlock()
	e.used = now
	// Always mode reports one provider failure twice (downstream first,
	// then declined): count it once. In a half-open round every report is
	// taken as a probe's outcome: first attempts are never held, so they
	// are as good evidence of the provider's health as the probes.
	if fleet.ProviderFault(a.Code) && a.Downstream != retrydv1.Downstream_DOWNSTREAM_DECLINED {
		e.state.Failed(e.cfg, now, fleet.Failure{Probe: true, RetryAfter: fleet.RetryAfterOf(a.RetryAfter)})
	}
	if !d.Schedule {
		return d
	}
	v := e.state.Admit(e.cfg, now, fleet.RetryOf(p, d, a), e.rng)
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

// scheduled remembers the provider of a retry the fleet admitted. A retry
// that was admitted but not recorded (the store refused the change) leaves
// the queue at once.
func (fs *fleets) scheduled(h *fleetHook, out engine.FailOutcome, err error, now time.Time) {
	if h == nil || !h.admitted {
		return
	}
	if err != nil || out.Scheduled == nil {
		h.entry.mu.Lock()
		h.entry.state.Dropped(h.entry.cfg, now)
		h.entry.mu.Unlock()
		return
	}
	fs.mu.Lock()
	fs.queued[out.Scheduled.ID] = h.entry
	fs.mu.Unlock()
}

// settled takes a started or cancelled retry out of its provider's queue.
func (fs *fleets) settled(retryID string, now time.Time) {
	if fs == nil {
		return
	}
	fs.mu.Lock()
	e := fs.queued[retryID]
	delete(fs.queued, retryID)
	fs.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		e.state.Dropped(e.cfg, now)
		e.mu.Unlock()
	}
}

// succeeded credits the provider's budget and window with a success.
func (fs *fleets) succeeded(tenantID, provider string, now time.Time) {
	if fs == nil || provider == "" {
		return
	}
	if e := fs.entry(tenantID, provider, now); e != nil {
		e.mu.Lock()
		e.used = now
		e.state.Succeeded(e.cfg, now, fleet.Success{Probe: true})
		e.mu.Unlock()
	}
}

// snapshot reads (tenant, provider)'s state without creating it.
func (fs *fleets) snapshot(tenantID, provider string, now time.Time) (fleet.Snapshot, bool) {
	cfg, ok := fs.policies.Fleet(provider)
	if !ok {
		return fleet.Snapshot{}, false
	}
	fs.mu.Lock()
	e := fs.entries[fleetKey{tenantID, provider}]
	fs.mu.Unlock()
	if e == nil {
		return fleet.ProviderState{}.Snapshot(cfg, now), true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state.Snapshot(e.cfg, now), true
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
	snap, ok := s.fleets.snapshot(tenantID, req.GetProvider(), now)
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
