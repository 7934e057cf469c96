package sim

import (
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Decider is what the simulated agents ask: retryd's decision function. The
// in-package Local answers with policy and fleet directly; the real service
// (service.Service over the memory store, on the same injected clock) can
// stand behind it too, which is how the simulation tests the server.
//
// Every call carries the simulated time; a Decider must use it and nothing
// else as its clock.
type Decider interface {
	// FailedStep reports one failed model request (FailedStep RPC).
	FailedStep(now time.Time, f Failure) Decision
	// AwaitStart is asked when a scheduled retry is due and its agent is
	// waiting (AwaitRetry): start now, later, or never.
	AwaitStart(now time.Time, retryID string) Start
	// StepSucceeded reports one successful model request.
	StepSucceeded(now time.Time, s Success)
}

// Failure is one failed model request of an agent.
type Failure struct {
	Session    string
	Turn, Step uint64
	Provider   string
	Policy     *retrydv1.RetryPolicy
	Code       string
	HTTPStatus int32
	// RetryAfterMs is the provider's Retry-After in milliseconds, nil when
	// it sent none.
	RetryAfterMs *int64
	// Downstream is always mode's handshake phase.
	Downstream retrydv1.Downstream
}

// Success is one successful model request of an agent.
type Success struct {
	Session    string
	Turn, Step uint64
	Provider   string
}

// Decision is the answer to a failed step.
type Decision struct {
	// Schedule: wait until DueAt, then AwaitStart RetryID.
	Schedule bool
	RetryID  string
	DueAt    time.Time
	// Source names the rule that set the delay (the policy's delay source,
	// or the fleet's: fleet_budget_pacing, fleet_circuit_open,
	// fleet_provider_pacing).
	Source string
	// Reason names why it was delegated (downstream_first,
	// budget_exhausted, fleet_budget_exhausted, fleet_circuit_open, …).
	Reason string
}

// Start is the answer when a due retry is awaited.
type Start struct {
	// Now: the retry starts at once.
	Now bool
	// Cancelled: the retry will never start.
	Cancelled bool
	// At is when to ask again, when neither.
	At time.Time
}
