package sim

import (
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
)

// Local is a Decider made of retryd's pure parts: policy.Resolve and
// policy.Decide per agent, one fleet.ProviderState per provider, and the
// little chain bookkeeping the engine does (retry numbers, the pending
// retry, whether the last started retry was a probe): the calls the
// service makes on the same package (service/fleet.go), without storage or
// gRPC. Two differences from the service: the service counts every report
// of a half-open provider as a probe's outcome (it does not track which
// started retry was a probe), and its start gate does not know a retry's
// deadline (it holds, never cancels).
//
// Randomness is split so that no provider's traffic can change another's
// numbers: each session draws jitter from its own source, each provider
// spreads from its own.
type Local struct {
	cfg       fleet.Config
	seed      uint64
	providers map[string]*localProvider
	sessions  map[string]*localSession
	pending   map[string]*localPending
	policies  map[*retrydv1.RetryPolicy]*policy.Policy
}

// LocalStats counts what Local did for one provider, beyond what the agents
// see.
type LocalStats struct {
	// Admitted retries, and how many of them took a budget token.
	Admitted, WithToken int
	// Probes started.
	Probes int
	// Held counts Start answers that held a due retry back.
	Held int
}

type localProvider struct {
	state fleet.ProviderState
	rng   *rand.Rand
	stats LocalStats
}

type localSession struct {
	retries uint32 // retries scheduled in the open chain
	probe   bool   // the last started retry was a probe
	rng     *rand.Rand
	n       int
}

type localPending struct {
	session, provider string
	pending           fleet.Pending
}

var _ Decider = (*Local)(nil)

// NewLocal returns a Local with fleet configuration cfg for every provider,
// its random sources seeded from seed.
func NewLocal(cfg fleet.Config, seed uint64) *Local {
	return &Local{
		cfg: cfg, seed: seed,
		providers: map[string]*localProvider{},
		sessions:  map[string]*localSession{},
		pending:   map[string]*localPending{},
		policies:  map[*retrydv1.RetryPolicy]*policy.Policy{},
	}
}

// Stats returns the counters of one provider.
func (l *Local) Stats(provider string) LocalStats { return l.provider(provider).stats }

// Snapshot reads one provider's fleet state.
func (l *Local) Snapshot(provider string, now time.Time) fleet.Snapshot {
	return l.provider(provider).state.Snapshot(l.cfg, now)
}

// FailedStep records the failure with the provider's fleet state, decides it
// with the agent's policy and, when the policy schedules, asks the fleet.
func (l *Local) FailedStep(now time.Time, f Failure) Decision {
	p, s := l.provider(f.Provider), l.session(f.Session)
	pol := l.policy(f.Policy)
	ra := policy.ProviderRetryAfter(f.RetryAfterMs, nil, now)
	// Always mode reports a step twice (downstream first, then declined);
	// the provider failed once.
	if fleet.ProviderFault(f.Code) && f.Downstream != retrydv1.Downstream_DOWNSTREAM_DECLINED {
		p.state.Failed(l.cfg, now, fleet.Failure{Probe: s.probe, RetryAfter: fleet.RetryAfterOf(ra)})
		s.probe = false
	}
	a := policy.Attempt{Retries: s.retries, Code: f.Code, RetryAfter: ra, Downstream: f.Downstream, Replay: retrydv1.Replay_REPLAY_SAFE}
	d := pol.Decide(a, now, s.rng)
	if !d.Schedule {
		if d.Reason == retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED {
			s.retries = 0 // the chain closes on exhaustion
		}
		return Decision{Reason: enumName(d.Reason.String(), "DELEGATE_REASON_")}
	}
	r := fleet.RetryOf(pol, d, a)
	v := p.state.Admit(l.cfg, now, r, p.rng)
	if v.Delegate {
		return Decision{Reason: v.Reason.String()}
	}
	p.stats.Admitted++
	if v.Token {
		p.stats.WithToken++
	}
	s.retries++
	s.n++
	id := f.Session + "/" + strconv.Itoa(s.n)
	l.pending[id] = &localPending{session: f.Session, provider: f.Provider, pending: fleet.Pending{Latest: r.Latest, HasLatest: r.HasLatest}}
	src := v.Source.String()
	if v.Source == fleet.SourcePolicy {
		src = enumName(d.Source.String(), "DELAY_SOURCE_")
	}
	return Decision{Schedule: true, RetryID: id, DueAt: now.Add(v.Delay), Source: src}
}

// AwaitStart asks the provider's fleet state whether the due retry starts.
func (l *Local) AwaitStart(now time.Time, retryID string) Start {
	pr, ok := l.pending[retryID]
	if !ok {
		return Start{Cancelled: true}
	}
	p := l.provider(pr.provider)
	v := p.state.Start(l.cfg, now, pr.pending, p.rng)
	switch v.Action {
	case fleet.StartLater:
		p.stats.Held++
		return Start{At: v.At}
	case fleet.StartNever:
		delete(l.pending, retryID)
		return Start{Cancelled: true}
	}
	delete(l.pending, retryID)
	l.session(pr.session).probe = v.Probe
	if v.Probe {
		p.stats.Probes++
	}
	return Start{Now: true}
}

// StepSucceeded closes the session's chain and credits the provider.
func (l *Local) StepSucceeded(now time.Time, sc Success) {
	s := l.session(sc.Session)
	l.provider(sc.Provider).state.Succeeded(l.cfg, now, fleet.Success{Probe: s.probe})
	s.retries, s.probe = 0, false
}

func (l *Local) provider(name string) *localProvider {
	p, ok := l.providers[name]
	if !ok {
		p = &localProvider{rng: rand.New(rand.NewPCG(l.seed, hash("provider/"+name)))}
		l.providers[name] = p
	}
	return p
}

func (l *Local) session(id string) *localSession {
	s, ok := l.sessions[id]
	if !ok {
		s = &localSession{rng: rand.New(rand.NewPCG(l.seed, hash("session/"+id)))}
		l.sessions[id] = s
	}
	return s
}

func (l *Local) policy(p *retrydv1.RetryPolicy) *policy.Policy {
	if r, ok := l.policies[p]; ok {
		return r
	}
	r, err := policy.Resolve(p)
	if err != nil {
		panic("sim: invalid scenario policy: " + err.Error()) // a scenario is code, not input
	}
	l.policies[p] = r
	return r
}

func hash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func enumName(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }
