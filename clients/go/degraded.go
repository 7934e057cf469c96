package retryd

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Defaults of degraded mode.
const (
	// DefaultDecisionTimeout bounds how long Recover waits for a FailedStep
	// answer before it decides locally.
	DefaultDecisionTimeout = 3 * time.Second
	// DefaultLocalRetryBudget bounds the local retries of one chain under
	// a policy without a finite budget (always mode, unbounded schedule
	// mode).
	DefaultLocalRetryBudget = 5
	// DefaultLocalChains bounds how many local chains the client keeps;
	// the least recently used is dropped first.
	DefaultLocalChains = 10_000
)

// LocalRetryPrefix starts the id of every retry a client scheduled
// locally; retryd never issues one.
const LocalRetryPrefix = "local-"

// LocalDetailPrefix starts the detail of every event record of a local
// decision.
const LocalDetailPrefix = "decided locally: "

// unreachable reports whether err from a FailedStep bounded by the
// decision timeout means that no replica answered: UNAVAILABLE (after
// gRPC's own retries) or a deadline that was the timeout's, not ctx's.
func unreachable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// localChain is the client's copy of one (session, provider, policy key)
// chain: how many retries it scheduled, and the last step it decided (a
// re-report of that step gets the same decision, as from the server).
type localChain struct {
	key     chainKey
	retries uint32
	step    stepKey
	last    *Outcome
}

type chainKey struct{ session, provider, policyKey string }

type stepKey struct {
	turn, step uint64
	downstream retrydv1.Downstream // as far as it decides (Policy.DecidingPhase)
}

// localState is what degraded mode keeps in the process: the chains, a
// bounded LRU, and the retries that were started without the server.
type localState struct {
	mu       sync.Mutex
	max      int
	lru      *list.List // of *localChain, most recent first
	chains   map[chainKey]*list.Element
	sessions map[string]map[chainKey]struct{}
	// started are retry ids (server-scheduled) the client started by
	// itself, and sessions with a local decision since the server's last
	// answer: both let a later RETRY_PENDING be resolved (see
	// resolvePending). Bounded like the chains.
	started  map[string]string // retry id -> session
	degraded map[string]struct{}
	cache    *policy.Cache
}

func newLocalState(maxChains int) *localState {
	return &localState{
		max:      maxChains,
		lru:      list.New(),
		chains:   make(map[chainKey]*list.Element),
		sessions: make(map[string]map[chainKey]struct{}),
		started:  make(map[string]string),
		degraded: make(map[string]struct{}),
		cache:    policy.NewCache(0),
	}
}

// chain returns the chain of key, creating it (and dropping the least
// recently used one when full). Callers hold s.mu.
func (s *localState) chain(key chainKey) *localChain {
	if e, ok := s.chains[key]; ok {
		s.lru.MoveToFront(e)
		return e.Value.(*localChain)
	}
	for s.lru.Len() >= s.max {
		s.drop(s.lru.Back().Value.(*localChain).key)
	}
	ch := &localChain{key: key}
	s.chains[key] = s.lru.PushFront(ch)
	if s.sessions[key.session] == nil {
		s.sessions[key.session] = make(map[chainKey]struct{})
	}
	s.sessions[key.session][key] = struct{}{}
	return ch
}

func (s *localState) drop(key chainKey) {
	if e, ok := s.chains[key]; ok {
		s.lru.Remove(e)
		delete(s.chains, key)
	}
	if m := s.sessions[key.session]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(s.sessions, key.session)
			delete(s.degraded, key.session)
		}
	}
}

// closeSession forgets every chain of the session (StepSucceeded,
// CancelSession).
func (s *localState) closeSession(session string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.sessions[session] {
		s.drop(key)
	}
	delete(s.degraded, session)
	for id, sess := range s.started {
		if sess == session {
			delete(s.started, id)
		}
	}
}

