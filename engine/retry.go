package engine

import (
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Retry is one scheduled retry.
//
// A retry keeps the decision that scheduled it as plain fields, not as the
// API's RetryScheduled, RetryStarted and RetryCancelled messages: those
// are built when asked for (Scheduled, Started, Cancelled, State). A
// store holds every retained retry of every session, and the messages,
// with their timestamps, oneofs and message state, would make a retry
// about twice as large and three times as many pointers for the garbage
// collector to follow (docs/benchmarks.md measures the live heap per
// pending session).
type Retry struct {
	ID        string
	SessionID string
	// Awaiters counts connected AwaitRetry streams, as the store counts
	// them (RetryState.awaiters): set by the store, read by the engine only
	// to render a state.
	Awaiters int
	Status   retrydv1.RetryStatus

	// The decision, which never changes once made; provider and policy key
	// are the chain's.
	mode        retrydv1.Mode
	source      retrydv1.DelaySource
	retryNumber uint32
	maxRetries  uint32 // when bounded
	bounded     bool
	// reason is why a cancelled retry was cancelled.
	reason     retrydv1.CancelReason
	turn, step uint64
	delayMs    uint64
	// startedAt is when a started retry started, in Unix nanoseconds.
	startedAt int64
	// due is when the backoff ends, in Unix nanoseconds (see Due).
	due int64
	// seq is the sequence of the event that scheduled it, once its step
	// record is compact (see stepRecord).
	seq     uint64
	failure *retrydv1.Failure     // shared with the report
	policy  *retrydv1.RetryPolicy // shared with the resolved policy
	text    *retryText            // nil when every text is empty
	// stored are a restored retry's messages as the store had them (they
	// may hold fields this version does not know); nil for a retry this
	// process scheduled.
	stored *storedRetry
	// fleetKey names the fleet state that counts the retry queued, when
	// fleet protection admitted it (see FleetKey).
	fleetKey string

	chain *Chain
}

// retryText is a retry's rarely set strings: most retries have none of them.
type retryText struct {
	logicalTurnID, traceparent, detail string
}

type storedRetry struct {
	scheduled *retrydv1.RetryScheduled
	started   *retrydv1.RetryStarted
	cancelled *retrydv1.RetryCancelled
}

// FleetKey names the fleet state that counts the retry queued until it
// starts or is cancelled, "" when fleet protection did not admit it.
func (r *Retry) FleetKey() string { return r.fleetKey }

// Due is when the retry's backoff ends: its scheduled start.
func (r *Retry) Due() time.Time { return time.Unix(0, r.due) }

// Provider is the provider whose failure the retry retries.
func (r *Retry) Provider() string { return r.chain.Key.Provider }

func (r *Retry) textOf() retryText {
	if r.text == nil {
		return retryText{}
	}
	return *r.text
}
