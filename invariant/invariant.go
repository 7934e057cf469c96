package invariant

import (
	"fmt"
	"slices"
	"strings"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Rule ids. They are stable: tools and tests match on them.
const (
	RuleEmptySessionID        = "empty-session-id"
	RuleSequenceNotIncreasing = "sequence-not-increasing"
	RuleMissingKind           = "missing-kind"
	RuleScheduledMissingField = "scheduled-missing-field"
	RuleScheduledStaleStep    = "scheduled-stale-turn-step"
	RuleDuplicateStepRecord   = "duplicate-step-record"
	RuleDuplicateRetryID      = "duplicate-retry-id"
	RuleScheduledWhilePending = "scheduled-while-pending"
	RuleRetryNumber           = "retry-number"
	RuleModeInvalid           = "mode-invalid"
	RuleMaxRetriesBound       = "max-retries-bound"
	RuleDelaySourceInvalid    = "delay-source-invalid"
	RuleDelayOutOfBounds      = "delay-out-of-bounds"
	RuleStartedUnknownRetry   = "started-unknown-retry"
	RuleStartedMismatch       = "started-mismatch"
	RuleStartedRepeated       = "started-repeated"
	RuleStartedAfterCancel    = "started-after-cancel"
	RuleCancelledUnknownRetry = "cancelled-unknown-retry"
	RuleCancelledMismatch     = "cancelled-mismatch"
	RuleCancelledRepeated     = "cancelled-repeated"
	RuleCancelledAfterStart   = "cancelled-after-start"
)

// Violation is one broken invariant.
type Violation struct {
	Sequence  uint64 // the event's sequence
	SessionID string
	Rule      string // a short stable rule id, e.g. "started-unknown-retry"
	Message   string // human explanation naming retry ids / numbers
}

// String renders the violation on one line: where, which rule, and why.
func (v Violation) String() string {
	return fmt.Sprintf("session %q sequence %d: %s: %s", v.SessionID, v.Sequence, v.Rule, v.Message)
}

// Checker consumes events one at a time (so it can run over a live stream)
// and keeps per-session state. The zero value is not usable; call [New].
type Checker struct {
	sessions   map[string]*session
	retryIDs   map[string]string // retry id -> session that scheduled it first
	violations []Violation
}

// New returns a Checker that has seen no events.
func New() *Checker {
	return &Checker{
		sessions: make(map[string]*session),
		retryIDs: make(map[string]string),
	}
}

// Check runs a fresh Checker over events in order.
func Check(events []*retrydv1.Event) []Violation {
	c := New()
	for _, ev := range events {
		c.Add(ev)
	}
	return c.Violations()
}

// Violations returns every violation found so far, in log order.
func (c *Checker) Violations() []Violation {
	return slices.Clone(c.violations)
}

// Add checks one event against the state built from the events before it,
// records it, and returns the violations it causes. A nil event is checked
// as an empty one.
func (c *Checker) Add(ev *retrydv1.Event) []Violation {
	r := &reporter{sequence: ev.GetSequence(), sessionID: ev.GetSessionId()}
	s := c.session(ev.GetSessionId())
	subject := describe(ev)

	if ev.GetSessionId() == "" {
		r.add(RuleEmptySessionID, "%s has no session id", subject)
	}
	if s.seen && ev.GetSequence() <= s.lastSequence {
		r.add(RuleSequenceNotIncreasing, "%s has sequence %d, not after the session's sequence %d",
			subject, ev.GetSequence(), s.lastSequence)
	}
	if !s.seen || ev.GetSequence() > s.lastSequence {
		s.lastSequence = ev.GetSequence()
	}
	s.seen = true

	switch kind := ev.GetKind().(type) {
	case *retrydv1.Event_Scheduled:
		c.scheduled(r, s, kind.Scheduled, subject)
	case *retrydv1.Event_Delegated:
		s.delegated(kind.Delegated)
	case *retrydv1.Event_Started:
		s.started(r, kind.Started, subject)
	case *retrydv1.Event_Cancelled:
		s.cancelled(r, kind.Cancelled, subject)
	case *retrydv1.Event_Closed:
		delete(s.chains, chainKey{kind.Closed.GetProvider(), kind.Closed.GetPolicyKey()})
	default:
		r.add(RuleMissingKind, "%s has none of scheduled, delegated, started, cancelled or closed", subject)
	}

	c.violations = append(c.violations, r.violations...)
	return r.violations
}

func (c *Checker) session(id string) *session {
	s, ok := c.sessions[id]
	if !ok {
		s = &session{
			scheduledAt: make(map[position]string),
			finalAt:     make(map[position]bool),
			chains:      make(map[chainKey]uint32),
			retries:     make(map[string]*retry),
			pending:     make(map[string]bool),
		}
		c.sessions[id] = s
	}
	return s
}

// scheduled checks a RetryScheduled event and records the retry.
func (c *Checker) scheduled(r *reporter, s *session, sc *retrydv1.RetryScheduled, subject string) {
	id := sc.GetRetryId()
	pos := position{turn: sc.GetTurn(), step: sc.GetStep()}

	if missing := missingFields(sc); len(missing) > 0 {
		r.add(RuleScheduledMissingField, "%s lacks %s", subject, strings.Join(missing, ", "))
	}
	if s.hasLatest && pos.less(s.latest) {
		r.add(RuleScheduledStaleStep, "%s names turn %d, step %d, but the session already recorded turn %d, step %d",
			subject, pos.turn, pos.step, s.latest.turn, s.latest.step)
	}
	if other, ok := s.scheduledAt[pos]; ok {
		r.add(RuleDuplicateStepRecord, "%s is a second retry of turn %d, step %d, already retried by %q",
			subject, pos.turn, pos.step, other)
	} else if s.finalAt[pos] {
		r.add(RuleDuplicateStepRecord, "%s retries turn %d, step %d, which was already delegated after downstream recovery answered",
			subject, pos.turn, pos.step)
	}
	if first, ok := c.retryIDs[id]; ok && id != "" {
		r.add(RuleDuplicateRetryID, "%s reuses a retry id already scheduled in session %q", subject, first)
	}
	if pending := s.pendingIDs(); len(pending) > 0 {
		r.add(RuleScheduledWhilePending, "%s was scheduled while retry %s of the session is still pending",
			subject, quoteAll(pending))
	}

	checkBounds(r, sc, subject)

	key := chainKey{provider: sc.GetProvider(), policyKey: sc.GetPolicyKey()}
	if want := s.chains[key] + 1; sc.GetRetryNumber() != want {
		r.add(RuleRetryNumber, "%s has retry number %d, want %d on the chain of provider %q, policy key %q",
			subject, sc.GetRetryNumber(), want, key.provider, key.policyKey)
	}
	s.chains[key] = sc.GetRetryNumber()

	s.advance(pos)
	if _, ok := s.scheduledAt[pos]; !ok {
		s.scheduledAt[pos] = id
	}
	if id == "" {
		return
	}
	if _, ok := c.retryIDs[id]; !ok {
		c.retryIDs[id] = r.sessionID
	}
	if _, ok := s.retries[id]; !ok {
		s.retries[id] = &retry{turn: pos.turn, step: pos.step, number: sc.GetRetryNumber()}
		s.pending[id] = true
	}
}

// missingFields lists the required RetryScheduled fields that are empty.
func missingFields(sc *retrydv1.RetryScheduled) []string {
	var missing []string
	if sc.GetRetryId() == "" {
		missing = append(missing, "retry_id")
	}
	if sc.GetProvider() == "" {
		missing = append(missing, "provider")
	}
	if sc.GetPolicyKey() == "" {
		missing = append(missing, "policy_key")
	}
	if sc.GetPolicy() == nil {
		missing = append(missing, "policy")
	}
	switch {
	case sc.GetFailure() == nil:
		missing = append(missing, "failure")
	case sc.GetFailure().GetCode() == "":
		missing = append(missing, "failure.code")
	}
	return missing
}

// reporter collects the violations of one event.
type reporter struct {
	sequence   uint64
	sessionID  string
	violations []Violation
}

func (r *reporter) add(rule, format string, args ...any) {
	r.violations = append(r.violations, Violation{
		Sequence:  r.sequence,
		SessionID: r.sessionID,
		Rule:      rule,
		Message:   fmt.Sprintf(format, args...),
	})
}

// position is a (turn, step) pair, ordered lexicographically.
type position struct {
	turn, step uint64
}

func (p position) less(q position) bool {
	return p.turn < q.turn || p.turn == q.turn && p.step < q.step
}

// chainKey identifies a retry chain within a session.
type chainKey struct {
	provider, policyKey string
}

// retry is what a session remembers of one scheduled retry.
type retry struct {
	turn, step uint64
	number     uint32
	started    bool
	cancelled  bool
}

// session is the state of one session's log.
type session struct {
	seen         bool
	lastSequence uint64

	hasLatest bool
	latest    position // highest (turn, step) of a scheduled or delegated event

	scheduledAt map[position]string // retry id scheduled for a step
	finalAt     map[position]bool   // steps delegated after downstream recovery answered
	chains      map[chainKey]uint32 // last retry number of each open chain
	retries     map[string]*retry   // every retry scheduled in the session
	pending     map[string]bool     // retries neither started nor cancelled
}

func (s *session) advance(pos position) {
	if !s.hasLatest || s.latest.less(pos) {
		s.latest = pos
		s.hasLatest = true
	}
}

func (s *session) pendingIDs() []string {
	ids := make([]string, 0, len(s.pending))
	for id := range s.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (s *session) delegated(d *retrydv1.RetryDelegated) {
	pos := position{turn: d.GetTurn(), step: d.GetStep()}
	s.advance(pos)
	switch d.GetDownstream() {
	case retrydv1.Downstream_DOWNSTREAM_DECLINED, retrydv1.Downstream_DOWNSTREAM_HANDLED:
		// The report that asked downstream recovery has been answered: the
		// step has its record and nothing may be scheduled for it.
		s.finalAt[pos] = true
	}
}

func (s *session) started(r *reporter, st *retrydv1.RetryStarted, subject string) {
	rt, ok := s.retries[st.GetRetryId()]
	if !ok {
		r.add(RuleStartedUnknownRetry, "%s names no retry scheduled earlier in the session", subject)
		return
	}
	switch {
	case rt.cancelled:
		r.add(RuleStartedAfterCancel, "%s was already cancelled", subject)
	case rt.started:
		r.add(RuleStartedRepeated, "%s had already started", subject)
	}
	if st.GetTurn() != rt.turn || st.GetStep() != rt.step || st.GetRetryNumber() != rt.number {
		r.add(RuleStartedMismatch, "%s names turn %d, step %d, retry %d; it was scheduled for turn %d, step %d, retry %d",
			subject, st.GetTurn(), st.GetStep(), st.GetRetryNumber(), rt.turn, rt.step, rt.number)
	}
	if !rt.cancelled {
		rt.started = true
	}
	delete(s.pending, st.GetRetryId())
}

func (s *session) cancelled(r *reporter, cn *retrydv1.RetryCancelled, subject string) {
	if cn.GetRetryId() == "" {
		// An open always-mode delegation was cancelled: no retry to match.
		return
	}
	rt, ok := s.retries[cn.GetRetryId()]
	if !ok {
		r.add(RuleCancelledUnknownRetry, "%s names no retry scheduled earlier in the session", subject)
		return
	}
	switch {
	case rt.started:
		r.add(RuleCancelledAfterStart, "%s had already started", subject)
	case rt.cancelled:
		r.add(RuleCancelledRepeated, "%s had already been cancelled", subject)
	}
	if cn.GetTurn() != rt.turn || cn.GetStep() != rt.step || cn.GetRetryNumber() != rt.number {
		r.add(RuleCancelledMismatch, "%s names turn %d, step %d, retry %d; it was scheduled for turn %d, step %d, retry %d",
			subject, cn.GetTurn(), cn.GetStep(), cn.GetRetryNumber(), rt.turn, rt.step, rt.number)
	}
	if !rt.started {
		rt.cancelled = true
	}
	delete(s.pending, cn.GetRetryId())
}

// describe names an event for a message: its kind and retry id.
func describe(ev *retrydv1.Event) string {
	switch kind := ev.GetKind().(type) {
	case *retrydv1.Event_Scheduled:
		return fmt.Sprintf("scheduled retry %q", kind.Scheduled.GetRetryId())
	case *retrydv1.Event_Delegated:
		return fmt.Sprintf("delegation of turn %d, step %d", kind.Delegated.GetTurn(), kind.Delegated.GetStep())
	case *retrydv1.Event_Started:
		return fmt.Sprintf("started retry %q", kind.Started.GetRetryId())
	case *retrydv1.Event_Cancelled:
		if kind.Cancelled.GetRetryId() == "" {
			return fmt.Sprintf("cancelled delegation of turn %d, step %d", kind.Cancelled.GetTurn(), kind.Cancelled.GetStep())
		}
		return fmt.Sprintf("cancelled retry %q", kind.Cancelled.GetRetryId())
	case *retrydv1.Event_Closed:
		return fmt.Sprintf("close of the chain of provider %q, policy key %q", kind.Closed.GetProvider(), kind.Closed.GetPolicyKey())
	default:
		return fmt.Sprintf("event %d", ev.GetSequence())
	}
}

func quoteAll(ids []string) string {
	quoted := make([]string, len(ids))
	for i, id := range ids {
		quoted[i] = fmt.Sprintf("%q", id)
	}
	return strings.Join(quoted, ", ")
}
