// Package admission is retryd's admission control: it bounds the work the
// service accepts (pending retries, open chains and active sessions, per
// tenant and in all, and AwaitRetry streams), so that a storm of failures
// meets a limit before it fills the store. Every bound is checked in the
// service, before the store sees the request, so a refusal records nothing
// on any backend; the service turns a Refusal into RESOURCE_EXHAUSTED.
package admission

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/tenant"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// How the bounds are counted.
//
// The FailedStep bounds count what the event log says is held: a
// Scheduled event opens a pending retry (and its chain, when that chain
// was not open), Started and Cancelled of that retry end it, ChainClosed
// closes a chain (succeeded, cancelled, exhausted or expired); a session
// is active while it has an open chain or a pending retry. Delegated
// events open nothing. The counts are built by Observe, which the
// service's event-log follower calls with every event of the whole log
// (on Redis the global one, so every replica converges on the same
// counts), from the oldest retained event on, which rebuilds them after a
// restart of a durable store.
//
// The log lags a decision by a moment, so an admitted FailedStep that may
// add work holds a reservation of what it may add, from the admission
// until the log shows its Scheduled event (or at once, when it scheduled
// nothing): concurrent calls on this replica can never pass a bound
// together. Each decision is counted once — from the log — and the
// reservation makes up for the lag, so seeing one's own decision both as
// an outcome and as an event never counts it twice.
//
// Only work that may be new is refused. A request that cannot add
// anything passes even at a bound: a session with a pending retry (the
// engine answers RETRY_PENDING or repeats its answer), a repeated or stale
// report, a failure the policy certainly delegates (no provider, ABORTED,
// unsafe replay, always mode's handshake, a code it does not retry, a
// used-up budget — which closes the chain —, a Retry-After over the cap,
// a deadline even the shortest delay misses), and a failure on a session
// that is already active when only the session bound is full.

// Limits bounds the work the service accepts. A zero (or negative) field
// is unlimited. Per-tenant limits are checked before the server's, so one
// tenant's storm meets its own limit before it can fill the server's.
type Limits struct {
	// PendingRetriesPerTenant bounds one tenant's scheduled retries that
	// have neither started nor been cancelled.
	PendingRetriesPerTenant int
	// PendingRetries bounds all tenants' pending retries together.
	PendingRetries int
	// OpenChainsPerTenant bounds one tenant's open retry chains.
	OpenChainsPerTenant int
	// OpenChains bounds all tenants' open chains together.
	OpenChains int
	// ActiveSessionsPerTenant bounds one tenant's sessions with an open
	// chain or a pending retry.
	ActiveSessionsPerTenant int
	// AwaitersPerRetry bounds the AwaitRetry streams this replica holds
	// for one retry id.
	AwaitersPerRetry int
	// Awaiters bounds all AwaitRetry streams this replica holds.
	Awaiters int
	// Forget is a backstop for events the counts never saw (a log that
	// overran its reader, a Redis key that expired on its own): a session
	// counted as active whose last event is older than Forget — or, with a
	// pending retry, whose retry fell due longer than Forget ago — is no
	// longer counted. Zero: never. The server sets twice the chain TTL
	// plus the abandon grace, well after the store itself forgets it.
	Forget time.Duration
}

// Tracks reports whether a FailedStep bound is set, so that the log must
// be counted (see Control.Observe).
func (l Limits) Tracks() bool {
	return l.PendingRetriesPerTenant > 0 || l.PendingRetries > 0 || l.OpenChainsPerTenant > 0 ||
		l.OpenChains > 0 || l.ActiveSessionsPerTenant > 0
}

// RetryDelay is how long a refused caller should wait before it tries
// again (the service sends it as google.rpc.RetryInfo): long enough for
// pending retries to start (backoffs are about half a second to ten),
// short enough not to idle an agent.
const RetryDelay = time.Second

// reservationTimeout releases a reservation whose Scheduled event the log
// never showed (the observer stopped, or the log overran it).
const reservationTimeout = time.Minute

// bound names one limit.
type bound int