// observe follows a server decision: a schedule sets its chain's count to
// the server's retry number, so that local decisions continue from it; a
// budget_exhausted delegation closed the chain on the server.
func (s *localState) observe(req *retrydv1.FailedStepRequest, resp *retrydv1.FailedStepResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.degraded, req.GetSessionId())
	switch d := resp.GetDecision().GetOutcome().(type) {
	case *retrydv1.Decision_Schedule:
		ch := s.chain(chainKey{req.GetSessionId(), req.GetProvider(), d.Schedule.GetPolicyKey()})
		ch.retries, ch.step, ch.last = d.Schedule.GetRetryNumber(), stepKey{}, nil
	case *retrydv1.Decision_Delegate:
		if d.Delegate.GetReason() == retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED {
			s.drop(chainKey{req.GetSessionId(), req.GetProvider(), resp.GetEvent().GetDelegated().GetPolicyKey()})
		}
	}
}

// startedLocally records that the client started the server's retry id by
// itself.
func (s *localState) startedLocally(session, retryID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.started) >= s.max {
		for id := range s.started {
			delete(s.started, id)
			break
		}
	}
	s.started[retryID] = session
}

// resolved forgets a retry started without retryd once retryd recorded
// it.
func (s *localState) resolved(retryID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.started, retryID)
}

// ownsPending reports whether a RETRY_PENDING for retryID in session is
// the server's side of something the client already did without it: a
// retry of the server's that the client started by itself, or a report
// the server scheduled while the client, without its answer, decided
// locally.
func (s *localState) ownsPending(session, retryID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.started[retryID]; ok {
		return true
	}
	_, ok := s.degraded[session]
	return ok
}

// localPolicy resolves the policy a local decision uses: the request's
// inline policy; else the one WithLocalPolicies names for its
// policy_name, or for its provider; else retryd's built-in default.
func (c *Client) localPolicy(req *retrydv1.FailedStepRequest) (*policy.Policy, error) {
	p := req.GetPolicy()
	if p == nil {
		if name := req.GetPolicyName(); name != "" {
			p = c.opts.localPolicies[name]
		} else {
			p = c.opts.localPolicies[req.GetProvider()]
		}
	}
	if p == nil {
		return defaultPolicy, nil
	}
	pol, err := c.local.cache.Resolve(p)
	if err != nil {
		return nil, fmt.Errorf("retryd: local policy: %w", err)
	}
	return pol, nil
}

var defaultPolicy = func() *policy.Policy {
	p, err := policy.Resolve(nil)
	if err != nil {
		panic(err)
	}
	return p
}()

// localCap is the most retries a local chain schedules under pol.
func (c *Client) localCap(pol *policy.Policy) uint32 {
	switch {
	case pol.Bounded && c.opts.localBudgetSet:
		return min(pol.MaxRetries, c.opts.localBudget)
	case pol.Bounded:
		return pol.MaxRetries
	}
	return c.opts.localBudget
}

// jitter is the local decisions' jitter source.
type jitter struct{}

func (jitter) Float64() float64 { return mrand.Float64() }

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

func localRetryID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return LocalRetryPrefix + idEncoding.EncodeToString(b[:])
}

