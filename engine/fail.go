package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Failure is one validated FailedStep report with its policy resolved.
type Failure struct {
	Request *retrydv1.FailedStepRequest
	// Policy decides; nil when the request names no provider.
	Policy *policy.Policy
	// RetryAfter is the parsed provider delay instruction.
	RetryAfter policy.RetryAfter
	// AttemptTrace is the W3C traceparent of the caller's failed attempt
	// span, if it sent one; the chain remembers it for later links.
	AttemptTrace string
	// BackoffTrace is the W3C traceparent of the backoff span the service
	// opened for a retry this failure may schedule.
	BackoffTrace string
	// Fleet is the fleet protection of the failure's provider, nil when it
	// is not protected: its key and configuration are the service's, its
	// State the one the store read in the transaction that reads the
	// session. The store saves the state Fail returns (FailOutcome.Fleet)
	// with the session.
	Fleet *Fleet
}

// Fleet is fleet protection of a provider as the transitions take it and
// return it: which state (Key, a tenant's provider), the configuration it
// is decided with, and the state itself. Fail, Start and Cancel take one
// as the store read it in the session's transaction and return the state
// after them as another, for the store to save in the same transaction;
// nil in: not protected, nil out: unchanged.
type Fleet struct {
	Key    string
	Config fleet.Config
	State  fleet.ProviderState
}

// apply returns fl after report r at now.
func (fl *Fleet) apply(r fleet.Report, now time.Time) *Fleet {
	return &Fleet{Key: fl.Key, Config: fl.Config, State: fleet.Apply(fl.Config, fl.State, r, now)}
}

// FailOutcome is what Fail changed.
type FailOutcome struct {
	Response *retrydv1.FailedStepResponse
	// Events to append to the log, in order (none for an idempotent replay).
	Events []*retrydv1.Event
	// Scheduled is the new pending retry, if one was scheduled.
	Scheduled *Retry
	// Forgotten are retries no longer retained (unindex them).
	Forgotten []*Retry
	// PreviousAttempts are the traceparents of the chain's earlier failed
	// attempts (not this one), oldest first, for span links.
	PreviousAttempts []string
	// Fleet is the fleet state to save with the session, nil when
	// unchanged: a new decision of a protected failure changes it.
	Fleet *Fleet
	// FleetQueued is set when fleet protection admitted Scheduled: Fleet
	// counts it queued until it starts or is cancelled (Scheduled keeps
	// the state's key, Retry.FleetKey, for that).
	FleetQueued bool
}

// Fail decides one failed step. A step is decided at most twice (see
// steprecord.go): once, or in always mode once and once more as the
// follow-up of its downstream_first answer. A report of the step that
// means the same as a recorded one gets the recorded response and changes
// nothing.
//
// When several refusals apply, the first of these wins: STALE_STEP (an
// older step, even one reported exactly as before), the recorded answer,
// STEP_RECORD_CONFLICT or DELEGATION_CANCELLED (an answered step), and
// RETRY_PENDING (TestRefusalPrecedence).
//
// With f.Fleet, a new decision goes through fleet.Decide, and the state
// after it comes back in the outcome for the store to save.
func (s *Session) Fail(env Env, f Failure) (FailOutcome, error) {
	req := f.Request
	pos := position{req.GetTurn(), req.GetStep()}
	phase := policy.PhaseOf(req.GetDownstream())
	fp := reportFingerprint(req, f.Policy)

	if s.seen && pos.less(s.latest) {
		return FailOutcome{}, errorf(KindStale,
			"turn %d step %d is older than the session's latest recorded turn %d step %d",
			pos.turn, pos.step, s.latest.turn, s.latest.step)
	}
	followUp := false
	if s.seen && pos == s.latest && len(s.records) > 0 {
		if rec := s.recorded(fp, req); rec != nil {
			return FailOutcome{Response: rec.Response(s.ID)}, nil
		}
		if err := s.openRecord(pos, phase); err != nil {
			return FailOutcome{}, err
		}
		followUp = true
	}
	if s.pending != nil {
		return FailOutcome{}, &Error{Kind: KindPending, RetryID: s.pending.ID, Message: fmt.Sprintf(
			"session has scheduled retry %s (turn %d step %d) that has not started; await or cancel it first",
			s.pending.ID, s.pending.turn, s.pending.step)}
	}

	if !s.seen || s.latest.less(pos) {
		s.latest, s.seen = pos, true
		s.clearRecords()
		s.delegation, s.cancelled = nil, nil
	}
	if followUp {
		s.delegation = nil // the handshake is answered, whatever this decides
	}

	var out FailOutcome
	var ev *retrydv1.Event // the decision's: scheduled or delegated
	var scheduled *Retry
	if f.Policy == nil {
		ev = s.delegated(env, f, phase, policy.Decision{
			Reason: retrydv1.DelegateReason_DELEGATE_REASON_NO_PROVIDER,
			Detail: "the failure happened before any provider adapter was selected",
		})
		out.Events = append(out.Events, ev)
	} else {
		p := f.Policy
		key := ChainKey{Provider: req.GetProvider(), PolicyKey: p.Key}
		chain := s.chain(key)
		var used uint32
		if chain != nil && chain.Open {
			used = chain.Retries
			out.PreviousAttempts = slices.Clone(chain.attemptList())
		}
		a := policy.AttemptOf(req, used, f.RetryAfter)
		d := p.Decide(a, env.Now, env.Rand)
		if fl := f.Fleet; fl != nil {
			fd := fleet.Decide(fl.Config, fl.State, p, a, d, env.Now, env.Rand)
			d, out.FleetQueued = fd.Decision, fd.Queued
			out.Fleet = &Fleet{Key: fl.Key, Config: fl.Config, State: fd.State}
		}
		if p.Mode == retrydv1.Mode_MODE_ALWAYS && d.Reason == retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST {
			at := pos // only this branch keeps a pointer: pos stays on the stack
			s.delegation = &at
		}
		if d.Schedule {
			if chain == nil {
				chain = s.addChain(key)
				chain.Mode = p.Mode
			}
			if !chain.Open {
				chain.Open, chain.Retries, chain.attempts = true, 0, nil
			}
			if f.AttemptTrace != "" {
				old := chain.attemptList()
				old = old[max(0, len(old)+1-MaxChainAttempts):] // the newest, with room for this one
				attempts := append(append(make([]string, 0, len(old)+1), old...), f.AttemptTrace)
				chain.attempts = &attempts
			}
			if p.Bounded {
				chain.Max = &p.MaxRetries
			}
			r := s.schedule(env, f, chain, d)
			if out.FleetQueued {
				r.fleetKey = f.Fleet.Key
			}
			scheduled = r
			// The event, its oneof, its time, the record and the
			// outcome's list of events: one allocation, in the size class
			// of the first four (448 bytes).
			x := new(struct {
				ev     retrydv1.Event
				kind   retrydv1.Event_Scheduled
				time   timestamppb.Timestamp
				sb     scheduledBlock
				max    uint32
				events [1]*retrydv1.Event
			})
			x.kind.Scheduled = r.scheduledIn(&x.sb, &x.max)
			x.ev.Kind = &x.kind
			ev = s.event(env, &x.ev, &x.time)
			x.events[0] = ev
			out.Events = x.events[:] // the only event (len(out.Events) == 0)
			out.Scheduled = r
			out.Forgotten = s.retain(r)
		} else {
			ev = s.delegated(env, f, phase, d)
			out.Events = append(out.Events, ev)
			if d.Reason == retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED && chain != nil && chain.Open {
				out.Events = append(out.Events, s.closeChain(env, chain, retrydv1.CloseReason_CLOSE_REASON_EXHAUSTED))
			}
		}
	}
	s.setRecord(stepRecord{phase: phase, fingerprint: fp, event: ev, retry: scheduled})
	s.updated = env.Now.UnixNano()
	out.Response = responseOf(ev)
	return out, nil
}