const (
	boundPendingPerTenant bound = iota
	boundPending
	boundChainsPerTenant
	boundChains
	boundSessionsPerTenant
	boundAwaitersPerRetry
	boundAwaiters
	numBounds
)

// bounds describes each limit: its id (the metric's bound attribute and
// QuotaFailure's quota_id) and what it counts.
var bounds = [numBounds]struct{ id, what string }{
	boundPendingPerTenant:  {"pending_retries_per_tenant", "pending retries per tenant"},
	boundPending:           {"pending_retries", "pending retries"},
	boundChainsPerTenant:   {"open_chains_per_tenant", "open chains per tenant"},
	boundChains:            {"open_chains", "open chains"},
	boundSessionsPerTenant: {"active_sessions_per_tenant", "active sessions per tenant"},
	boundAwaitersPerRetry:  {"awaiters_per_retry", "awaiters per retry"},
	boundAwaiters:          {"awaiters", "awaiters"},
}

// counts are what admission control counts of one tenant or of all.
type counts struct{ pending, chains, sessions int }

func (c *counts) add(d counts, sign int) {
	c.pending += sign * d.pending
	c.chains += sign * d.chains
	c.sessions += sign * d.sessions
}

// tenantCounts are one tenant's counts: held (from the log) and reserved
// (admitted, not yet in the log).
type tenantCounts struct {
	id               string
	logged, reserved counts
}

// trackedSession is an active session as the log shows it.
type trackedSession struct {
	tenant  *tenantCounts
	pending string    // the pending retry's id, or ""
	due     time.Time // the pending retry's due time
	chains  []trackedChain
	// The latest reported position and the downstream phases decided at
	// it (bit 1<<phase), to let repeated reports through.
	turn, step uint64
	phases     uint8
	last       time.Time // the time of its latest event
	seq        uint64    // the sequence of its latest event
}

type trackedChain struct {
	provider, policyKey string
	retries             uint32
}

func (s *trackedSession) chain(provider, policyKey string) int {
	for i := range s.chains {
		if s.chains[i].provider == provider && s.chains[i].policyKey == policyKey {
			return i
		}
	}
	return -1
}

// at moves the session to a reported position; it reports whether the
// event is at the latest position.
func (s *trackedSession) at(turn, step uint64) bool {
	if turn > s.turn || turn == s.turn && step > s.step {
		s.turn, s.step, s.phases = turn, step, 0
	}
	return turn == s.turn && step == s.step
}

// Reservation is what one admitted FailedStep may add, held until the log
// shows its decision.
type Reservation struct {
	session string
	tenant  *tenantCounts
	need    counts
	seq     uint64    // the Scheduled event's sequence, once decided
	until   time.Time // released then at the latest
	// next is the session's next reservation ahead of the log. A session
	// almost never has two (admit lets a second through only while the
	// first is undecided), so a list costs no allocation of its own.
	next *Reservation
}

// Control enforces Limits. A nil *Control admits everything.
type Control struct {
	limits    Limits
	now       func() time.Time
	log       *slog.Logger
	refused   metric.Int64Counter
	boundOpts [numBounds][]metric.AddOption

	awaitMu  sync.Mutex
	awaiting map[string]int // scope + retry id → this replica's streams
	awaiters int

	// The FailedStep bounds' counts; used only when limits.tracks().
	mu       sync.Mutex
	tenants  map[string]*tenantCounts
	logged   counts // every tenant's
	reserved counts
	sessions map[string]*trackedSession // stored session id → active session
	// ahead maps a session to the reservations (a list through next) of
	// retries this replica scheduled there that the log has not shown
	// yet: for the log's view, the session has a pending retry. A
	// reservation ends when the log shows an event of its session at or
	// after its sequence — not just any later sequence: a store of
	// several partitions may show a partition's event late, after later
	// ones of other partitions — or at its timeout (sweep).
	ahead     map[string]*Reservation
	nextSweep time.Time
}

