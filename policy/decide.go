package policy

import (
	"fmt"
	"math"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Rand is the jitter source: Float64 returns a number in [0, 1). Tests pass
// a fixed value to state exact delays; the server passes math/rand/v2.
type Rand interface {
	Float64() float64
}

// Attempt is everything about one failure that a decision depends on,
// besides the policy.
type Attempt struct {
	// Retries is how many retries the chain has already scheduled.
	Retries uint32
	// Code is the canonical failure code.
	Code string
	// RetryAfter is the provider's delay instruction, when it gave a valid
	// one (see ParseRetryAfter).
	RetryAfter RetryAfter
	// Downstream is always mode's handshake phase.
	Downstream retrydv1.Downstream
	// Replay says whether re-sending the request is acceptable.
	Replay retrydv1.Replay
	// Deadline is the logical operation's deadline, when HasDeadline.
	// (A flag, not the zero time: the zero time is a valid, long-past
	// deadline.)
	Deadline    time.Time
	HasDeadline bool
}

// Decision is the outcome of Decide: Schedule, or delegate with a Reason.
type Decision struct {
	Schedule bool

	// For a scheduled retry.
	RetryNumber uint32
	DelayMs     uint64
	Source      retrydv1.DelaySource

	// For a delegation.
	Reason retrydv1.DelegateReason
	Detail string
}

func delegate(reason retrydv1.DelegateReason, format string, args ...any) Decision {
	if len(args) == 0 {
		return Decision{Reason: reason, Detail: format} // a constant: no copy
	}
	return Decision{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Decide applies the policy to one failure. The checks run in this order,
// and the first that applies decides: ABORTED (code_not_retryable), unsafe
// replay (replay_unsafe), always mode's downstream handshake
// (downstream_first, downstream_handled), code eligibility
// (code_not_retryable), the finite budget (budget_exhausted), the local or
// provider delay (retry_after_over_cap), and the deadline (deadline).
func (p *Policy) Decide(a Attempt, now time.Time, rng Rand) Decision {
	if a.Code == CodeAborted {
		return delegate(retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE,
			"ABORTED is never retried: cancellation stays terminal")
	}
	if a.Replay == retrydv1.Replay_REPLAY_UNSAFE {
		return delegate(retrydv1.DelegateReason_DELEGATE_REASON_REPLAY_UNSAFE,
			"the caller marked the request unsafe to replay; reconcile its outcome before trying again")
	}
	if p.Mode == retrydv1.Mode_MODE_ALWAYS {
		switch a.Downstream {
		case retrydv1.Downstream_DOWNSTREAM_DECLINED:
		case retrydv1.Downstream_DOWNSTREAM_HANDLED:
			return delegate(retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED,
				"a downstream recovery policy handled the failure; no retry scheduled")
		default:
			return delegate(retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST,
				"always mode asks downstream recovery first; report the step again with downstream DECLINED or HANDLED")
		}
	}
	if !p.Retryable(a.Code) {
		return delegate(retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE,
			"code %s is not retryable under policy %s", a.Code, p.Key)
	}
	if a.Retries == math.MaxUint32 {
		return delegate(retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED,
			"the chain's retry counter is exhausted (%d retries)", a.Retries)
	}
	if p.Bounded && a.Retries >= p.MaxRetries {
		return delegate(retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED,
			"%d of %d retries used", a.Retries, p.MaxRetries)
	}
	d := Decision{Schedule: true, RetryNumber: a.Retries + 1}
	d.DelayMs, d.Source = p.localDelay(d.RetryNumber, rng)
	if ra := a.RetryAfter; ra.Valid {
		overCap := ra.Over || ra.Ms > p.DelayCapMs()
		honorable := !ra.Over && ra.Ms <= MaxDelayMs
		switch {
		case !overCap:
			d.DelayMs, d.Source = ra.Ms, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER
		case p.OverCap == retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_HONOR && honorable:
			d.DelayMs, d.Source = ra.Ms, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER
		case p.OverCap == retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_LOCAL,
			p.OverCap == retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_HONOR && p.Mode != retrydv1.Mode_MODE_NORMAL:
			// Keep the local delay: unlimited modes must not end on a provider
			// instruction, even one too large to honour.
		default:
			return delegate(retrydv1.DelegateReason_DELEGATE_REASON_RETRY_AFTER_OVER_CAP,
				"provider asked for %s, over the policy's cap of %d ms", ra, p.DelayCapMs())
		}
	}
	if a.HasDeadline {
		need := time.Duration(d.DelayMs+p.MinAttemptMs) * time.Millisecond
		if left := a.Deadline.Sub(now); left < need {
			return delegate(retrydv1.DelegateReason_DELEGATE_REASON_DEADLINE,
				"a %d ms delay plus a %d ms attempt does not fit the %d ms left before the deadline",
				d.DelayMs, p.MinAttemptMs, max(left.Milliseconds(), 0))
		}
	}
	return d
}

// localDelay is the policy's own delay for retry n (1-based).
func (p *Policy) localDelay(n uint32, rng Rand) (uint64, retrydv1.DelaySource) {
	if p.Mode == retrydv1.Mode_MODE_SCHEDULE {
		if int(n) <= len(p.Schedule) {
			return p.Schedule[n-1], retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE
		}
		return p.TailDelayMs, retrydv1.DelaySource_DELAY_SOURCE_TAIL
	}
	lo, hi := p.BackoffBounds(n)
	u := rng.Float64()
	if u < 0 || u >= 1 || math.IsNaN(u) {
		u = 0
	}
	return lo + uint64(math.Round(u*float64(hi-lo))), retrydv1.DelaySource_DELAY_SOURCE_BACKOFF
}

// BackoffBase is the unjittered backoff delay of retry n (1-based):
// min(initial * multiplier^(n-1), max).
func (p *Policy) BackoffBase(n uint32) float64 {
	base := float64(p.InitialDelayMs) * math.Pow(p.Multiplier, float64(n)-1)
	return math.Min(base, float64(p.MaxDelayMs))
}

// BackoffBounds is the closed range of jittered delays for retry n, in
// whole milliseconds: [base*(1-r), min(base*(1+r), max)] for symmetric
// jitter, [0, base] for full jitter.
func (p *Policy) BackoffBounds(n uint32) (lo, hi uint64) {
	base := p.BackoffBase(n)
	if p.Jitter == retrydv1.Jitter_JITTER_FULL {
		return 0, uint64(math.Floor(base))
	}
	lo = uint64(math.Ceil(base * (1 - p.JitterRatio)))
	hi = uint64(math.Floor(math.Min(base*(1+p.JitterRatio), float64(p.MaxDelayMs))))
	if hi < lo { // only when rounding crosses on a tiny base
		hi = lo
	}
	return lo, hi
}
