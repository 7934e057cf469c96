package invariant

import (
	"math"
	"slices"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// maxTimerDelayMs is the longest delay a timer can wait: the largest signed
// 32-bit number of milliseconds.
const maxTimerDelayMs = math.MaxInt32

// Documented policy defaults, applied when a resolved policy omits a field.
const (
	defaultInitialDelayMs = 500
	defaultMaxDelayMs     = 10000
	defaultMultiplier     = 2
	defaultJitterRatio    = 0.1
	defaultTailDelayMs    = 20000
)

var defaultSchedule = []uint64{2000, 5000, 5000, 5000, 10000}

// checkBounds checks the mode-specific bounds of a scheduled retry against
// the resolved policy it carries.
func checkBounds(r *reporter, sc *retrydv1.RetryScheduled, subject string) {
	mode := normalMode(sc.GetMode())
	switch mode {
	case retrydv1.Mode_MODE_NORMAL, retrydv1.Mode_MODE_ALWAYS, retrydv1.Mode_MODE_SCHEDULE:
	default:
		r.add(RuleModeInvalid, "%s has unknown mode %v", subject, sc.GetMode())
		return
	}
	p := sc.GetPolicy()
	if p != nil && normalMode(p.GetMode()) != mode {
		r.add(RuleModeInvalid, "%s has mode %v but its policy has mode %v", subject, mode, normalMode(p.GetMode()))
	}

	n := sc.GetRetryNumber()
	switch {
	case mode == retrydv1.Mode_MODE_NORMAL && sc.MaxRetries == nil:
		r.add(RuleMaxRetriesBound, "%s is retry %d in normal mode without max_retries", subject, n)
	case mode == retrydv1.Mode_MODE_ALWAYS && sc.MaxRetries != nil:
		r.add(RuleMaxRetriesBound, "%s is retry %d in always mode, which is unlimited, but has max_retries %d",
			subject, n, sc.GetMaxRetries())
	case sc.MaxRetries != nil && n > sc.GetMaxRetries():
		r.add(RuleMaxRetriesBound, "%s is retry %d, over max_retries %d", subject, n, sc.GetMaxRetries())
	}

	delay := sc.GetDelayMs()
	if delay > maxTimerDelayMs {
		r.add(RuleDelayOutOfBounds, "%s waits %d ms, over the timer limit of %d ms", subject, delay, maxTimerDelayMs)
	}
	source := sc.GetDelaySource()
	if !sourceAllowed(mode, source) {
		r.add(RuleDelaySourceInvalid, "%s has delay source %v, not allowed in %v", subject, source, mode)
		return
	}
	if p == nil {
		return // reported as a missing field
	}
	switch source {
	case retrydv1.DelaySource_DELAY_SOURCE_BACKOFF:
		if n == 0 {
			return // reported as a wrong retry number
		}
		if lo, hi, ok := backoffRange(p.GetBackoff(), n); ok && (delay < lo || delay > hi) {
			r.add(RuleDelayOutOfBounds, "%s is retry %d with backoff delay %d ms, outside the jitter range [%d, %d] ms",
				subject, n, delay, lo, hi)
		}
	case retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER:
		if p.GetRetryAfterOverCap() == retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_HONOR {
			return
		}
		if limit := retryAfterCap(mode, p); delay > limit {
			r.add(RuleDelayOutOfBounds, "%s is retry %d waiting the provider's %d ms, over the policy's cap of %d ms",
				subject, n, delay, limit)
		}
	case retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE:
		schedule := scheduleOf(p)
		switch {
		case n == 0:
		case uint64(n) > uint64(len(schedule)):
			r.add(RuleDelaySourceInvalid, "%s is retry %d but the schedule has only %d entries", subject, n, len(schedule))
		case delay != schedule[n-1]:
			r.add(RuleDelayOutOfBounds, "%s is retry %d waiting %d ms, but schedule entry %d is %d ms",
				subject, n, delay, n, schedule[n-1])
		}
	case retrydv1.DelaySource_DELAY_SOURCE_FLEET_BUDGET, retrydv1.DelaySource_DELAY_SOURCE_CIRCUIT_OPEN,
		retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_PACING:
		// Fleet protection only ever holds a retry up to the policy's cap.
		if limit := retryAfterCap(mode, p); delay > limit {
			r.add(RuleDelayOutOfBounds, "%s is retry %d held by fleet protection (%v) for %d ms, over the policy's cap of %d ms",
				subject, n, source, delay, limit)
		}
	case retrydv1.DelaySource_DELAY_SOURCE_TAIL:
		schedule := scheduleOf(p)
		switch {
		case n == 0:
		case uint64(n) <= uint64(len(schedule)):
			r.add(RuleDelaySourceInvalid, "%s is retry %d, within the %d-entry schedule, but uses the tail delay",
				subject, n, len(schedule))
		case delay != tailDelayOf(p):
			r.add(RuleDelayOutOfBounds, "%s is retry %d waiting %d ms, but the tail delay is %d ms",
				subject, n, delay, tailDelayOf(p))
		}
	}
}

// normalMode resolves an unspecified mode to normal.
func normalMode(m retrydv1.Mode) retrydv1.Mode {
	if m == retrydv1.Mode_MODE_UNSPECIFIED {
		return retrydv1.Mode_MODE_NORMAL
	}
	return m
}

// sourceAllowed reports whether a mode may produce a delay from source.
func sourceAllowed(mode retrydv1.Mode, source retrydv1.DelaySource) bool {
	switch source {
	case retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER:
		return true
	case retrydv1.DelaySource_DELAY_SOURCE_BACKOFF:
		return mode == retrydv1.Mode_MODE_NORMAL || mode == retrydv1.Mode_MODE_ALWAYS
	case retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE, retrydv1.DelaySource_DELAY_SOURCE_TAIL:
		return mode == retrydv1.Mode_MODE_SCHEDULE
	case retrydv1.DelaySource_DELAY_SOURCE_FLEET_BUDGET:
		// Normal mode is delegated when the budget is empty, never paced.
		return mode == retrydv1.Mode_MODE_ALWAYS || mode == retrydv1.Mode_MODE_SCHEDULE
	case retrydv1.DelaySource_DELAY_SOURCE_CIRCUIT_OPEN, retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_PACING:
		return true
	default:
		return false
	}
}

// backoffRange returns the delays, in milliseconds, that backoff with jitter
// may produce for retry n (n >= 1). ok is false when the policy's numbers do
// not define a range (a NaN multiplier, say); the server rejects such
// policies, so there is nothing to check the delay against.
func backoffRange(b *retrydv1.Backoff, n uint32) (lo, hi uint64, ok bool) {
	if b == nil {
		b = &retrydv1.Backoff{}
	}
	initial := uint64(defaultInitialDelayMs)
	if b.InitialDelayMs != nil {
		initial = b.GetInitialDelayMs()
	}
	maxDelay := uint64(defaultMaxDelayMs)
	if b.MaxDelayMs != nil {
		maxDelay = b.GetMaxDelayMs()
	}
	multiplier := float64(defaultMultiplier)
	if b.Multiplier != nil {
		multiplier = b.GetMultiplier()
	}
	ratio := defaultJitterRatio
	if b.JitterRatio != nil {
		ratio = b.GetJitterRatio()
	}

	base := math.Min(float64(initial)*math.Pow(multiplier, float64(n-1)), float64(maxDelay))
	if math.IsNaN(base) || math.IsNaN(ratio) {
		return 0, 0, false
	}
	base = math.Max(base, 0)
	ratio = math.Min(math.Max(ratio, 0), 1)

	if b.GetJitter() == retrydv1.Jitter_JITTER_FULL {
		return 0, min(floatMs(math.Ceil(base)), maxDelay), true
	}
	// Symmetric: 1 ms of slack either side for the server's rounding.
	lo = floatMs(math.Floor(base * (1 - ratio)))
	if lo > 0 {
		lo--
	}
	hi = min(floatMs(math.Ceil(base*(1+ratio)))+1, maxDelay)
	return lo, hi, true
}

// floatMs converts a non-negative whole number of milliseconds, saturating.
func floatMs(x float64) uint64 {
	switch {
	case x <= 0:
		return 0
	case x >= math.MaxUint64:
		return math.MaxUint64
	default:
		return uint64(x)
	}
}

// retryAfterCap is the longest provider delay a policy takes without
// honouring over-cap delays: max_delay_ms in the backoff modes, the largest
// schedule or tail delay in schedule mode.
func retryAfterCap(mode retrydv1.Mode, p *retrydv1.RetryPolicy) uint64 {
	if mode != retrydv1.Mode_MODE_SCHEDULE {
		if b := p.GetBackoff(); b != nil && b.MaxDelayMs != nil {
			return b.GetMaxDelayMs()
		}
		return defaultMaxDelayMs
	}
	return max(slices.Max(scheduleOf(p)), tailDelayOf(p))
}

func scheduleOf(p *retrydv1.RetryPolicy) []uint64 {
	if len(p.GetSchedule()) == 0 {
		return defaultSchedule
	}
	return p.GetSchedule()
}

func tailDelayOf(p *retrydv1.RetryPolicy) uint64 {
	if p.TailDelayMs == nil {
		return defaultTailDelayMs
	}
	return p.GetTailDelayMs()
}