// New returns the admission control of l, or nil when l bounds nothing.
// attrBound is the attribute of retryd.admission.refused that names the
// bound a refused call met (pending_retries_per_tenant, …): retryd's own
// attributes live under retryd.*.
const attrBound = attribute.Key("retryd.admission.bound")

// now is the admission's clock; its metrics are made with m (nil: none).
func New(l Limits, now func() time.Time, log *slog.Logger, m metric.Meter) (*Control, error) {
	if !l.Tracks() && l.AwaitersPerRetry <= 0 && l.Awaiters <= 0 {
		return nil, nil
	}
	a := &Control{
		limits: l, now: now, log: log,
		awaiting: make(map[string]int),
		tenants:  make(map[string]*tenantCounts),
		sessions: make(map[string]*trackedSession),
		ahead:    make(map[string]*Reservation),
	}
	if m == nil {
		m = metricnoop.NewMeterProvider().Meter("")
	}
	var err error
	if a.refused, err = m.Int64Counter("retryd.admission.refused", metric.WithUnit("{call}"),
		metric.WithDescription("Calls refused RESOURCE_EXHAUSTED by admission control, by the bound they met.")); err != nil {
		return nil, err
	}
	for b := range numBounds {
		a.boundOpts[b] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrBound.String(bounds[b].id)))}
	}
	pending, err := m.Int64ObservableGauge("retryd.admission.retries.pending", metric.WithUnit("{retry}"),
		metric.WithDescription("Pending retries of every tenant as admission control counts them (from the event log)."))
	if err != nil {
		return nil, err
	}
	chains, err := m.Int64ObservableGauge("retryd.admission.chains.open", metric.WithUnit("{chain}"),
		metric.WithDescription("Open chains of every tenant as admission control counts them (from the event log)."))
	if err != nil {
		return nil, err
	}
	sessions, err := m.Int64ObservableGauge("retryd.admission.sessions.active", metric.WithUnit("{session}"),
		metric.WithDescription("Sessions with an open chain or a pending retry, as admission control counts them."))
	if err != nil {
		return nil, err
	}
	awaiters, err := m.Int64ObservableGauge("retryd.admission.awaiters", metric.WithUnit("{stream}"),
		metric.WithDescription("AwaitRetry streams this replica holds."))
	if err != nil {
		return nil, err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		a.mu.Lock()
		held := a.logged
		a.mu.Unlock()
		a.awaitMu.Lock()
		n := a.awaiters
		a.awaitMu.Unlock()
		o.ObserveInt64(pending, int64(held.pending))
		o.ObserveInt64(chains, int64(held.chains))
		o.ObserveInt64(sessions, int64(held.sessions))
		o.ObserveInt64(awaiters, int64(n))
		return nil
	}, pending, chains, sessions, awaiters)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Refusal is a call refused because it met a bound: nothing was
// recorded, and the caller may try again after RetryDelay.
type Refusal struct {
	// Bound names the bound (retryd.admission.refused's bound attribute,
	// google.rpc.QuotaFailure's quota_id), Limit is its value.
	Bound string
	Limit int
	// Subject is what met it: "server", "tenant:ID" or "retry:ID";
	// Description says what the bound counts; Dimensions name the tenant
	// or the retry.
	Subject, Description string
	Dimensions           map[string]string
}

func (r *Refusal) Error() string {
	who := r.Subject
	if who == "tenant:" {
		who = "the default tenant"
	}
	return "admission refused: " + r.Description + " for " + who + "; nothing was recorded, try again later"
}

// refusal is the refusal of a call that met bound b.
func (a *Control) refusal(b bound, limit int, subject string, dims map[string]string) error {
	a.refused.Add(context.Background(), 1, a.boundOpts[b]...)
	return &Refusal{Bound: bounds[b].id, Limit: limit, Subject: subject,
		Description: fmt.Sprintf("%s: limit %d reached", bounds[b].what, limit), Dimensions: dims}
}

