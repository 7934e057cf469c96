package engine

import (
	"fmt"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Start, Cancel, CancelAll and Succeed: the transitions after a decision.

// StartOutcome is what Start changed.
type StartOutcome struct {
	// Event is the RetryStarted event to append; nil when the retry did not
	// start.
	Event *retrydv1.Event
	// HeldUntil is set when fleet protection held the due retry back: when
	// to try again. Due, the scheduled time, never changes.
	HeldUntil time.Time
	// Fleet is the fleet state to save with the session, nil when
	// unchanged.
	Fleet *Fleet
}

// Start records that r's backoff ended with an awaiter present. It records
// nothing unless r is pending: Started happens once. r is Settled until
// the store's next Commit.
//
// With fl, the fleet protection of r's provider as the store read it, the
// retry starts only if fleet.StartDue lets it: a circuit opened since it
// was scheduled holds it (HeldUntil). The state after that answer comes
// back in the outcome for the store to save, whether the retry started or
// not.
func (s *Session) Start(env Env, r *Retry, fl *Fleet) StartOutcome {
	if r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		return StartOutcome{}
	}
	var out StartOutcome
	if fl != nil {
		v, next := fleet.StartDue(fl.Config, fl.State, env.Now, env.Rand)
		out.Fleet = &Fleet{Key: fl.Key, Config: fl.Config, State: next}
		if v.Action == fleet.StartLater {
			out.HeldUntil = v.At
			return out
		}
	}
	r.Status = retrydv1.RetryStatus_RETRY_STATUS_STARTED
	r.startedAt = env.Now.UnixNano()
	started := r.Started()
	if s.pending == r {
		s.pending = nil
	}
	r.chain.updated = env.Now.UnixNano()
	s.updated = env.Now.UnixNano()
	s.settle(r)
	x := new(struct { // the event and its oneof: one allocation
		ev   retrydv1.Event
		kind retrydv1.Event_Started
	})
	x.kind.Started = started
	x.ev.Kind = &x.kind
	out.Event = s.event(env, &x.ev, started.StartedAt)
	return out
}

// CancelOutcome is what Cancel and CancelAll changed.
type CancelOutcome struct {
	// States are the states of the retries CancelAll cancelled.
	States []*retrydv1.RetryState
	// Delegation is set when CancelAll closed an open delegation.
	Delegation bool
	// Events to append to the log, in order; none when nothing changed.
	Events []*retrydv1.Event
	// Fleet is the fleet state to save with the session, nil when
	// unchanged: a cancelled retry fleet protection queued leaves the
	// queue.
	Fleet *Fleet
}

// Cancel cancels a pending retry and closes its chain. Cancelling a terminal
// retry is a no-op that records nothing. r is Settled until the store's
// next Commit.
//
// With fl, the fleet state r's key names (Retry.FleetKey) as the store read
// it, a retry fleet protection queued leaves the queue in the same
// transition (fleet.ReportDropped), whichever replica cancels it.
func (s *Session) Cancel(env Env, r *Retry, reason retrydv1.CancelReason, fl *Fleet) CancelOutcome {
	if r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		return CancelOutcome{}
	}
	r.Status, r.reason = retrydv1.RetryStatus_RETRY_STATUS_CANCELLED, reason
	if s.pending == r {
		s.pending = nil
	}
	s.updated = env.Now.UnixNano()
	s.settle(r)
	x := new(struct { // the event, its oneof, its time and the record: one allocation
		ev        retrydv1.Event
		kind      retrydv1.Event_Cancelled
		time      timestamppb.Timestamp
		cancelled retrydv1.RetryCancelled
	})
	c := &x.cancelled
	c.RetryId, c.Reason, c.Turn, c.Step, c.RetryNumber = r.ID, reason, r.turn, r.step, r.retryNumber
	x.kind.Cancelled = c
	x.ev.Kind = &x.kind
	evs := make([]*retrydv1.Event, 1, 2)
	evs[0] = s.event(env, &x.ev, &x.time)
	if r.chain.Open && r.chain.Latest == r {
		evs = append(evs, s.closeChain(env, r.chain, retrydv1.CloseReason_CLOSE_REASON_CANCELLED))
	}
	out := CancelOutcome{Events: evs}
	if fl != nil && r.fleetKey != "" && fl.Key == r.fleetKey {
		out.Fleet = fl.apply(fleet.ReportDropped, env.Now)
	}
	return out
}

// CancelAll cancels the session's pending retry (with fl as Cancel takes
// it) and open always-mode delegation, and closes its open chains.
func (s *Session) CancelAll(env Env, fl *Fleet) CancelOutcome {
	var out CancelOutcome
	if r := s.pending; r != nil {
		out = s.Cancel(env, r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, fl)
		out.States = []*retrydv1.RetryState{r.state(out.Events[0].GetCancelled())}
	}
	if d := s.delegation; d != nil {
		out.Events = append(out.Events, s.event(env, &retrydv1.Event{Kind: &retrydv1.Event_Cancelled{Cancelled: &retrydv1.RetryCancelled{
			Reason: retrydv1.CancelReason_CANCEL_REASON_REQUESTED, Turn: d.turn, Step: d.step,
		}}}, new(timestamppb.Timestamp)))
		s.cancelled, s.delegation, out.Delegation = d, nil, true
	}
	for _, c := range s.sortedChains() {
		if c.Open {
			out.Events = append(out.Events, s.closeChain(env, c, retrydv1.CloseReason_CLOSE_REASON_CANCELLED))
		}
	}
	s.updated = env.Now.UnixNano()
	return out
}

// Succeed records a successful step: every open chain closes, so the next
// failure starts again at retry 1.
func (s *Session) Succeed(env Env, turn, step uint64) ([]*retrydv1.ChainClosed, []*retrydv1.Event, error) {
	pos := position{turn, step}
	if s.seen && pos.less(s.latest) {
		return nil, nil, errorf(KindStale,
			"turn %d step %d is older than the session's latest recorded turn %d step %d",
			turn, step, s.latest.turn, s.latest.step)
	}
	if s.pending != nil {
		return nil, nil, &Error{Kind: KindPending, RetryID: s.pending.ID, Message: fmt.Sprintf(
			"session has scheduled retry %s that has not started; await or cancel it first", s.pending.ID)}
	}
	if !s.seen || s.latest.less(pos) {
		s.latest, s.seen = pos, true
		s.clearRecords()
		s.cancelled = nil
	}
	s.delegation = nil
	var closed []*retrydv1.ChainClosed
	var evs []*retrydv1.Event
	for _, c := range s.sortedChains() {
		if c.Open {
			ev := s.closeChain(env, c, retrydv1.CloseReason_CLOSE_REASON_SUCCEEDED)
			evs = append(evs, ev)
			closed = append(closed, ev.GetClosed())
		}
	}
	s.updated = env.Now.UnixNano()
	return closed, evs, nil
}
