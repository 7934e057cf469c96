package fleet

import (
	"slices"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
)

// The two transitions a store runs with the session it commits them with:
// Decide when a failure is decided, StartDue when a scheduled retry falls
// due. Both take the state the store read and return the state to save, and
// leave the state given untouched: a store that runs a transition again
// (its transaction lost a race) runs it on what it reads again.

// Decision is fleet protection's part of deciding one failure.
type Decision struct {
	// Decision is the decision to apply: the policy's, delegated (normal
	// mode on an empty budget or behind an open circuit) or with a later
	// start.
	Decision policy.Decision
	// State is the provider's state after the failure and the decision.
	State ProviderState
	// Queued is set when a scheduled retry was admitted: the state counts
	// it queued until it starts (StartDue) or is dropped (Dropped).
	Queued bool
}

// Decide applies fleet protection to the decision d that policy p made for
// attempt a: the failure counts in the provider's window (once per failed
// request, and only a ProviderFault), and a scheduled retry goes through
// Admit. In a half-open round every report counts as a probe's outcome:
// first attempts are never held, so they are as good evidence of the
// provider's health as the probes.
func Decide(cfg Config, state ProviderState, p *policy.Policy, a policy.Attempt, d policy.Decision,
	now time.Time, rng Rand) Decision {
	state.Window = slices.Clone(state.Window) // Failed writes into it: the caller's stays as it was
	// Always mode reports one provider failure twice (downstream first,
	// then declined): count it once.
	if ProviderFault(a.Code) && a.Downstream != retrydv1.Downstream_DOWNSTREAM_DECLINED {
		state.Failed(cfg, now, Failure{Probe: true, RetryAfter: RetryAfterOf(a.RetryAfter)})
	}
	if !d.Schedule {
		return Decision{Decision: d, State: state}
	}
	v := state.Admit(cfg, now, RetryOf(p, d, a), rng)
	if v.Delegate {
		reason := retrydv1.DelegateReason_DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED
		if v.Reason == ReasonCircuitOpen {
			reason = retrydv1.DelegateReason_DELEGATE_REASON_FLEET_CIRCUIT_OPEN
		}
		return Decision{Decision: policy.Decision{Reason: reason, Detail: v.Detail}, State: state}
	}
	if v.Source != SourcePolicy {
		d.DelayMs = uint64(v.Delay / time.Millisecond)
		d.Source = v.Source.DelaySource()
		d.Detail = v.Detail
	}
	return Decision{Decision: d, State: state, Queued: true}
}

// StartDue is Start for a retry that fell due, on a copy of state: whether
// it starts now or is held (until when), and the state to save. The
// retry's deadline is not asked: a held retry waits, and its agent's own
// deadline ends the wait (it cancels, or abandons the retry).
func StartDue(cfg Config, state ProviderState, now time.Time, rng Rand) (v StartVerdict, next ProviderState) {
	state.Window = slices.Clone(state.Window)
	v = state.Start(cfg, now, Pending{}, rng)
	return v, state
}

// DelaySource is the API's delay source for a start the fleet moved.
func (s Source) DelaySource() retrydv1.DelaySource {
	switch s {
	case SourceBudget:
		return retrydv1.DelaySource_DELAY_SOURCE_FLEET_BUDGET
	case SourceCircuit:
		return retrydv1.DelaySource_DELAY_SOURCE_CIRCUIT_OPEN
	case SourcePacing:
		return retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_PACING
	}
	return retrydv1.DelaySource_DELAY_SOURCE_UNSPECIFIED
}

// Report is what a provider's state learns outside a failure's decision
// and a retry's start.
type Report int32

// The reports.
const (
	// ReportSucceeded: a step succeeded (StepSucceeded). In a half-open
	// round it counts as a probe's outcome, as every failure does.
	ReportSucceeded Report = iota + 1
	// ReportDropped: a retry the fleet admitted was cancelled before it
	// started.
	ReportDropped
)

func (r Report) String() string {
	switch r {
	case ReportSucceeded:
		return "succeeded"
	case ReportDropped:
		return "dropped"
	}
	return "unknown"
}

// Apply applies report r at now to a copy of state and returns it.
func Apply(cfg Config, state ProviderState, r Report, now time.Time) ProviderState {
	state.Window = slices.Clone(state.Window)
	switch r {
	case ReportSucceeded:
		state.Succeeded(cfg, now, Success{Probe: true})
	case ReportDropped:
		state.Dropped(cfg, now)
	}
	return state
}