// Await counts one AwaitRetry stream of retryID for the caller's scope
// (the prefix of its tenant's session ids), or refuses it; call leave when
// the stream ends.
func (a *Control) Await(scope, retryID string) (leave func(), err error) {
	if a == nil {
		return func() {}, nil
	}
	key := scope + retryID
	a.awaitMu.Lock()
	defer a.awaitMu.Unlock()
	if l := a.limits.AwaitersPerRetry; l > 0 && a.awaiting[key] >= l {
		return nil, a.refusal(boundAwaitersPerRetry, l, "retry:"+retryID, map[string]string{"retry_id": retryID})
	}
	if l := a.limits.Awaiters; l > 0 && a.awaiters >= l {
		return nil, a.refusal(boundAwaiters, l, "server", nil)
	}
	a.awaiting[key]++
	a.awaiters++
	return func() {
		a.awaitMu.Lock()
		defer a.awaitMu.Unlock()
		if a.awaiting[key]--; a.awaiting[key] <= 0 {
			delete(a.awaiting, key)
		}
		a.awaiters--
	}, nil
}

// Admit admits a validated failure that arrived at now (the admission's
// clock) or refuses it. An admitted failure that may add work holds the
// returned reservation: pass it to Decided.
func (a *Control) Admit(f engine.Failure, now time.Time) (*Reservation, error) {
	if a == nil || !a.limits.Tracks() || f.Policy == nil {
		return nil, nil // no provider: delegated, nothing is held
	}
	req := f.Request
	sid := req.GetSessionId()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweep(now)
	ss := a.sessions[sid]
	if (ss != nil && ss.pending != "") || a.ahead[sid] != nil {
		return nil, nil // a pending retry: refused RETRY_PENDING, or repeated
	}
	need := counts{pending: 1}
	if ss == nil || ss.chain(req.GetProvider(), f.Policy.Key) < 0 {
		need.chains = 1
	}
	if ss == nil {
		need.sessions = 1
	}
	tenantID, _ := tenant.Split(sid)
	t := a.tenants[tenantID]
	if t == nil {
		t = &tenantCounts{id: tenantID}
	}
	if b, limit, over := a.over(t, need); over {
		if !a.mayAdd(f, ss, now) {
			return nil, nil
		}
		if b == boundPending || b == boundChains {
			return nil, a.refusal(b, limit, "server", nil)
		}
		return nil, a.refusal(b, limit, "tenant:"+tenantID, map[string]string{"tenant": tenantID})
	}
	a.tenants[tenantID] = t
	r := &Reservation{session: sid, tenant: t, need: need}
	t.reserved.add(need, 1)
	a.reserved.add(need, 1)
	return r, nil
}

// over returns the first bound that need would pass: the tenant's before
// the server's.
func (a *Control) over(t *tenantCounts, need counts) (bound, int, bool) {
	l := a.limits
	for _, c := range []struct {
		b                   bound
		limit, held, wanted int
	}{
		{boundPendingPerTenant, l.PendingRetriesPerTenant, t.logged.pending + t.reserved.pending, need.pending},
		{boundChainsPerTenant, l.OpenChainsPerTenant, t.logged.chains + t.reserved.chains, need.chains},
		{boundSessionsPerTenant, l.ActiveSessionsPerTenant, t.logged.sessions + t.reserved.sessions, need.sessions},
		{boundPending, l.PendingRetries, a.logged.pending + a.reserved.pending, need.pending},
		{boundChains, l.OpenChains, a.logged.chains + a.reserved.chains, need.chains},
	} {
		if c.limit > 0 && c.wanted > 0 && c.held+c.wanted > c.limit {
			return c.b, c.limit, true
		}
	}
	return 0, 0, false
}

// zeroRand makes Decide choose the shortest delay of its jitter range.
type zeroRand struct{}

func (zeroRand) Float64() float64 { return 0 }