// decideLocally decides a failed step in the process, with the same
// policy semantics as the server, within the local cap. cause is the
// error that made the server unreachable.
func (c *Client) decideLocally(req *retrydv1.FailedStepRequest, now time.Time, cause error) (Outcome, error) {
	out := Outcome{Local: true, Unreachable: cause}
	f := req.GetFailure()
	phase := policy.PhaseOf(req.GetDownstream()) // as the server records it
	detail := func(s string) string {
		return LocalDetailPrefix + s + " (retryd unreachable: " + status.Convert(cause).Message() + ")"
	}
	delegated := func(reason retrydv1.DelegateReason, why, key string, mode retrydv1.Mode) (Outcome, error) {
		out.Delegate = &retrydv1.Delegate{Reason: reason, Detail: detail(why)}
		out.Event = &retrydv1.Event{SessionId: req.GetSessionId(), Time: timestamppb.New(now),
			Kind: &retrydv1.Event_Delegated{Delegated: &retrydv1.RetryDelegated{
				Turn: req.GetTurn(), Step: req.GetStep(), Provider: req.GetProvider(), PolicyKey: key, Mode: mode,
				Failure: f, Reason: reason, Detail: out.Delegate.Detail, Downstream: phase,
			}}}
		return out, nil
	}
	if req.GetProvider() == "" {
		return delegated(retrydv1.DelegateReason_DELEGATE_REASON_NO_PROVIDER,
			"the failure happened before any provider adapter was selected", "", retrydv1.Mode_MODE_UNSPECIFIED)
	}
	pol, err := c.localPolicy(req)
	if err != nil {
		return Outcome{}, err
	}
	key := chainKey{req.GetSessionId(), req.GetProvider(), pol.Key}
	// The same step means the same report where the phase decides nothing,
	// as on the server (its step records).
	step := stepKey{req.GetTurn(), req.GetStep(), pol.DecidingPhase(req.GetDownstream())}

	c.local.mu.Lock()
	defer c.local.mu.Unlock()
	c.local.degraded[req.GetSessionId()] = struct{}{}
	ch := c.local.chain(key)
	if ch.last != nil && ch.step == step {
		return *ch.last, nil // the same step reported again: the same decision
	}
	a := policy.AttemptOf(req, ch.retries, policy.ProviderRetryAfter(f.ProviderRetryAfterMs, f.RetryAfter, now))
	d := pol.Decide(a, now, jitter{})
	if d.Schedule && ch.retries >= c.localCap(pol) {
		d = policy.Decision{Reason: retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED,
			Detail: fmt.Sprintf("%d of the local cap of %d retries used", ch.retries, c.localCap(pol))}
	}
	if !d.Schedule {
		if d.Reason == retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED {
			ch.retries = 0 // the chain closes, as on the server
		}
		o, err := delegated(d.Reason, d.Detail, pol.Key, pol.Mode)
		ch.step, ch.last = step, &o
		return o, err
	}
	ch.retries = d.RetryNumber
	due := now.Add(time.Duration(d.DelayMs) * time.Millisecond)
	id := localRetryID()
	out.Schedule = &retrydv1.Schedule{RetryId: id, RetryNumber: d.RetryNumber, DelayMs: d.DelayMs,
		DelaySource: d.Source, DueAt: timestamppb.New(due), PolicyKey: pol.Key, Mode: pol.Mode,
		Detail: detail("the policy's delay")}
	sched := &retrydv1.RetryScheduled{RetryId: id, Turn: req.GetTurn(), Step: req.GetStep(),
		LogicalTurnId: req.GetLogicalTurnId(), Provider: req.GetProvider(), Mode: pol.Mode, PolicyKey: pol.Key,
		Failure: f, RetryNumber: d.RetryNumber, DelayMs: d.DelayMs, DelaySource: d.Source,
		DueAt: out.Schedule.DueAt, Policy: pol.Proto(), Detail: out.Schedule.Detail}
	if pol.Bounded {
		out.Schedule.MaxRetries, sched.MaxRetries = &pol.MaxRetries, &pol.MaxRetries
	}
	out.Event = &retrydv1.Event{SessionId: req.GetSessionId(), Time: timestamppb.New(now),
		Kind: &retrydv1.Event_Scheduled{Scheduled: sched}}
	ch.step, ch.last = step, &out
	return out, nil
}

// waitLocally backs off a local retry and confirms its start, or cancels
// it when ctx ends first.
func waitLocally(ctx context.Context, out Outcome) (Outcome, error) {
	s := out.Event.GetScheduled()
	if err := sleep(ctx, time.Until(out.Schedule.GetDueAt().AsTime())); err != nil {
		out.Cancelled = &retrydv1.RetryCancelled{RetryId: s.GetRetryId(), Reason: retrydv1.CancelReason_CANCEL_REASON_REQUESTED,
			Turn: s.GetTurn(), Step: s.GetStep(), RetryNumber: s.GetRetryNumber()}
		return out, err
	}
	out.Retry = true
	out.Started = &retrydv1.RetryStarted{RetryId: s.GetRetryId(), Turn: s.GetTurn(), Step: s.GetStep(),
		RetryNumber: s.GetRetryNumber(), StartedAt: timestamppb.Now()}
	return out, nil
}
