package sim

import (
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
)

// The seeds' two policies: the harness's built-in normal mode (two retries,
// 500 ms to 10 s backoff) and the dsh-llm-retry README's always mode
// (unlimited, 1 s to 30 s backoff, 20 % jitter).
var (
	NormalPolicy = &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_NORMAL}
	AlwaysPolicy = &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS, Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(1000), MaxDelayMs: proto.Uint64(30000), JitterRatio: proto.Float64(0.2),
	}}
)

// The outage: the provider fails every request for 60 s, from 10 s
// into the run (after the budget and the window reached their healthy
// steady state) to 70 s; the run goes on to 130 s.
const (
	OutageStart = 10 * time.Second
	OutageEnd   = 70 * time.Second
	RunFor      = 130 * time.Second
)

// Outage is the scenario: 1 000 agents with the given policy against
// one provider ("deepseek") that fails from OutageStart to OutageEnd, half
// its failures 429 with a 2 s Retry-After, and 1 % of its requests failing
// otherwise. A request takes 2 s to succeed or 200 ms to fail; each agent
// starts an operation every 3 s, so the provider gets about 333 first
// attempts per second, healthy or not.
func Outage(p *retrydv1.RetryPolicy) Scenario {
	return Scenario{
		Agents: 1000,
		Providers: []Provider{{Name: "deepseek", OutageStart: OutageStart, OutageEnd: OutageEnd,
			RetryAfter: 2 * time.Second, BackgroundFailure: 0.01}},
		Policy:         p,
		Duration:       RunFor,
		SuccessLatency: 2 * time.Second, FailureLatency: 200 * time.Millisecond, Period: 3 * time.Second,
		Seed: 1,
	}
}

// Neighbours is Outage with a second, healthy provider ("healthy") beside
// the failing one, each serving half of 2 000 agents. With failing false
// the first provider is healthy too: the baseline the healthy one's numbers
// must equal.
func Neighbours(p *retrydv1.RetryPolicy, failing bool) Scenario {
	sc := Outage(p)
	sc.Agents = 2000
	sick := sc.Providers[0]
	if !failing {
		sick.OutageStart, sick.OutageEnd = 0, 0
	}
	sc.Providers = []Provider{sick, {Name: "healthy", BackgroundFailure: 0.01}}
	return sc
}

// Protection is a named fleet configuration the simulation compares.
type Protection struct {
	Name   string
	Config fleet.Config
}

// Protections are the configurations of the docs' table: none (each agent's
// policy alone), the budget alone, everything at its defaults, and
// everything but the spread window.
func Protections() []Protection {
	off := fleet.DefaultConfig()
	off.DisableBudget, off.DisableCircuit, off.MaxFleetRetryAfter = true, true, 0
	budget := off
	budget.DisableBudget = false
	noSpread := fleet.DefaultConfig()
	noSpread.SpreadWindow = 0
	return []Protection{
		{"policy only", off},
		{"budget", budget},
		{"fleet (defaults)", fleet.DefaultConfig()},
		{"fleet, no spread", noSpread},
	}
}
