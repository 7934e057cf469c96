// Package engine is retryd's per-session state machine: retry chains, the
// unique step records that make FailedStep idempotent, the one pending retry
// a session may have, and the events every transition records.
//
// A Session is not safe for concurrent use: the store that owns it
// serialises access (a shard lock in memory, a transaction elsewhere). Time,
// randomness and id generation are injected through Env, so every
// transition is deterministic under test.
//
// For durable stores a session converts to and from the storage schema
// (Snapshot, RestoreSession in retryd.state.v1), a transition that could
// not be written is undone (Checkpoint, Revert), and awaiters hear of a
// start or cancellation only once the store commits it (Commit).
package engine

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"slices"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// MaxChainAttempts is how many attempt trace contexts a chain remembers
// for linking its next decision to them.
const MaxChainAttempts = 32

// MaxRetainedRetries is how many retries (the pending one included) a
// session keeps so that AwaitRetry and CancelRetries can answer for them;
// older terminal retries are forgotten and answer NOT_FOUND.
const MaxRetainedRetries = 16

// Env is what a transition may observe of the outside world.
type Env struct {
	Now   time.Time
	Rand  policy.Rand
	NewID func() string
}

// ErrorKind classifies a refused transition; the service maps it to a gRPC
// status code.
type ErrorKind int

const (
	// KindNotFound: the retry or session is unknown.
	KindNotFound ErrorKind = iota + 1
	// KindConflict: the same step record with different content.
	KindConflict
	// KindStale: a report older than the session's latest step.
	KindStale
	// KindPending: the session has a scheduled retry that has not started.
	KindPending
	// KindClosed: the step's open delegation was cancelled.
	KindClosed
)

// Error is a refused transition. Nothing changed.
type Error struct {
	Kind    ErrorKind
	Message string
	// RetryID names the pending retry for KindPending.
	RetryID string
}

func (e *Error) Error() string { return "engine: " + e.Message }

