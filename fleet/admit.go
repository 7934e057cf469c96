package fleet

import (
	"fmt"
	"time"
)

// Source says which rule set a retry's start time: the policy, or one of the
// fleet's. The service maps it onto the decision's delay_source.
type Source int32

// The delay sources.
const (
	// SourcePolicy: the fleet did not move the retry; the policy's own
	// delay and delay source stand.
	SourcePolicy Source = iota
	// SourceBudget: the retry budget was empty and the retry waits for the
	// next token (budget pacing).
	SourceBudget
	// SourceCircuit: the provider's circuit is open or half-open and the
	// retry waits behind it.
	SourceCircuit
	// SourcePacing: another agent's provider Retry-After holds the whole
	// fleet (provider pacing).
	SourcePacing
)

func (s Source) String() string {
	switch s {
	case SourcePolicy:
		return "policy"
	case SourceBudget:
		return "fleet_budget_pacing"
	case SourceCircuit:
		return "fleet_circuit_open"
	case SourcePacing:
		return "fleet_provider_pacing"
	}
	return "unknown"
}

// Reason says why the fleet delegated a retry the policy had scheduled. The
// service maps it onto the decision's delegate reason.
type Reason int32

// The delegate reasons.
const (
	// ReasonNone: not delegated.
	ReasonNone Reason = iota
	// ReasonBudgetExhausted: the budget was empty and the policy may end
	// (normal mode).
	ReasonBudgetExhausted
	// ReasonCircuitOpen: the circuit holds retries back past the policy's
	// cap or the deadline, and the policy may end (normal mode).
	ReasonCircuitOpen
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonBudgetExhausted:
		return "fleet_budget_exhausted"
	case ReasonCircuitOpen:
		return "fleet_circuit_open"
	}
	return "unknown"
}

// Retry is a retry the policy scheduled, as Admit needs it (RetryOf builds
// it from a policy decision).
type Retry struct {
	// Delay is the policy's delay.
	Delay time.Duration
	// Cap is the policy's delay cap (policy.DelayCapMs): the fleet never
	// delays a retry beyond it (or beyond the policy's own delay, when that
	// is longer).
	Cap time.Duration
	// Latest, when HasLatest, is the latest start that still leaves the
	// operation a useful attempt: its deadline less the policy's minimum
	// attempt time.
	Latest    time.Time
	HasLatest bool
	// MustNotEnd is set for the policies that never terminate on a fleet
	// limit (always and schedule modes): an empty budget or an open
	// circuit delays them, to the cap at most, instead of delegating.
	MustNotEnd bool
}

// limit is the latest start the fleet may move this retry to.
func (r Retry) limit(now time.Time) time.Time {
	own := now.Add(r.Delay)
	l := now.Add(r.Cap)
	if r.HasLatest && r.Latest.Before(l) {
		l = r.Latest
	}
	return laterOf(l, own)
}

// Verdict is the fleet's answer for one retry: delegate with a reason, or
// schedule after Delay.
type Verdict struct {
	// Delegate: do not retry here; Reason says why.
	Delegate bool
	Reason   Reason
	// Delay is the wait until the retry may start, when not delegated.
	Delay time.Duration
	// Source says which rule set Delay; SourcePolicy keeps the policy's.
	Source Source
	// Detail explains the verdict to a human: the fleet rule that applied,
	// with its numbers. Empty when the fleet changed nothing.
	Detail string
	// Probe is set when the retry is scheduled as one of the half-open
	// probes of the provider's circuit (Start confirms it).
	Probe bool
	// Token is set when the retry took a budget token (or reserved the
	// next one). A paced retry whose token lies beyond its cap starts
	// shortly before the cap without one.
	Token bool
}

// Admit decides one retry the policy scheduled: call it after Failed for the
// same failure, and only when the policy scheduled. It applies, in order,
// the circuit (hold behind an open provider, or delegate a normal-mode
// retry it would hold past its cap), the budget (take a token; delegate a
// normal-mode retry when empty, pace the others to the next token) and the
// fleet-wide Retry-After. The latest of their start times wins, bounded by
// the policy's cap and the deadline; a retry moved to that bound is spread
// over the SpreadWindow before it, not after the policy's own delay, so
// retries paced to the cap together do not stay in step. A delegated retry
// leaves the state as it was (brought up to now: refilled, an ended open
// period turned half-open).
func (s *ProviderState) Admit(cfg Config, now time.Time, r Retry, rng Rand) Verdict {
	s.advance(cfg, now)
	next := *s
	v, admitted := next.admit(cfg, now, r, rng)
	if admitted {
		next.Queued++
		*s = next
	}
	return v
}

