package fleet

import (
	"slices"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
)

// Failure is one failed request to the provider, first attempt or retry.
type Failure struct {
	// Probe is set when the failed attempt was a half-open probe
	// (StartVerdict.Probe of the retry that made it).
	Probe bool
	// RetryAfter is the provider's Retry-After on this failure, 0 when
	// none (RetryAfterOf converts a parsed one).
	RetryAfter time.Duration
}

// Failed records a failure of the provider: it counts in the failure rate
// (and may open the circuit), a probe's failure reopens a half-open
// circuit, and a Retry-After raises the fleet's earliest start. Report only
// failures that say something about the provider's health (ProviderFault),
// once per failed request, before Admit.
func (s *ProviderState) Failed(cfg Config, now time.Time, f Failure) {
	s.advance(cfg, now)
	s.record(cfg, now, true)
	if cfg.MaxFleetRetryAfter > 0 && f.RetryAfter > 0 {
		s.PacedUntil = laterOf(s.PacedUntil, now.Add(min(f.RetryAfter, cfg.MaxFleetRetryAfter)))
	}
	switch {
	case cfg.DisableCircuit:
	case s.Circuit == HalfOpen && f.Probe:
		s.open(cfg, now)
	case s.Circuit == Closed && s.tripped(cfg, now):
		s.open(cfg, now)
	}
}

// Success is one successful request to the provider.
type Success struct {
	// Probe is set when the attempt was a half-open probe.
	Probe bool
}

// Succeeded records a success (StepSucceeded): it counts in the failure
// rate, adds SuccessCredit to the budget, and a probe's success closes a
// half-open circuit.
func (s *ProviderState) Succeeded(cfg Config, now time.Time, r Success) {
	s.advance(cfg, now)
	s.record(cfg, now, false)
	s.credit(cfg)
	if s.Circuit == HalfOpen && r.Probe {
		s.close()
	}
}

// ProviderFault reports whether a failure code says something about the
// provider's health, and so counts in its failure rate: the transient codes
// normal mode retries by default (rate limits, 5xx, timeouts, transport
// errors, empty completions). A request the caller got wrong (an invalid
// request, a bad credential) says nothing about the provider.
func ProviderFault(code string) bool {
	return slices.Contains(policy.DefaultNormalCodes, code)
}

// RetryAfterOf converts a parsed provider Retry-After for Failure; one too
// large to represent counts as the longest (Failed bounds it by
// MaxFleetRetryAfter).
func RetryAfterOf(ra policy.RetryAfter) time.Duration {
	switch {
	case !ra.Valid:
		return 0
	case ra.Over || ra.Ms > uint64(MaxDuration/time.Millisecond):
		return MaxDuration
	}
	return time.Duration(ra.Ms) * time.Millisecond
}

// RetryOf describes a retry the policy p scheduled (decision d for attempt
// a) for Admit. Always and schedule modes must not end on a fleet limit;
// normal mode may.
func RetryOf(p *policy.Policy, d policy.Decision, a policy.Attempt) Retry {
	ms := func(n uint64) time.Duration { return time.Duration(n) * time.Millisecond }
	r := Retry{Delay: ms(d.DelayMs), Cap: ms(p.DelayCapMs()), MustNotEnd: p.Mode != retrydv1.Mode_MODE_NORMAL}
	if a.HasDeadline {
		r.Latest, r.HasLatest = a.Deadline.Add(-ms(p.MinAttemptMs)), true
	}
	return r
}

// Rand is the random source of the spread window's phase; the same as
// policy's jitter source (tests pass a fixed value, the server
// math/rand/v2).
type Rand = policy.Rand
