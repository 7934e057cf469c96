package engine

import (
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The API records of a retry (RetryScheduled, RetryStarted, RetryCancelled,
// RetryState, the AwaitRetry answers) and of a decision
// (FailedStepResponse), built from the engine's plain fields when asked for.

// Scheduled returns the retry's RetryScheduled record. It is built anew
// by each call (a restored retry returns the stored one), and immutable:
// do not modify it.
func (r *Retry) Scheduled() *retrydv1.RetryScheduled {
	if r.stored != nil {
		return r.stored.scheduled
	}
	x := new(struct { // the block has room for MaxRetries in its size class
		sb  scheduledBlock
		max uint32
	})
	return r.scheduledIn(&x.sb, &x.max)
}

// scheduledBlock is a RetryScheduled and its due time, which live and die
// together: allocated as one, or inside what holds the record.
type scheduledBlock struct {
	sc  retrydv1.RetryScheduled
	due timestamppb.Timestamp
}

// scheduledIn builds the RetryScheduled of a retry this process scheduled
// in x. A bounded retry's MaxRetries is kept in max, which lives with x,
// or allocated when max is nil (where room for it would take x's holder
// into a larger size class).
func (r *Retry) scheduledIn(x *scheduledBlock, max *uint32) *retrydv1.RetryScheduled {
	t := r.textOf()
	sc := &x.sc
	sc.RetryId, sc.Turn, sc.Step, sc.LogicalTurnId = r.ID, r.turn, r.step, t.logicalTurnID
	sc.Provider, sc.Mode, sc.PolicyKey = r.chain.Key.Provider, r.mode, r.chain.Key.PolicyKey
	sc.Failure, sc.RetryNumber = r.failure, r.retryNumber
	if r.bounded {
		if max == nil {
			max = new(uint32)
		}
		*max = r.maxRetries
		sc.MaxRetries = max
	}
	x.due.Seconds, x.due.Nanos = r.due/1e9, int32(r.due%1e9)
	sc.DelayMs, sc.DelaySource, sc.DueAt, sc.Detail = r.delayMs, r.source, &x.due, t.detail
	sc.Policy, sc.Traceparent = r.policy, t.traceparent
	return sc
}

// Started returns the retry's RetryStarted record, or nil unless it
// started; built anew by each call, like Scheduled.
func (r *Retry) Started() *retrydv1.RetryStarted {
	if r.Status != retrydv1.RetryStatus_RETRY_STATUS_STARTED {
		return nil
	}
	if r.stored != nil && r.stored.started != nil {
		return r.stored.started
	}
	// The record and its time: one allocation.
	x := new(struct {
		started retrydv1.RetryStarted
		time    timestamppb.Timestamp
	})
	x.time.Seconds, x.time.Nanos = r.startedAt/1e9, int32(r.startedAt%1e9)
	st := &x.started
	st.RetryId, st.Turn, st.Step, st.RetryNumber = r.ID, r.turn, r.step, r.retryNumber
	st.StartedAt, st.Traceparent = &x.time, r.textOf().traceparent
	return st
}

// Cancelled returns the retry's RetryCancelled record, or nil unless it
// was cancelled; built anew by each call, like Scheduled.
func (r *Retry) Cancelled() *retrydv1.RetryCancelled {
	if r.Status != retrydv1.RetryStatus_RETRY_STATUS_CANCELLED {
		return nil
	}
	if r.stored != nil && r.stored.cancelled != nil {
		return r.stored.cancelled
	}
	return r.cancellation(r.reason)
}

// cancellation is the RetryCancelled record of cancelling r for reason.
func (r *Retry) cancellation(reason retrydv1.CancelReason) *retrydv1.RetryCancelled {
	return &retrydv1.RetryCancelled{
		RetryId: r.ID, Reason: reason, Turn: r.turn, Step: r.step, RetryNumber: r.retryNumber,
	}
}

// ShutdownCancelled is the AwaitRetry answer to an awaiter of r that the
// store sends away because it is closing: the retry did not start for it.
// It reads only what never changes, so it needs no lock.
func (r *Retry) ShutdownCancelled() *retrydv1.AwaitRetryResponse {
	return &retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_Cancelled{
		Cancelled: r.cancellation(retrydv1.CancelReason_CANCEL_REASON_SHUTDOWN),
	}}
}

// State snapshots the retry for the API.
func (r *Retry) State() *retrydv1.RetryState { return r.state(r.Cancelled()) }

// state is State with the retry's RetryCancelled (or nil) given.
func (r *Retry) state(cancelled *retrydv1.RetryCancelled) *retrydv1.RetryState {
	var st *retrydv1.RetryState
	if r.stored != nil {
		st = &retrydv1.RetryState{Scheduled: r.stored.scheduled}
	} else {
		x := new(struct { // the state and its RetryScheduled: one allocation
			st retrydv1.RetryState
			sb scheduledBlock
		})
		st = &x.st
		st.Scheduled = r.scheduledIn(&x.sb, nil) // x fills its size class
	}
	st.RetryId, st.SessionId, st.Status = r.ID, r.SessionID, r.Status
	st.Started, st.Cancelled, st.Awaiters = r.Started(), cancelled, uint32(r.Awaiters)
	return st
}

// Terminal returns the terminal AwaitRetry message, or nil while pending.
func (r *Retry) Terminal() *retrydv1.AwaitRetryResponse {
	switch r.Status {
	case retrydv1.RetryStatus_RETRY_STATUS_STARTED:
		return &retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_Started{Started: r.Started()}}
	case retrydv1.RetryStatus_RETRY_STATUS_CANCELLED:
		return &retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_Cancelled{Cancelled: r.Cancelled()}}
	}
	return nil
}