// admit works on a copy of the state, kept only when the retry is admitted.
func (s *ProviderState) admit(cfg Config, now time.Time, r Retry, rng Rand) (Verdict, bool) {
	limit := r.limit(now)
	p := proposal{at: now.Add(r.Delay), source: SourcePolicy}

	h := s.circuitHold(cfg, now, rng)
	if h.held && h.at.After(limit) && !r.MustNotEnd {
		return delegate(ReasonCircuitOpen, "%s; that is past the policy's cap of %s or the deadline",
			h.detail, r.Cap), false
	}
	if h.held {
		p.raise(h.at, SourceCircuit, h.detail)
	}
	token, ok := s.budget(cfg, now, r, limit, &p)
	if !ok {
		return delegate(ReasonBudgetExhausted,
			"retry budget exhausted: %.2f of %g tokens (refill %g/s, %g per success)",
			max(s.Tokens, 0), cfg.Capacity, cfg.RefillPerSecond, cfg.SuccessCredit), false
	}
	s.pacing(cfg, rng, &p)
	if p.at.After(limit) || p.atLimit {
		own := now.Add(r.Delay)
		p.at = laterOf(limit.Add(-s.spreadOffset(min(cfg.SpreadWindow, limit.Sub(own)), rng)), own)
		p.detail += fmt.Sprintf("; bounded by the policy's cap of %s or the deadline: starts at %s", r.Cap, stamp(p.at))
	}
	v := Verdict{Delay: p.at.Sub(now), Source: p.source, Detail: p.detail, Probe: h.probe, Token: token}
	if p.source == SourcePolicy {
		v.Delay = r.Delay
	}
	if v.Detail == "" && h.probe {
		v.Detail = h.detail // the policy's delay stands, but the retry is a probe
	}
	return v, true
}

// budget takes the retry's token. An empty budget delegates a retry that may
// end (ok false); one that must not end reserves the next token and waits
// for it, or, when that token lies beyond the limit, starts at the limit
// without one.
func (s *ProviderState) budget(cfg Config, now time.Time, r Retry, limit time.Time, p *proposal) (token, ok bool) {
	if cfg.DisableBudget {
		return false, true
	}
	wait, refills := s.tokenWait(cfg)
	switch {
	case refills && wait == 0:
		s.Tokens--
		return true, true
	case !r.MustNotEnd:
		return false, false
	case refills && !now.Add(wait).After(limit):
		s.Tokens--
		p.raise(now.Add(wait), SourceBudget, fmt.Sprintf(
			"retry budget empty: paced to the next token at %s (refill %g/s)", stamp(now.Add(wait)), cfg.RefillPerSecond))
		return true, true
	default:
		p.raise(limit, SourceBudget, fmt.Sprintf(
			"retry budget empty and no token before %s: starts without one", stamp(limit)))
		p.atLimit = p.source == SourceBudget
		return false, true
	}
}

// pacing holds the retry until the fleet-wide Retry-After ends, spread over
// SpreadWindow after it.
func (s *ProviderState) pacing(cfg Config, rng Rand, p *proposal) {
	if cfg.MaxFleetRetryAfter <= 0 || !s.PacedUntil.After(p.at) {
		return
	}
	at := s.PacedUntil.Add(s.spreadOffset(cfg.SpreadWindow, rng))
	p.raise(at, SourcePacing, fmt.Sprintf(
		"the provider asked the fleet to wait until %s (Retry-After): spread to %s", stamp(s.PacedUntil), stamp(at)))
}

// proposal is the start time being decided and the rule that set it.
type proposal struct {
	at     time.Time
	source Source
	detail string
	// atLimit: the start is the limit itself, not a time a rule asked for.
	atLimit bool
}

// raise moves the start later when at is later, crediting the rule.
func (p *proposal) raise(at time.Time, source Source, detail string) {
	if at.After(p.at) {
		p.at, p.source, p.detail = at, source, detail
	}
}

func delegate(reason Reason, format string, args ...any) Verdict {
	return Verdict{Delegate: true, Reason: reason, Detail: fmt.Sprintf(format, args...)}
}