func errorf(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// ChainKey identifies a retry chain within a session.
type ChainKey struct {
	Provider  string
	PolicyKey string
}

// Chain is the retry history of one (session, provider, policy key).
type Chain struct {
	Key     ChainKey
	Mode    retrydv1.Mode
	Max     *uint32
	Retries uint32
	Open    bool
	Latest  *Retry
	// updated is when a transition last changed it, in Unix nanoseconds.
	updated int64
	// attempts are the W3C traceparents of the chain's failed attempts,
	// oldest first, at most MaxChainAttempts; nil when there are none.
	// The slice is never modified in place (a new attempt replaces it), so
	// a Checkpoint shares it, and a chain costs one pointer, not a slice
	// header, for it.
	attempts *[]string
}

// attemptList returns the chain's attempt traceparents, oldest first;
// callers must not modify the slice.
func (c *Chain) attemptList() []string {
	if c.attempts == nil {
		return nil
	}
	return *c.attempts
}

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
	// Awaiters counts connected AwaitRetry streams; maintained by the store.
	Awaiters int
	Status   retrydv1.RetryStatus

	// The decision, which never changes once made; provider and policy key
	// are the chain's.
	mode        retrydv1.Mode
	source      retrydv1.DelaySource
	retryNumber uint32
	maxRetries  uint32 // when bounded
	bounded     bool
	committed   bool // terminal, and Commit released it
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

	// done is made by the first Done call of a retry that is not yet
	// committed terminal, closed by Commit and then dropped: a retry
	// nobody awaits never has a channel, a settled one no longer holds it.
	done  chan struct{}
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

// closedDone is the Done channel of every committed terminal retry.
var closedDone = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Done returns a channel that is closed once the retry is terminal and the
// store committed the transition (Session.Commit). Call it with the
// session held as for any transition (the store's lock); receive from the
// channel without it.
func (r *Retry) Done() <-chan struct{} {
	if r.committed {
		return closedDone
	}
	if r.done == nil {
		r.done = make(chan struct{})
	}
	return r.done
}

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

// Scheduled returns the retry's RetryScheduled record. It is built anew
// by each call (a restored retry returns the stored one), and immutable:
// do not modify it.
func (r *Retry) Scheduled() *retrydv1.RetryScheduled {
	if r.stored != nil {
		return r.stored.scheduled
	}
	return r.scheduledIn(new(scheduledBlock))
}

// scheduledBlock is a RetryScheduled and its due time, which live and die
// together: allocated as one, or inside what holds the record.
type scheduledBlock struct {
	sc  retrydv1.RetryScheduled
	due timestamppb.Timestamp
}

// scheduledIn builds the RetryScheduled of a retry this process scheduled
// in x.
func (r *Retry) scheduledIn(x *scheduledBlock) *retrydv1.RetryScheduled {
	t := r.textOf()
	sc := &x.sc
	sc.RetryId, sc.Turn, sc.Step, sc.LogicalTurnId = r.ID, r.turn, r.step, t.logicalTurnID
	sc.Provider, sc.Mode, sc.PolicyKey = r.chain.Key.Provider, r.mode, r.chain.Key.PolicyKey
	sc.Failure, sc.RetryNumber = r.failure, r.retryNumber
	if r.bounded {
		max := r.maxRetries
		sc.MaxRetries = &max
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
		st.Scheduled = r.scheduledIn(&x.sb)
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

// stepRecord is the answer to one report of the session's latest step,
// kept so that a report that means the same gets the same answer (see
// steprecord.go for which reports open a record). It keeps the
// decision's event (the log's own record, numbered once the store appends
// it) and not the response: a FailedStepResponse is that event plus a
// decision whose every field is also in the event, so responseOf rebuilds
// it, and an idle session does not hold a second copy of its decision.
//
// Once committed, a record of a scheduled decision drops even the event:
// the event is the session's id, its time, its sequence and the retry's
// RetryScheduled (which the retry can build again), so the record keeps
// the retry, the time and the sequence and rebuilds an equal event when it
// is asked (compact). Every pending chain has such a record, so this is
// what a million pending chains do not hold: an event, its oneof, its
// timestamp and the RetryScheduled with its due time.
type stepRecord struct {
	fingerprint [sha256.Size]byte
	phase       retrydv1.Downstream
	// event is the decision's event, nil once compact.
	event *retrydv1.Event
	// response is set only for a restored record whose stored response is
	// not the one responseOf builds; it is answered as stored.
	response *retrydv1.FailedStepResponse
	// retry is the retry a decision of this process scheduled (nil for a
	// delegation and for a restored record). A compact record's event is
	// the retry's: its sequence (Retry.seq) and time (the due time less
	// the delay).
	retry *Retry
}

// Response is the recorded answer.
func (r *stepRecord) Response(sessionID string) *retrydv1.FailedStepResponse {
	if r.response != nil {
		return r.response
	}
	return responseOf(r.eventOf(sessionID))
}

// eventOf returns the record's event, rebuilt when the record is compact.
func (r *stepRecord) eventOf(sessionID string) *retrydv1.Event {
	if r.event != nil {
		return r.event
	}
	x := new(struct { // the event, its oneof, its time and the record: one allocation
		ev   retrydv1.Event
		kind retrydv1.Event_Scheduled
		time timestamppb.Timestamp
		sb   scheduledBlock
	})
	rt := r.retry
	at := rt.due - int64(rt.delayMs)*int64(time.Millisecond)
	x.time.Seconds, x.time.Nanos = at/1e9, int32(at%1e9)
	x.kind.Scheduled = rt.scheduledIn(&x.sb)
	x.ev.Sequence, x.ev.SessionId, x.ev.Time, x.ev.Kind = rt.seq, sessionID, &x.time, &x.kind
	return &x.ev
}

// compact drops the event of a committed record of a decision that
// scheduled a retry (see stepRecord). Only a record this process made
// compacts: it knows its event is what eventOf rebuilds. A restored one
// keeps its event as stored.
func (r *stepRecord) compact() {
	if r.event == nil || r.retry == nil || r.retry.stored != nil {
		return
	}
	r.retry.seq = r.event.GetSequence()
	r.event = nil
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

type position struct{ turn, step uint64 }

func (p position) less(q position) bool {
	return p.turn < q.turn || p.turn == q.turn && p.step < q.step
}

// Session is one agent session's retry state.
type Session struct {
	ID string
	// updated is when a transition last changed it, in Unix nanoseconds
	// (see Updated).
	updated int64

	latest     position
	seen       bool
	records    []stepRecord // for the latest position only, by phase
	chains     []*Chain     // by key (chainOrder); most sessions have one
	pending    *Retry
	delegation *position // always mode: a downstream_first answer awaiting its follow-up
	cancelled  *position // a delegation cancelled at this position
	retries    []*Retry  // oldest first, at most MaxRetainedRetries
	// settled are the retries terminal since the last Commit, not yet
	// released; made by the first Start or Cancel and then reused (a
	// pointer, as most sessions in memory are waiting for a retry and never
	// settled one: it keeps Session in a smaller size class).
	settled *[]*Retry
}

// NewSession returns an empty session.
func NewSession(id string, now time.Time) *Session {
	return &Session{ID: id, updated: unixNano(now)}
}

// Updated is when a transition last changed the session.
func (s *Session) Updated() time.Time { return fromUnixNano(s.updated) }

// unixNano and fromUnixNano store a time as Unix nanoseconds, the zero
// time as 0 (a restored session without a time has the zero time).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func chainOrder(c *Chain, k ChainKey) int {
	return cmp.Or(cmp.Compare(c.Key.Provider, k.Provider), cmp.Compare(c.Key.PolicyKey, k.PolicyKey))
}

// chain returns the session's chain with key k, or nil.
func (s *Session) chain(k ChainKey) *Chain {
	if i, ok := slices.BinarySearchFunc(s.chains, k, chainOrder); ok {
		return s.chains[i]
	}
	return nil
}

// addChain adds a chain whose key the session does not have yet.
func (s *Session) addChain(c *Chain) {
	i, _ := slices.BinarySearchFunc(s.chains, c.Key, chainOrder)
	s.chains = slices.Insert(s.chains, i, c)
}

// record returns the latest position's record of phase, or nil.
func (s *Session) record(phase retrydv1.Downstream) *stepRecord {
	for i := range s.records {
		if s.records[i].phase == phase {
			return &s.records[i]
		}
	}
	return nil
}

// setRecord records the answer of a phase not recorded yet, keeping the
// records in phase order.
func (s *Session) setRecord(rec stepRecord) {
	i := 0
	for i < len(s.records) && s.records[i].phase < rec.phase {
		i++
	}
	s.records = slices.Insert(s.records, i, rec)
}

// clearRecords forgets the records of an older position, keeping their
// storage for the next ones.
func (s *Session) clearRecords() {
	clear(s.records)
	s.records = s.records[:0]
}

// settle notes that r became terminal, for the next Commit to release.
func (s *Session) settle(r *Retry) {
	if s.settled == nil {
		s.settled = new([]*Retry)
	}
	*s.settled = append(*s.settled, r)
}

// Pending returns the session's scheduled retry that has not yet started or
// been cancelled, or nil.
func (s *Session) Pending() *Retry { return s.pending }

// Retry returns a retained retry by id, or nil.
func (s *Session) Retry(id string) *Retry {
	for _, r := range s.retries {
		if r.ID == id {
			return r
		}
	}
	return nil
}

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
	// FleetKey names the fleet protection state of the failure's (tenant,
	// provider) in the store, and FleetConfig is its configuration; an
	// empty FleetKey: the provider is not protected. The store reads that
	// state in the transaction that reads the session, hands it to Fail,
	// and saves the state Fail returns (FailOutcome.Fleet) with the
	// session.
	FleetKey    string
	FleetConfig fleet.Config
}

// Fleet is fleet protection of a retry's provider as Start takes it: the
// configuration, and the state the store read in the transaction that
// reads the session.
type Fleet struct {
	Config fleet.Config
	State  fleet.ProviderState
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
	// Fleet is the fleet state to save with the session when FleetChanged:
	// a new decision of a failure with a FleetKey changes it.
	Fleet        fleet.ProviderState
	FleetChanged bool
	// FleetQueued is set when fleet protection admitted Scheduled: Fleet
	// counts it queued until it starts, or until the service reports it
	// dropped (fleet.ReportDropped).
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
// With f.FleetKey, fleetState is the provider's fleet state as the store
// read it: a new decision goes through fleet.Decide, and the state after it
// comes back in the outcome for the store to save. Without, fleetState is
// not used.
func (s *Session) Fail(env Env, f Failure, fleetState fleet.ProviderState) (FailOutcome, error) {
	req := f.Request
	pos := position{req.GetTurn(), req.GetStep()}
	phase := phaseOf(req.GetDownstream())
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
		deadline, hasDeadline := deadlineOf(req)
		a := policy.Attempt{
			Retries:     used,
			Code:        req.GetFailure().GetCode(),
			RetryAfter:  f.RetryAfter,
			Downstream:  phase,
			Replay:      req.GetReplay(),
			Deadline:    deadline,
			HasDeadline: hasDeadline,
		}
		d := p.Decide(a, env.Now, env.Rand)
		if f.FleetKey != "" {
			fd := fleet.Decide(f.FleetConfig, fleetState, p, a, d, env.Now, env.Rand)
			d, out.Fleet, out.FleetChanged, out.FleetQueued = fd.Decision, fd.State, true, fd.Queued
		}
		if p.Mode == retrydv1.Mode_MODE_ALWAYS && d.Reason == retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST {
			at := pos // only this branch keeps a pointer: pos stays on the stack
			s.delegation = &at
		}
		if d.Schedule {
			if chain == nil {
				chain = &Chain{Key: key, Mode: p.Mode}
				s.addChain(chain)
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
			scheduled = r
			x := new(struct { // the event, its oneof, its time and the record: one allocation
				ev   retrydv1.Event
				kind retrydv1.Event_Scheduled
				time timestamppb.Timestamp
				sb   scheduledBlock
			})
			x.kind.Scheduled = r.scheduledIn(&x.sb)
			x.ev.Kind = &x.kind
			ev = s.event(env, &x.ev, &x.time)
			out.Events = append(out.Events, ev)
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

func deadlineOf(req *retrydv1.FailedStepRequest) (time.Time, bool) {
	if req.GetDeadline() == nil {
		return time.Time{}, false
	}
	return req.GetDeadline().AsTime(), true
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

// event stamps a new log record of the session with ts set to now (ts is
// allocated with the event); the store assigns its sequence when it
// appends it.
func (s *Session) event(env Env, ev *retrydv1.Event, ts *timestamppb.Timestamp) *retrydv1.Event {
	ts.Seconds, ts.Nanos = env.Now.Unix(), int32(env.Now.Nanosecond())
	ev.SessionId = s.ID
	ev.Time = ts
	return ev
}

func (s *Session) closeChain(env Env, c *Chain, reason retrydv1.CloseReason) *retrydv1.Event {
	c.Open = false
	c.updated = env.Now.UnixNano()
	x := new(struct { // the event, its oneof, the record and the time: one allocation
		ev     retrydv1.Event
		kind   retrydv1.Event_Closed
		closed retrydv1.ChainClosed
		time   timestamppb.Timestamp
	})
	x.closed.Provider, x.closed.PolicyKey, x.closed.Reason, x.closed.Retries = c.Key.Provider, c.Key.PolicyKey, reason, c.Retries
	x.kind.Closed = &x.closed
	x.ev.Kind = &x.kind
	return s.event(env, &x.ev, &x.time)
}

// StartOutcome is what Start changed.
type StartOutcome struct {
	// Event is the RetryStarted event to append; nil when the retry did not
	// start.
	Event *retrydv1.Event
	// HeldUntil is set when fleet protection held the due retry back: when
	// to try again. Due, the scheduled time, never changes.
	HeldUntil time.Time
	// Fleet is the fleet state to save with the session when FleetChanged.
	Fleet        fleet.ProviderState
	FleetChanged bool
}

// Start records that r's backoff ended with an awaiter present. It records
// nothing unless r is pending: Started happens once. r's awaiters are
// released by the store's next Commit.
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
		out.Fleet, out.FleetChanged = next, true
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

// Cancel cancels a pending retry and closes its chain. Cancelling a terminal
// retry is a no-op that records nothing. r's awaiters are released by the
// store's next Commit.
func (s *Session) Cancel(env Env, r *Retry, reason retrydv1.CancelReason) []*retrydv1.Event {
	if r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		return nil
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
	return evs
}

// CancelAll cancels the session's pending retry and open always-mode
// delegation, and closes its open chains. It returns the states of the
// retries it touched and whether a delegation was closed.
func (s *Session) CancelAll(env Env) (states []*retrydv1.RetryState, delegation bool, evs []*retrydv1.Event) {
	if r := s.pending; r != nil {
		evs = s.Cancel(env, r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED)
		states = []*retrydv1.RetryState{r.state(evs[0].GetCancelled())}
	}
	if d := s.delegation; d != nil {
		evs = append(evs, s.event(env, &retrydv1.Event{Kind: &retrydv1.Event_Cancelled{Cancelled: &retrydv1.RetryCancelled{
			Reason: retrydv1.CancelReason_CANCEL_REASON_REQUESTED, Turn: d.turn, Step: d.step,
		}}}, new(timestamppb.Timestamp)))
		s.cancelled, s.delegation, delegation = d, nil, true
	}
	for _, c := range s.sortedChains() {
		if c.Open {
			evs = append(evs, s.closeChain(env, c, retrydv1.CloseReason_CLOSE_REASON_CANCELLED))
		}
	}
	s.updated = env.Now.UnixNano()
	return states, delegation, evs
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

// sortedChains returns the session's chains in key order; callers must not
// modify the slice.
func (s *Session) sortedChains() []*Chain { return s.chains }

// Chains snapshots the session for GetChains.
func (s *Session) Chains() *retrydv1.GetChainsResponse {
	resp := &retrydv1.GetChainsResponse{Turn: s.latest.turn, Step: s.latest.step}
	for _, c := range s.sortedChains() {
		pc := &retrydv1.Chain{
			Provider: c.Key.Provider, PolicyKey: c.Key.PolicyKey, Mode: c.Mode,
			Retries: c.Retries, MaxRetries: c.Max, Open: c.Open, UpdatedAt: timestamppb.New(fromUnixNano(c.updated)),
		}
		if c.Latest != nil {
			pc.Latest = c.Latest.State()
		}
		resp.Chains = append(resp.Chains, pc)
	}
	return resp
}

// Expire closes the session's open chains (reason expired) before the
// store forgets the session, so the log shows why numbering restarts.
func (s *Session) Expire(env Env) []*retrydv1.Event {
	var evs []*retrydv1.Event
	for _, c := range s.sortedChains() {
		if c.Open {
			evs = append(evs, s.closeChain(env, c, retrydv1.CloseReason_CLOSE_REASON_EXPIRED))
		}
	}
	return evs
}

// OpenChains counts the session's open chains.
func (s *Session) OpenChains() int {
	n := 0
	for _, c := range s.chains {
		if c.Open {
			n++
		}
	}
	return n
}

// Retries returns the retained retries, oldest first.
func (s *Session) Retries() []*Retry { return s.retries }

// Commit releases the awaiters of every retry that became terminal since
// the last Commit or Revert: it closes their Done channels. A store calls
// it once the transitions are durable (at once when it keeps nothing), so
// no agent hears of a start or cancellation that a crash could undo.
//
// Commit also compacts the step records of scheduled decisions (see
// stepRecord): once committed, their events carry their final sequence.
func (s *Session) Commit() {
	for i := range s.records {
		s.records[i].compact()
	}
	if s.settled == nil {
		return
	}
	settled := *s.settled
	for _, r := range settled {
		if r.done != nil {
			close(r.done)
			r.done = nil
		}
		r.committed = true
	}
	clear(settled)
	*s.settled = settled[:0]
}