// responseOf builds the FailedStepResponse of a decision from its event (a
// RetryScheduled or RetryDelegated): the decision repeats the event's
// fields, sharing its messages (due time, budget).
func responseOf(ev *retrydv1.Event) *retrydv1.FailedStepResponse {
	switch k := ev.GetKind().(type) {
	case *retrydv1.Event_Scheduled:
		// The response, its decision, the oneof and the schedule live and
		// die together: one allocation.
		sc := k.Scheduled
		x := new(struct {
			resp     retrydv1.FailedStepResponse
			decision retrydv1.Decision
			outcome  retrydv1.Decision_Schedule
			schedule retrydv1.Schedule
		})
		x.schedule.RetryId = sc.GetRetryId()
		x.schedule.RetryNumber = sc.GetRetryNumber()
		x.schedule.MaxRetries = sc.MaxRetries
		x.schedule.DelayMs = sc.GetDelayMs()
		x.schedule.DelaySource = sc.GetDelaySource()
		x.schedule.Detail = sc.GetDetail()
		x.schedule.DueAt = sc.GetDueAt()
		x.schedule.PolicyKey = sc.GetPolicyKey()
		x.schedule.Mode = sc.GetMode()
		x.outcome.Schedule = &x.schedule
		x.decision.Outcome = &x.outcome
		x.resp.Decision, x.resp.Event = &x.decision, ev
		return &x.resp
	case *retrydv1.Event_Delegated:
		dg := k.Delegated
		x := new(struct {
			resp     retrydv1.FailedStepResponse
			decision retrydv1.Decision
			outcome  retrydv1.Decision_Delegate
			delegate retrydv1.Delegate
		})
		x.delegate.Reason, x.delegate.Detail = dg.GetReason(), dg.GetDetail()
		x.outcome.Delegate = &x.delegate
		x.decision.Outcome = &x.outcome
		x.resp.Decision, x.resp.Event = &x.decision, ev
		return &x.resp
	}
	return &retrydv1.FailedStepResponse{Event: ev}
}