// mayAdd reports whether a failure may schedule a retry, as far as the
// log shows: false only when it certainly cannot (see the comment at the
// top of this file). Called at a bound only.
func (a *Control) mayAdd(f engine.Failure, ss *trackedSession, now time.Time) bool {
	req, p := f.Request, f.Policy
	phase := policy.PhaseOf(req.GetDownstream())
	var retries uint32
	if ss != nil {
		turn, step := req.GetTurn(), req.GetStep()
		if turn < ss.turn || turn == ss.turn && step < ss.step {
			return false // stale
		}
		if turn == ss.turn && step == ss.step && ss.phases&(1<<phase) != 0 {
			return false // repeated (or conflicting): answered from the record
		}
		if i := ss.chain(req.GetProvider(), p.Key); i >= 0 {
			retries = ss.chains[i].retries
		}
	}
	// The engine's decision (policy.AttemptOf) with the shortest delay: if
	// even it misses the deadline, every one does. Fleet protection only
	// turns a schedule into a delegation or a later start, never the
	// reverse.
	return p.Decide(policy.AttemptOf(req, retries, f.RetryAfter), now, zeroRand{}).Schedule
}

// Decided ends an admitted failure's admission: its reservation is
// released at once unless it scheduled a retry the log has not shown yet.
func (a *Control) Decided(r *Reservation, out engine.FailOutcome, err error) {
	if r == nil {
		return
	}
	var seq uint64
	if err == nil && out.Scheduled != nil {
		seq = out.Response.GetEvent().GetSequence()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if ss := a.sessions[r.session]; seq == 0 || ss != nil && seq <= ss.seq {
		a.release(r)
		return
	}
	r.seq, r.until = seq, a.now().Add(reservationTimeout)
	r.next = a.ahead[r.session]
	a.ahead[r.session] = r
}

// release gives back what r reserved. r is in no list of ahead.
func (a *Control) release(r *Reservation) {
	r.tenant.reserved.add(r.need, -1)
	a.reserved.add(r.need, -1)
	a.forgetIdle(r.tenant)
}

// releaseAhead releases the reservations of session id ahead of the log
// that ended reports true for.
func (a *Control) releaseAhead(id string, ended func(*Reservation) bool) {
	head := a.ahead[id]
	if head == nil {
		return
	}
	var kept *Reservation
	for r := head; r != nil; {
		next := r.next
		if ended(r) {
			r.next = nil
			a.release(r)
		} else {
			r.next, kept = kept, r
		}
		r = next
	}
	if kept == nil {
		delete(a.ahead, id)
	} else if kept != head {
		a.ahead[id] = kept
	}
}

// forgetIdle drops a tenant that holds and reserves nothing.
func (a *Control) forgetIdle(t *tenantCounts) {
	if t.logged == (counts{}) && t.reserved == (counts{}) {
		delete(a.tenants, t.id)
	}
}

// Tracks reports whether the FailedStep bounds count the event log: only
// then must Observe see it.
func (a *Control) Tracks() bool { return a != nil && a.limits.Tracks() }

// Observe counts one event of the log, in log order: the admission
// consumer of the service's event-log follower.
func (a *Control) Observe(ev *retrydv1.Event) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id, seq := ev.GetSessionId(), ev.GetSequence()
	if ss := a.apply(ev); ss != nil {
		ss.seq = max(ss.seq, seq)
	}
	a.releaseAhead(id, func(r *Reservation) bool { return r.seq <= seq })
}