// delegated returns the event of a delegation.
func (s *Session) delegated(env Env, f Failure, phase retrydv1.Downstream, d policy.Decision) *retrydv1.Event {
	req := f.Request
	// The event, its oneof and the delegation are one allocation: only the
	// event refers to the other two.
	x := new(struct {
		ev        retrydv1.Event
		kind      retrydv1.Event_Delegated
		delegated retrydv1.RetryDelegated
		time      timestamppb.Timestamp
	})
	dg := &x.delegated
	dg.Turn, dg.Step = req.GetTurn(), req.GetStep()
	dg.Provider, dg.Failure = req.GetProvider(), req.GetFailure()
	dg.Reason, dg.Detail, dg.Downstream = d.Reason, d.Detail, phase
	if f.Policy != nil {
		dg.PolicyKey, dg.Mode = f.Policy.Key, f.Policy.Mode
	}
	x.kind.Delegated = dg
	x.ev.Kind = &x.kind
	return s.event(env, &x.ev, &x.time)
}

func (s *Session) schedule(env Env, f Failure, chain *Chain, d policy.Decision) *Retry {
	req, p := f.Request, f.Policy
	r := &Retry{
		ID:          env.NewID(),
		SessionID:   s.ID,
		due:         env.Now.Add(time.Duration(d.DelayMs) * time.Millisecond).UnixNano(),
		Status:      retrydv1.RetryStatus_RETRY_STATUS_PENDING,
		mode:        p.Mode,
		source:      d.Source,
		retryNumber: d.RetryNumber,
		turn:        req.GetTurn(),
		step:        req.GetStep(),
		delayMs:     d.DelayMs,
		failure:     req.GetFailure(),
		policy:      p.SharedProto(),
		chain:       chain,
	}
	if chain.Max != nil {
		r.maxRetries, r.bounded = *chain.Max, true
	}
	if lt, tp, dt := req.GetLogicalTurnId(), f.BackoffTrace, d.Detail; lt != "" || tp != "" || dt != "" {
		r.text = &retryText{lt, tp, dt}
	}
	chain.Retries = d.RetryNumber
	chain.Latest = r
	chain.updated = env.Now.UnixNano()
	s.pending = r
	return r
}

func (s *Session) retain(r *Retry) (forgotten []*Retry) {
	s.retries = append(s.retries, r)
	for len(s.retries) > MaxRetainedRetries {
		i := slices.IndexFunc(s.retries, func(r *Retry) bool { return r != s.pending })
		forgotten = append(forgotten, s.retries[i])
		s.retries = slices.Delete(s.retries, i, i+1)
	}
	return forgotten
}