// apply changes the counts by one event. It returns the session as the
// counts track it after the event, or nil when they no longer do.
func (a *Control) apply(ev *retrydv1.Event) *trackedSession {
	id := ev.GetSessionId()
	ss := a.sessions[id]
	switch k := ev.GetKind().(type) {
	case *retrydv1.Event_Scheduled:
		sc := k.Scheduled
		if ss == nil {
			tenantID, _ := tenant.Split(id)
			t := a.tenants[tenantID]
			if t == nil {
				t = &tenantCounts{id: tenantID}
				a.tenants[tenantID] = t
			}
			ss = &trackedSession{tenant: t}
			a.sessions[id] = ss
			a.hold(t, counts{sessions: 1}, 1)
		}
		if ss.at(sc.GetTurn(), sc.GetStep()) {
			// Scheduling phases: only declined in always mode; the other
			// modes ignore the phase, so any report of the step repeats.
			if sc.GetMode() == retrydv1.Mode_MODE_ALWAYS {
				ss.phases |= 1 << retrydv1.Downstream_DOWNSTREAM_DECLINED
			} else {
				ss.phases = 0xff
			}
		}
		i := ss.chain(sc.GetProvider(), sc.GetPolicyKey())
		if i < 0 {
			ss.chains = append(ss.chains, trackedChain{provider: sc.GetProvider(), policyKey: sc.GetPolicyKey()})
			i = len(ss.chains) - 1
			a.hold(ss.tenant, counts{chains: 1}, 1)
		}
		ss.chains[i].retries = sc.GetRetryNumber()
		if ss.pending == "" {
			a.hold(ss.tenant, counts{pending: 1}, 1)
		}
		ss.pending, ss.due = sc.GetRetryId(), sc.GetDueAt().AsTime()
	case *retrydv1.Event_Delegated:
		if dg := k.Delegated; ss != nil && ss.at(dg.GetTurn(), dg.GetStep()) {
			if p := policy.PhaseOf(dg.GetDownstream()); p < 8 {
				ss.phases |= 1 << p
			}
		}
	case *retrydv1.Event_Started:
		if ss != nil && ss.pending != "" && ss.pending == k.Started.GetRetryId() {
			ss.pending = ""
			a.hold(ss.tenant, counts{pending: 1}, -1)
		}
	case *retrydv1.Event_Cancelled:
		if ss != nil && ss.pending != "" && ss.pending == k.Cancelled.GetRetryId() {
			ss.pending = ""
			a.hold(ss.tenant, counts{pending: 1}, -1)
		}
	case *retrydv1.Event_Closed:
		if ss != nil {
			if i := ss.chain(k.Closed.GetProvider(), k.Closed.GetPolicyKey()); i >= 0 {
				ss.chains = append(ss.chains[:i], ss.chains[i+1:]...)
				a.hold(ss.tenant, counts{chains: 1}, -1)
			}
		}
	}
	if ss == nil {
		return nil
	}
	ss.last = ev.GetTime().AsTime()
	if ss.pending == "" && len(ss.chains) == 0 {
		a.untrack(id, ss)
		return nil
	}
	return ss
}

// hold changes what the log shows t (and everyone) holding.
func (a *Control) hold(t *tenantCounts, d counts, sign int) {
	t.logged.add(d, sign)
	a.logged.add(d, sign)
}

// untrack forgets a session that holds nothing more (or that the backstop
// gave up on), with whatever it still held.
func (a *Control) untrack(id string, ss *trackedSession) {
	held := counts{chains: len(ss.chains), sessions: 1}
	if ss.pending != "" {
		held.pending = 1
	}
	a.hold(ss.tenant, held, -1)
	delete(a.sessions, id)
	a.forgetIdle(ss.tenant)
}

// sweepInterval bounds how often sweep looks for what the log never ended.
func (a *Control) sweepInterval() time.Duration {
	return min(max(a.limits.Forget/16, time.Second), time.Minute)
}

// sweep releases reservations whose decision the log never showed, and
// (with Limits.Forget) stops counting sessions whose end it never showed.
// It looks at most once per sweepInterval.
func (a *Control) sweep(now time.Time) {
	if now.Before(a.nextSweep) {
		return
	}
	a.nextSweep = now.Add(a.sweepInterval())
	for id := range a.ahead {
		a.releaseAhead(id, func(r *Reservation) bool { return now.After(r.until) })
	}
	forget := a.limits.Forget
	if forget <= 0 {
		return
	}
	forgotten := 0
	for id, ss := range a.sessions {
		since := ss.last
		if ss.pending != "" && ss.due.After(since) {
			since = ss.due
		}
		if now.Sub(since) > forget {
			a.untrack(id, ss)
			forgotten++
		}
	}
	if forgotten > 0 {
		a.log.Warn("admission control forgot active sessions whose end the event log never showed",
			"sessions", forgotten, "forget_after", forget)
	}
}
