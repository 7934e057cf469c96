package policy

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// fixedRand is a jitter source that always returns u.
type fixedRand struct{ u float64 }

func (r fixedRand) Float64() float64 { return r.u }

// noRand fails the test if Decide draws jitter where it must not.
type noRand struct{ t testing.TB }

func (r noRand) Float64() float64 {
	r.t.Helper()
	r.t.Error("Decide drew jitter from the random source")
	return 0
}

// almostOne is the largest float64 below 1: the top of Rand's range.
var almostOne = math.Nextafter(1, 0)

// now is the fixed clock of every decision test: Sunday 1 March 2026, noon UTC.
var now = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

const (
	reasonBudget     = retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED
	reasonCode       = retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE
	reasonFirst      = retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST
	reasonHandled    = retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED
	reasonOverCap    = retrydv1.DelegateReason_DELEGATE_REASON_RETRY_AFTER_OVER_CAP
	reasonDeadline   = retrydv1.DelegateReason_DELEGATE_REASON_DEADLINE
	reasonReplay     = retrydv1.DelegateReason_DELEGATE_REASON_REPLAY_UNSAFE
	sourceBackoff    = retrydv1.DelaySource_DELAY_SOURCE_BACKOFF
	sourceProvider   = retrydv1.DelaySource_DELAY_SOURCE_PROVIDER_RETRY_AFTER
	sourceSchedule   = retrydv1.DelaySource_DELAY_SOURCE_SCHEDULE
	sourceTail       = retrydv1.DelaySource_DELAY_SOURCE_TAIL
	declined         = retrydv1.Downstream_DOWNSTREAM_DECLINED
	handled          = retrydv1.Downstream_DOWNSTREAM_HANDLED
	notAsked         = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
	replaySafe       = retrydv1.Replay_REPLAY_SAFE
	replayUnsafe     = retrydv1.Replay_REPLAY_UNSAFE
	downstreamUnspec = retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED
)

// scheduled and delegated build the expected decisions of a table.
func scheduled(n uint32, delay uint64, src retrydv1.DelaySource) Decision {
	return Decision{Schedule: true, RetryNumber: n, DelayMs: delay, Source: src}
}

func delegated(reason retrydv1.DelegateReason) Decision { return Decision{Reason: reason} }

// Policies used across the decision tables.
var (
	pNormal = &retrydv1.RetryPolicy{}
	// pNormalExact has no jitter, so its delays are the documented base
	// delays 500, 1000, 2000 … capped at 10000.
	pNormalExact = &retrydv1.RetryPolicy{MaxRetries: u32(10), Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}}
	pNormalFull  = &retrydv1.RetryPolicy{MaxRetries: u32(10), Backoff: &retrydv1.Backoff{Jitter: full}}
	pNormalLong  = &retrydv1.RetryPolicy{MaxRetries: u32(10)}
	pNormal15    = &retrydv1.RetryPolicy{MaxRetries: u32(10), Backoff: &retrydv1.Backoff{
		InitialDelayMs: u64(100), MaxDelayMs: u64(1000), Multiplier: f64(1.5), JitterRatio: f64(0),
	}}
	pNormalHonor = &retrydv1.RetryPolicy{RetryAfterOverCap: overCapHonor, Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}}
	pNormalLocal = &retrydv1.RetryPolicy{RetryAfterOverCap: overCapLocal, Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}}
	pAlways      = &retrydv1.RetryPolicy{Mode: always}
	pAlwaysExact = &retrydv1.RetryPolicy{Mode: always, Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}}
	// pAlwaysReadme is the always-mode example of the dsh-llm-retry README.
	pAlwaysReadme = &retrydv1.RetryPolicy{Mode: always, Backoff: &retrydv1.Backoff{
		InitialDelayMs: u64(1000), MaxDelayMs: u64(30000), JitterRatio: f64(0.2),
	}}
	pSchedule        = &retrydv1.RetryPolicy{Mode: schedule}
	pScheduleBounded = &retrydv1.RetryPolicy{Mode: schedule, MaxRetries: u32(3)}
	pScheduleCustom  = &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{1000, 3000}, TailDelayMs: u64(7000)}
	pScheduleHonor   = &retrydv1.RetryPolicy{Mode: schedule, RetryAfterOverCap: overCapHonor}
	pScheduleDeleg   = &retrydv1.RetryPolicy{Mode: schedule, RetryAfterOverCap: overCapDelegate}
	pMinAttempt0     = &retrydv1.RetryPolicy{MinAttemptMs: u64(0), Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}}
)

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

func TestDecide(t *testing.T) {
	t.Parallel()
	ra := func(ms uint64) RetryAfter { return RetryAfter{Valid: true, Ms: ms} }
	over := RetryAfter{Valid: true, Over: true}

	tests := []struct {
		name    string
		policy  *retrydv1.RetryPolicy
		attempt Attempt
		u       float64 // the jitter draw
		want    Decision
		detail  string // the exact Detail of a delegation, when checked
	}{
		// Normal mode, no jitter: the documented base delays.
		{"normal exact retry 1", pNormalExact, Attempt{Retries: 0, Code: "RATE_LIMIT"}, 0.7, scheduled(1, 500, sourceBackoff), ""},
		{"normal exact retry 2", pNormalExact, Attempt{Retries: 1, Code: "RATE_LIMIT"}, 0.7, scheduled(2, 1000, sourceBackoff), ""},
		{"normal exact retry 3", pNormalExact, Attempt{Retries: 2, Code: "SERVER"}, 0.7, scheduled(3, 2000, sourceBackoff), ""},
		{"normal exact retry 4", pNormalExact, Attempt{Retries: 3, Code: "TIMEOUT"}, 0.7, scheduled(4, 4000, sourceBackoff), ""},
		{"normal exact retry 5", pNormalExact, Attempt{Retries: 4, Code: "TRANSPORT"}, 0.7, scheduled(5, 8000, sourceBackoff), ""},
		{"normal exact retry 6 capped", pNormalExact, Attempt{Retries: 5, Code: "EMPTY_RESPONSE"}, 0.7, scheduled(6, 10000, sourceBackoff), ""},
		{"normal exact retry 10 capped", pNormalExact, Attempt{Retries: 9, Code: "SERVER"}, 0.7, scheduled(10, 10000, sourceBackoff), ""},
		{"multiplier 1.5 retry 1", pNormal15, Attempt{Retries: 0, Code: "SERVER"}, 0, scheduled(1, 100, sourceBackoff), ""},
		{"multiplier 1.5 retry 2", pNormal15, Attempt{Retries: 1, Code: "SERVER"}, 0, scheduled(2, 150, sourceBackoff), ""},
		{"multiplier 1.5 retry 3", pNormal15, Attempt{Retries: 2, Code: "SERVER"}, 0, scheduled(3, 225, sourceBackoff), ""},
		// 100*1.5^3 = 337.5: a fractional base rounds up to 338, never below the base.
		{"multiplier 1.5 retry 4 rounds up", pNormal15, Attempt{Retries: 3, Code: "SERVER"}, 0.9, scheduled(4, 338, sourceBackoff), ""},
		{"multiplier 1.5 retry 7 capped", pNormal15, Attempt{Retries: 6, Code: "SERVER"}, 0.9, scheduled(7, 1000, sourceBackoff), ""},

		// Symmetric jitter 0.1: [base*0.9, min(base*1.1, 10000)].
		{"symmetric retry 1 u=0", pNormal, Attempt{Code: "SERVER"}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"symmetric retry 1 u=0.5", pNormal, Attempt{Code: "SERVER"}, 0.5, scheduled(1, 500, sourceBackoff), ""},
		{"symmetric retry 1 u→1", pNormal, Attempt{Code: "SERVER"}, almostOne, scheduled(1, 550, sourceBackoff), ""},
		{"symmetric retry 2 u=0", pNormal, Attempt{Retries: 1, Code: "SERVER"}, 0, scheduled(2, 900, sourceBackoff), ""},
		{"symmetric retry 2 u→1", pNormal, Attempt{Retries: 1, Code: "SERVER"}, almostOne, scheduled(2, 1100, sourceBackoff), ""},
		{"symmetric retry 5 u=0", pNormalLong, Attempt{Retries: 4, Code: "SERVER"}, 0, scheduled(5, 7200, sourceBackoff), ""},
		{"symmetric retry 5 u→1", pNormalLong, Attempt{Retries: 4, Code: "SERVER"}, almostOne, scheduled(5, 8800, sourceBackoff), ""},
		{"symmetric retry 6 u=0", pNormalLong, Attempt{Retries: 5, Code: "SERVER"}, 0, scheduled(6, 9000, sourceBackoff), ""},
		{"symmetric retry 6 u→1 stays at the cap", pNormalLong, Attempt{Retries: 5, Code: "SERVER"}, almostOne, scheduled(6, 10000, sourceBackoff), ""},
		{"symmetric retry 6 u=0.5", pNormalLong, Attempt{Retries: 5, Code: "SERVER"}, 0.5, scheduled(6, 9500, sourceBackoff), ""},
		{"README always retry 1 u=0", pAlwaysReadme, Attempt{Code: "AUTH", Downstream: declined}, 0, scheduled(1, 800, sourceBackoff), ""},
		{"README always retry 1 u→1", pAlwaysReadme, Attempt{Code: "AUTH", Downstream: declined}, almostOne, scheduled(1, 1200, sourceBackoff), ""},
		{"README always retry 5 u→1", pAlwaysReadme, Attempt{Retries: 4, Code: "AUTH", Downstream: declined}, almostOne, scheduled(5, 19200, sourceBackoff), ""},
		{"README always retry 6 u=0", pAlwaysReadme, Attempt{Retries: 5, Code: "AUTH", Downstream: declined}, 0, scheduled(6, 24000, sourceBackoff), ""},
		{"README always retry 6 u→1", pAlwaysReadme, Attempt{Retries: 5, Code: "AUTH", Downstream: declined}, almostOne, scheduled(6, 30000, sourceBackoff), ""},

		// A misbehaving random source counts as u=0.
		{"rand -0.5 is 0", pNormal, Attempt{Code: "SERVER"}, -0.5, scheduled(1, 450, sourceBackoff), ""},
		{"rand 1 is 0", pNormal, Attempt{Code: "SERVER"}, 1, scheduled(1, 450, sourceBackoff), ""},
		{"rand 1.5 is 0", pNormal, Attempt{Code: "SERVER"}, 1.5, scheduled(1, 450, sourceBackoff), ""},
		{"rand NaN is 0", pNormal, Attempt{Code: "SERVER"}, math.NaN(), scheduled(1, 450, sourceBackoff), ""},
		{"rand +Inf is 0", pNormal, Attempt{Code: "SERVER"}, math.Inf(1), scheduled(1, 450, sourceBackoff), ""},

		// Full jitter: [0, base].
		{"full retry 1 u=0", pNormalFull, Attempt{Code: "SERVER"}, 0, scheduled(1, 0, sourceBackoff), ""},
		{"full retry 1 u=0.5", pNormalFull, Attempt{Code: "SERVER"}, 0.5, scheduled(1, 250, sourceBackoff), ""},
		{"full retry 1 u→1", pNormalFull, Attempt{Code: "SERVER"}, almostOne, scheduled(1, 500, sourceBackoff), ""},
		{"full retry 3 u→1", pNormalFull, Attempt{Retries: 2, Code: "SERVER"}, almostOne, scheduled(3, 2000, sourceBackoff), ""},
		{"full retry 7 u=0", pNormalFull, Attempt{Retries: 6, Code: "SERVER"}, 0, scheduled(7, 0, sourceBackoff), ""},
		{"full retry 7 u→1", pNormalFull, Attempt{Retries: 6, Code: "SERVER"}, almostOne, scheduled(7, 10000, sourceBackoff), ""},

		// Schedule mode: 2s 5s 5s 5s 10s, then 20s without limit.
		{"schedule retry 1", pSchedule, Attempt{Retries: 0, Code: "AUTH"}, 0.9, scheduled(1, 2000, sourceSchedule), ""},
		{"schedule retry 2", pSchedule, Attempt{Retries: 1, Code: "QUOTA"}, 0.9, scheduled(2, 5000, sourceSchedule), ""},
		{"schedule retry 3", pSchedule, Attempt{Retries: 2, Code: "SERVER"}, 0.9, scheduled(3, 5000, sourceSchedule), ""},
		{"schedule retry 4", pSchedule, Attempt{Retries: 3, Code: "HTTP_404"}, 0.9, scheduled(4, 5000, sourceSchedule), ""},
		{"schedule retry 5", pSchedule, Attempt{Retries: 4, Code: "MALFORMED_RESPONSE"}, 0.9, scheduled(5, 10000, sourceSchedule), ""},
		{"schedule retry 6 tail", pSchedule, Attempt{Retries: 5, Code: "ACCOUNT_QUOTA"}, 0.9, scheduled(6, 20000, sourceTail), ""},
		{"schedule retry 7 tail", pSchedule, Attempt{Retries: 6, Code: "RATE_LIMIT"}, 0.9, scheduled(7, 20000, sourceTail), ""},
		{"schedule retry 1000 tail", pSchedule, Attempt{Retries: 999, Code: "TIMEOUT"}, 0.9, scheduled(1000, 20000, sourceTail), ""},
		{"custom schedule retry 1", pScheduleCustom, Attempt{Retries: 0, Code: "SERVER"}, 0, scheduled(1, 1000, sourceSchedule), ""},
		{"custom schedule retry 2", pScheduleCustom, Attempt{Retries: 1, Code: "SERVER"}, 0, scheduled(2, 3000, sourceSchedule), ""},
		{"custom schedule retry 3 tail", pScheduleCustom, Attempt{Retries: 2, Code: "SERVER"}, 0, scheduled(3, 7000, sourceTail), ""},
		{"bounded schedule last retry", pScheduleBounded, Attempt{Retries: 2, Code: "SERVER"}, 0, scheduled(3, 5000, sourceSchedule), ""},
		{"bounded schedule exhausted", pScheduleBounded, Attempt{Retries: 3, Code: "SERVER"}, 0, delegated(reasonBudget), "3 of 3 retries used"},

		// Budget.
		{"normal default retry 2 allowed", pNormal, Attempt{Retries: 1, Code: "SERVER"}, 0, scheduled(2, 900, sourceBackoff), ""},
		{"normal default retry 3 exhausted", pNormal, Attempt{Retries: 2, Code: "SERVER"}, 0, delegated(reasonBudget), "2 of 2 retries used"},
		{"normal default far past the budget", pNormal, Attempt{Retries: 50, Code: "SERVER"}, 0, delegated(reasonBudget), "50 of 2 retries used"},
		{"max 0 delegates the first failure", &retrydv1.RetryPolicy{MaxRetries: u32(0)}, Attempt{Code: "SERVER"}, 0, delegated(reasonBudget), "0 of 0 retries used"},
		{"schedule max 0 delegates the first failure", &retrydv1.RetryPolicy{Mode: schedule, MaxRetries: u32(0)}, Attempt{Code: "SERVER"}, 0, delegated(reasonBudget), ""},
		{"max 10 retry 10 allowed", pNormalExact, Attempt{Retries: 9, Code: "SERVER"}, 0, scheduled(10, 10000, sourceBackoff), ""},
		{"max 10 retry 11 exhausted", pNormalExact, Attempt{Retries: 10, Code: "SERVER"}, 0, delegated(reasonBudget), "10 of 10 retries used"},
		{"always has no budget", pAlways, Attempt{Retries: 100000, Code: "SERVER", Downstream: declined}, 0, scheduled(100001, 9000, sourceBackoff), ""},

		// Codes.
		{"normal AUTH not retryable", pNormal, Attempt{Code: "AUTH"}, 0, delegated(reasonCode), ""},
		{"normal HTTP_404 not retryable", pNormal, Attempt{Code: "HTTP_404"}, 0, delegated(reasonCode), ""},
		{"normal empty code not retryable", pNormal, Attempt{Code: ""}, 0, delegated(reasonCode), ""},
		{"code check precedes budget", pNormal, Attempt{Retries: 2, Code: "AUTH"}, 0, delegated(reasonCode), ""},
		{"schedule HTTP_404 by prefix", pSchedule, Attempt{Code: "HTTP_404"}, 0, scheduled(1, 2000, sourceSchedule), ""},
		{"schedule HTTP_409 by prefix", pSchedule, Attempt{Retries: 1, Code: "HTTP_409"}, 0, scheduled(2, 5000, sourceSchedule), ""},
		{"schedule HTTPX not retryable", pSchedule, Attempt{Code: "HTTPX"}, 0, delegated(reasonCode), ""},
		{"schedule CONTEXT_WINDOW_EXCEEDED not retryable", pSchedule, Attempt{Code: "CONTEXT_WINDOW_EXCEEDED"}, 0, delegated(reasonCode), ""},
		{"schedule UNKNOWN not retryable", pSchedule, Attempt{Code: "UNKNOWN"}, 0, delegated(reasonCode), ""},
		{"always UNKNOWN retried", pAlways, Attempt{Code: "UNKNOWN", Downstream: declined}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"always INVALID_REQUEST retried", pAlways, Attempt{Code: "INVALID_REQUEST", Downstream: declined}, 0, scheduled(1, 450, sourceBackoff), ""},

		// ABORTED is delegated in every mode, before anything else.
		{"normal ABORTED", pNormal, Attempt{Code: "ABORTED"}, 0, delegated(reasonCode), "ABORTED is never retried: cancellation stays terminal"},
		{"schedule ABORTED", pSchedule, Attempt{Code: "ABORTED"}, 0, delegated(reasonCode), "ABORTED is never retried: cancellation stays terminal"},
		{"always ABORTED not asked", pAlways, Attempt{Code: "ABORTED"}, 0, delegated(reasonCode), ""},
		{"always ABORTED declined", pAlways, Attempt{Code: "ABORTED", Downstream: declined}, 0, delegated(reasonCode), ""},
		{"always ABORTED handled", pAlways, Attempt{Code: "ABORTED", Downstream: handled}, 0, delegated(reasonCode), ""},
		{"ABORTED precedes unsafe replay", pNormal, Attempt{Code: "ABORTED", Replay: replayUnsafe}, 0, delegated(reasonCode), ""},
		{"ABORTED not matched by prefix AB*", &retrydv1.RetryPolicy{RetryableCodes: []string{"AB*"}}, Attempt{Code: "ABORTED"}, 0, delegated(reasonCode), ""},

		// Replay.
		{"normal replay unsafe", pNormal, Attempt{Code: "SERVER", Replay: replayUnsafe}, 0, delegated(reasonReplay), ""},
		{"normal replay safe", pNormal, Attempt{Code: "SERVER", Replay: replaySafe}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"schedule replay unsafe", pSchedule, Attempt{Code: "SERVER", Replay: replayUnsafe}, 0, delegated(reasonReplay), ""},
		{"always replay unsafe before downstream", pAlways, Attempt{Code: "SERVER", Replay: replayUnsafe}, 0, delegated(reasonReplay), ""},
		{"always replay unsafe declined", pAlways, Attempt{Code: "SERVER", Replay: replayUnsafe, Downstream: declined}, 0, delegated(reasonReplay), ""},
		{"replay unsafe precedes code check", pNormal, Attempt{Code: "AUTH", Replay: replayUnsafe}, 0, delegated(reasonReplay), ""},
		{"replay unsafe precedes budget", pNormal, Attempt{Retries: 2, Code: "SERVER", Replay: replayUnsafe}, 0, delegated(reasonReplay), ""},

		// Always mode's downstream handshake.
		{"always unspecified downstream", pAlways, Attempt{Code: "SERVER", Downstream: downstreamUnspec}, 0, delegated(reasonFirst), ""},
		{"always not asked", pAlways, Attempt{Code: "SERVER", Downstream: notAsked}, 0, delegated(reasonFirst), ""},
		{"always unknown downstream value", pAlways, Attempt{Code: "SERVER", Downstream: 42}, 0, delegated(reasonFirst), ""},
		{"always declined", pAlways, Attempt{Code: "SERVER", Downstream: declined}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"always declined retry 4", pAlwaysExact, Attempt{Retries: 3, Code: "SERVER", Downstream: declined}, 0, scheduled(4, 4000, sourceBackoff), ""},
		{"always handled", pAlways, Attempt{Code: "SERVER", Downstream: handled}, 0, delegated(reasonHandled), ""},
		{"downstream ignored outside always", pNormal, Attempt{Code: "SERVER", Downstream: handled}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"downstream ignored in schedule", pSchedule, Attempt{Code: "SERVER", Downstream: notAsked}, 0, scheduled(1, 2000, sourceSchedule), ""},

		// Provider Retry-After at or below the cap replaces the local delay, without jitter.
		{"normal retry-after 3000", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(3000)}, 0.3, scheduled(1, 3000, sourceProvider), ""},
		{"normal retry-after 0", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(0)}, 0.3, scheduled(1, 0, sourceProvider), ""},
		{"normal retry-after below local", pNormal, Attempt{Retries: 1, Code: "RATE_LIMIT", RetryAfter: ra(1)}, 0.3, scheduled(2, 1, sourceProvider), ""},
		{"normal retry-after at cap", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(10000)}, 0.3, scheduled(1, 10000, sourceProvider), ""},
		{"invalid retry-after is ignored", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: RetryAfter{Ms: 3000}}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"always retry-after at cap", pAlways, Attempt{Code: "RATE_LIMIT", Downstream: declined, RetryAfter: ra(10000)}, 0, scheduled(1, 10000, sourceProvider), ""},
		{"schedule retry-after 15000", pSchedule, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(15000)}, 0, scheduled(1, 15000, sourceProvider), ""},
		// The schedule's cap is its largest delay (the 20 s tail), not the current entry.
		{"schedule retry-after at the tail cap", pSchedule, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(20000)}, 0, scheduled(1, 20000, sourceProvider), ""},
		{"schedule tail retry-after", pSchedule, Attempt{Retries: 8, Code: "RATE_LIMIT", RetryAfter: ra(500)}, 0, scheduled(9, 500, sourceProvider), ""},

		// Over the cap.
		{"normal over cap delegates", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(10001)}, 0, delegated(reasonOverCap),
			"provider asked for 10001 ms, over the policy's cap of 10000 ms"},
		{"normal absurd delegates", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: over}, 0, delegated(reasonOverCap),
			"provider asked for an unbounded delay, over the policy's cap of 10000 ms"},
		{"budget precedes over cap", pNormal, Attempt{Retries: 2, Code: "RATE_LIMIT", RetryAfter: ra(60000)}, 0, delegated(reasonBudget), ""},
		{"always over cap keeps local", pAlways, Attempt{Code: "RATE_LIMIT", Downstream: declined, RetryAfter: ra(60000)}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"always absurd keeps local", pAlways, Attempt{Retries: 2, Code: "RATE_LIMIT", Downstream: declined, RetryAfter: over}, almostOne, scheduled(3, 2200, sourceBackoff), ""},
		{"schedule over cap keeps local", pSchedule, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(20001)}, 0, scheduled(1, 2000, sourceSchedule), ""},
		{"schedule absurd keeps local tail", pSchedule, Attempt{Retries: 5, Code: "RATE_LIMIT", RetryAfter: over}, 0, scheduled(6, 20000, sourceTail), ""},
		{"schedule over cap delegate", pScheduleDeleg, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(30000)}, 0, delegated(reasonOverCap),
			"provider asked for 30000 ms, over the policy's cap of 20000 ms"},
		{"normal over cap honor", pNormalHonor, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(60000)}, 0.5, scheduled(1, 60000, sourceProvider), ""},
		{"normal over cap honor at the timer limit", pNormalHonor, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(maxInt32)}, 0.5, scheduled(1, maxInt32, sourceProvider), ""},
		{"normal honor cannot wait an absurd delay", pNormalHonor, Attempt{Code: "RATE_LIMIT", RetryAfter: over}, 0.5, delegated(reasonOverCap), ""},
		{"normal honor rejects Ms past the timer limit", pNormalHonor, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(maxInt32 + 1)}, 0.5, delegated(reasonOverCap), ""},
		{"schedule over cap honor", pScheduleHonor, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(45000)}, 0, scheduled(1, 45000, sourceProvider), ""},
		{"normal over cap local", pNormalLocal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(60000)}, 0.5, scheduled(1, 500, sourceBackoff), ""},
		{"normal absurd local", pNormalLocal, Attempt{Retries: 1, Code: "RATE_LIMIT", RetryAfter: over}, 0.5, scheduled(2, 1000, sourceBackoff), ""},
		{"normal local below cap still uses provider", pNormalLocal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(7000)}, 0.5, scheduled(1, 7000, sourceProvider), ""},

		// Deadline: the delay plus min_attempt_ms (100) must fit.
		{"no deadline", pNormalExact, Attempt{Code: "SERVER"}, 0, scheduled(1, 500, sourceBackoff), ""},
		{"deadline fits exactly", pNormalExact, Attempt{Code: "SERVER", Deadline: now.Add(ms(600)), HasDeadline: true}, 0, scheduled(1, 500, sourceBackoff), ""},
		{"deadline 1 ms short", pNormalExact, Attempt{Code: "SERVER", Deadline: now.Add(ms(599)), HasDeadline: true}, 0, delegated(reasonDeadline),
			"a 500 ms delay plus a 100 ms attempt does not fit the 599 ms left before the deadline"},
		{"deadline 1 ns short", pNormalExact, Attempt{Code: "SERVER", Deadline: now.Add(ms(600) - 1), HasDeadline: true}, 0, delegated(reasonDeadline), ""},
		{"deadline far away", pNormalExact, Attempt{Code: "SERVER", Deadline: now.Add(time.Hour), HasDeadline: true}, 0, scheduled(1, 500, sourceBackoff), ""},
		{"deadline now", pNormalExact, Attempt{Code: "SERVER", Deadline: now, HasDeadline: true}, 0, delegated(reasonDeadline),
			"a 500 ms delay plus a 100 ms attempt does not fit the 0 ms left before the deadline"},
		{"deadline passed", pNormalExact, Attempt{Code: "SERVER", Deadline: now.Add(-time.Minute), HasDeadline: true}, 0, delegated(reasonDeadline),
			"a 500 ms delay plus a 100 ms attempt does not fit the 0 ms left before the deadline"},
		{"min_attempt 0 fits exactly", pMinAttempt0, Attempt{Code: "SERVER", Deadline: now.Add(ms(500)), HasDeadline: true}, 0, scheduled(1, 500, sourceBackoff), ""},
		{"min_attempt 0 short", pMinAttempt0, Attempt{Code: "SERVER", Deadline: now.Add(ms(499)), HasDeadline: true}, 0, delegated(reasonDeadline), ""},
		{"deadline uses the jittered delay", pNormal, Attempt{Code: "SERVER", Deadline: now.Add(ms(649)), HasDeadline: true}, almostOne, delegated(reasonDeadline), ""},
		{"deadline uses the jittered delay (fits)", pNormal, Attempt{Code: "SERVER", Deadline: now.Add(ms(649)), HasDeadline: true}, 0, scheduled(1, 450, sourceBackoff), ""},
		{"a zero-time deadline is long past", pNormalExact, Attempt{Code: "SERVER", HasDeadline: true}, 0, delegated(reasonDeadline), ""},
		{"deadline with provider delay fits", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(3000), Deadline: now.Add(ms(3100)), HasDeadline: true}, 0, scheduled(1, 3000, sourceProvider), ""},
		{"deadline with provider delay short", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(3000), Deadline: now.Add(ms(3099)), HasDeadline: true}, 0, delegated(reasonDeadline), ""},
		{"deadline with honoured delay fits", pNormalHonor, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(60000), Deadline: now.Add(ms(60100)), HasDeadline: true}, 0, scheduled(1, 60000, sourceProvider), ""},
		{"deadline with honoured delay short", pNormalHonor, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(60000), Deadline: now.Add(ms(60099)), HasDeadline: true}, 0, delegated(reasonDeadline), ""},
		{"deadline with schedule tail fits", pSchedule, Attempt{Retries: 5, Code: "SERVER", Deadline: now.Add(ms(20100)), HasDeadline: true}, 0, scheduled(6, 20000, sourceTail), ""},
		{"deadline with schedule tail short", pSchedule, Attempt{Retries: 5, Code: "SERVER", Deadline: now.Add(ms(20099)), HasDeadline: true}, 0, delegated(reasonDeadline), ""},
		{"over cap precedes deadline", pNormal, Attempt{Code: "RATE_LIMIT", RetryAfter: ra(60000), Deadline: now, HasDeadline: true}, 0, delegated(reasonOverCap), ""},
		{"budget precedes deadline", pNormal, Attempt{Retries: 2, Code: "SERVER", Deadline: now, HasDeadline: true}, 0, delegated(reasonBudget), ""},
		{"downstream first precedes deadline", pAlways, Attempt{Code: "SERVER", Deadline: now, HasDeadline: true}, 0, delegated(reasonFirst), ""},
		{"always deadline", pAlways, Attempt{Code: "SERVER", Downstream: declined, Deadline: now.Add(ms(549)), HasDeadline: true}, 0, delegated(reasonDeadline), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := mustResolve(t, tt.policy)
			got := p.Decide(tt.attempt, now, fixedRand{tt.u})
			detail := got.Detail
			got.Detail = ""
			if got != tt.want {
				t.Errorf("Decide(%+v, u=%v)\n got %+v (%q)\nwant %+v", tt.attempt, tt.u, got, detail, tt.want)
			}
			switch {
			case tt.want.Schedule && detail != "":
				t.Errorf("scheduled decision has detail %q", detail)
			case !tt.want.Schedule && detail == "":
				t.Error("delegation has no detail")
			case tt.detail != "" && detail != tt.detail:
				t.Errorf("detail\n got %q\nwant %q", detail, tt.detail)
			}
		})
	}
}

func TestDecideCodeNotRetryableDetail(t *testing.T) {
	t.Parallel()
	p := mustResolve(t, nil)
	d := p.Decide(Attempt{Code: "AUTH"}, now, fixedRand{})
	want := "code AUTH is not retryable under policy " + keyNormalDefault
	if d.Detail != want {
		t.Errorf("Detail = %q, want %q", d.Detail, want)
	}
}

// TestDecideScheduleDrawsNoJitter: schedule mode's delays are fixed, so
// Decide never consults the random source (nil is a valid source there).
func TestDecideScheduleDrawsNoJitter(t *testing.T) {
	t.Parallel()
	p := mustResolve(t, pSchedule)
	for retries := range uint32(8) {
		if d := p.Decide(Attempt{Retries: retries, Code: "SERVER"}, now, noRand{t}); !d.Schedule {
			t.Errorf("retry %d delegated: %+v", retries+1, d)
		}
		if d := p.Decide(Attempt{Retries: retries, Code: "SERVER"}, now, nil); !d.Schedule {
			t.Errorf("retry %d with a nil source delegated: %+v", retries+1, d)
		}
	}
}

// TestDecideDoesNotUseTheClockWithoutDeadline: without a deadline, the
// decision does not depend on now.
func TestDecideDoesNotUseTheClockWithoutDeadline(t *testing.T) {
	t.Parallel()
	p := mustResolve(t, nil)
	a := Attempt{Code: "SERVER"}
	want := p.Decide(a, now, fixedRand{0.25})
	for _, at := range []time.Time{{}, now.Add(-100 * time.Hour), now.Add(1000 * time.Hour)} {
		if got := p.Decide(a, at, fixedRand{0.25}); got != want {
			t.Errorf("Decide at %v = %+v, want %+v", at, got, want)
		}
	}
}

func TestDecideRetryNumberOverflow(t *testing.T) {
	t.Parallel()
	for _, in := range []*retrydv1.RetryPolicy{pSchedule, pAlways} {
		p := mustResolve(t, in)
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: Decide panicked: %v", p.Key, r)
				}
			}()
			d := p.Decide(Attempt{Retries: math.MaxUint32, Code: "SERVER", Downstream: declined}, now, fixedRand{})
			if d.Schedule || d.Reason != reasonBudget {
				t.Errorf("%s: Decide at Retries=MaxUint32 = %+v, want delegate budget_exhausted", p.Key, d)
			}
		}()
	}
}

func TestBackoffBaseAndBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		n      uint32
		base   float64
		lo, hi uint64
	}{
		{"default retry 1", nil, 1, 500, 450, 550},
		{"default retry 2", nil, 2, 1000, 900, 1100},
		{"default retry 3", nil, 3, 2000, 1800, 2200},
		{"default retry 4", nil, 4, 4000, 3600, 4400},
		{"default retry 5", nil, 5, 8000, 7200, 8800},
		{"default retry 6 capped", nil, 6, 10000, 9000, 10000},
		{"default retry 50 capped", nil, 50, 10000, 9000, 10000},
		{"default retry 5000 capped", nil, 5000, 10000, 9000, 10000},
		{"zero jitter retry 3", pNormalExact, 3, 2000, 2000, 2000},
		{"zero jitter fractional base", pNormal15, 4, 337.5, 338, 338},
		{"full retry 1", pNormalFull, 1, 500, 0, 500},
		{"full retry 6 capped", pNormalFull, 6, 10000, 0, 10000},
		{"README always retry 1", pAlwaysReadme, 1, 1000, 800, 1200},
		{"README always retry 5", pAlwaysReadme, 5, 16000, 12800, 19200},
		{"README always retry 6 capped", pAlwaysReadme, 6, 30000, 24000, 30000},
		{"ratio 1", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(1)}}, 2, 1000, 0, 2000},
		{"ratio 1 capped", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(1)}}, 9, 10000, 0, 10000},
		{"multiplier 1", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(1)}}, 40, 500, 450, 550},
		{"huge multiplier", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(1e300)}}, 3, 10000, 9000, 10000},
		{"timer limit", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(maxInt32), MaxDelayMs: u64(maxInt32)}},
			7, maxInt32, 1932735283, maxInt32},
		{"1 ms base with jitter", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(1), MaxDelayMs: u64(1)}}, 1, 1, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := mustResolve(t, tt.policy)
			if got := p.BackoffBase(tt.n); got != tt.base {
				t.Errorf("BackoffBase(%d) = %v, want %v", tt.n, got, tt.base)
			}
			if lo, hi := p.BackoffBounds(tt.n); lo != tt.lo || hi != tt.hi {
				t.Errorf("BackoffBounds(%d) = [%d, %d], want [%d, %d]", tt.n, lo, hi, tt.lo, tt.hi)
			}
		})
	}
}

// TestDecideDelayProperty: for many random valid backoff policies, retry
// numbers 1..50 and draws in [0, 1), the delay is within BackoffBounds,
// never above max_delay_ms nor the 32-bit timer limit, and its bounds
// contain the documented jitter range around the base.
func TestDecideDelayProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(20260301, 1))
	policies := 500
	if testing.Short() {
		policies = 50
	}
	for i := range policies {
		in := randomBackoffPolicy(rng)
		p, err := Resolve(in)
		if err != nil {
			t.Fatalf("policy %d (%v): %v", i, in, err)
		}
		for retries := range uint32(50) {
			u := rng.Float64()
			if retries%10 == 0 {
				u = 0
			} else if retries%10 == 1 {
				u = almostOne
			}
			n := retries + 1
			d := p.Decide(Attempt{Retries: retries, Code: "SERVER", Downstream: declined}, now, fixedRand{u})
			if !d.Schedule || d.RetryNumber != n || d.Source != sourceBackoff {
				t.Fatalf("%s retry %d: %+v", p.Key, n, d)
			}
			lo, hi := p.BackoffBounds(n)
			if lo > hi || d.DelayMs < lo || d.DelayMs > hi {
				t.Fatalf("%s retry %d u=%v: delay %d outside [%d, %d]", p.Key, n, u, d.DelayMs, lo, hi)
			}
			if d.DelayMs > p.MaxDelayMs || d.DelayMs > MaxDelayMs {
				t.Fatalf("%s retry %d u=%v: delay %d over max %d", p.Key, n, u, d.DelayMs, p.MaxDelayMs)
			}
			base := p.BackoffBase(n)
			if base > float64(p.MaxDelayMs) || base < float64(p.InitialDelayMs) {
				t.Fatalf("%s retry %d: base %v outside [initial, max]", p.Key, n, base)
			}
			if p.Jitter == full {
				if lo != 0 || float64(hi) > base || float64(hi) < base-1 {
					t.Fatalf("%s retry %d: full-jitter bounds [%d, %d] for base %v", p.Key, n, lo, hi, base)
				}
				continue
			}
			// The whole-millisecond bounds sit inside the real range, at most
			// 1 ms (plus float error) from its ends.
			realLo := base * (1 - p.JitterRatio)
			realHi := math.Min(base*(1+p.JitterRatio), float64(p.MaxDelayMs))
			if float64(lo) < realLo-1e-6 || float64(lo) > math.Max(realLo+1+1e-6, float64(hi)) {
				t.Fatalf("%s retry %d: lo %d far from %v", p.Key, n, lo, realLo)
			}
			if float64(hi) > math.Max(realHi+1e-6, float64(lo)) || float64(hi) < realHi-1-1e-6 {
				t.Fatalf("%s retry %d: hi %d far from %v", p.Key, n, hi, realHi)
			}
		}
	}
}

// TestDecideScheduleProperty: for random valid schedules, retry n waits
// schedule[n-1] while it exists and the tail afterwards.
func TestDecideScheduleProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(20260301, 2))
	for range 200 {
		sched := make([]uint64, 1+rng.IntN(MaxScheduleLen))
		for j := range sched {
			sched[j] = 1 + rng.Uint64N(maxInt32)
		}
		tail := 1 + rng.Uint64N(maxInt32)
		p := mustResolve(t, &retrydv1.RetryPolicy{Mode: schedule, Schedule: sched, TailDelayMs: &tail})
		for retries := range uint32(MaxScheduleLen + 5) {
			d := p.Decide(Attempt{Retries: retries, Code: "SERVER"}, now, nil)
			want := scheduled(retries+1, tail, sourceTail)
			if int(retries) < len(sched) {
				want = scheduled(retries+1, sched[retries], sourceSchedule)
			}
			if d != want {
				t.Fatalf("%s retry %d = %+v, want %+v", p.Key, retries+1, d, want)
			}
			if d.DelayMs > p.DelayCapMs() {
				t.Fatalf("%s retry %d waits %d over its cap %d", p.Key, retries+1, d.DelayMs, p.DelayCapMs())
			}
		}
	}
}

// randomBackoffPolicy draws a valid normal or always policy, favouring the
// edges of each range.
func randomBackoffPolicy(rng *rand.Rand) *retrydv1.RetryPolicy {
	pick := func(edges []uint64, lo, hi uint64) uint64 {
		if rng.IntN(4) == 0 {
			return edges[rng.IntN(len(edges))]
		}
		return lo + rng.Uint64N(hi-lo+1)
	}
	initial := pick([]uint64{1, 500, maxInt32}, 1, 100_000)
	if rng.IntN(8) == 0 {
		initial = 1 + rng.Uint64N(maxInt32)
	}
	maxDelay := pick([]uint64{initial, maxInt32}, initial, min(initial*1000, maxInt32))
	var mult float64
	switch rng.IntN(5) {
	case 0:
		mult = 1
	case 1:
		mult = 1 + rng.Float64()*1e6
	default:
		mult = 1 + rng.Float64()*4
	}
	var ratio float64
	switch rng.IntN(5) {
	case 0:
		ratio = 0
	case 1:
		ratio = 1
	default:
		ratio = rng.Float64()
	}
	jitter := symmetric
	if rng.IntN(3) == 0 {
		jitter = full
	}
	mode := normal
	var maxRetries *uint32
	if rng.IntN(2) == 0 {
		mode = always
	} else {
		maxRetries = u32(50)
	}
	return &retrydv1.RetryPolicy{
		Mode:       mode,
		MaxRetries: maxRetries,
		Backoff: &retrydv1.Backoff{
			InitialDelayMs: &initial, MaxDelayMs: &maxDelay, Multiplier: &mult, JitterRatio: &ratio, Jitter: jitter,
		},
	}
}

// TestDecideScheduleDoesNotAllocate guards the benchmark's 0 allocs/op on
// the hot path of a scheduled retry. Not parallel: testing.AllocsPerRun
// refuses to run in a parallel test.
func TestDecideScheduleDoesNotAllocate(t *testing.T) {
	p := mustResolve(t, pSchedule)
	var rng Rand = fixedRand{0.5}
	a := Attempt{Retries: 2, Code: "HTTP_404", RetryAfter: RetryAfter{Valid: true, Ms: 1500}}
	if n := testing.AllocsPerRun(100, func() { _ = p.Decide(a, now, rng) }); n != 0 {
		t.Errorf("Decide allocates %v times per scheduled retry, want 0", n)
	}
}

func BenchmarkDecide(b *testing.B) {
	deadline := now.Add(time.Minute)
	benches := []struct {
		name    string
		policy  *retrydv1.RetryPolicy
		attempt Attempt
	}{
		{"normal", pNormal, Attempt{Retries: 1, Code: "RATE_LIMIT", Deadline: deadline, HasDeadline: true}},
		{"normal_retry_after", pNormal, Attempt{Retries: 1, Code: "RATE_LIMIT", RetryAfter: RetryAfter{Valid: true, Ms: 3000}}},
		{"always", pAlways, Attempt{Retries: 7, Code: "UNKNOWN", Downstream: declined}},
		{"schedule", pSchedule, Attempt{Retries: 2, Code: "SERVER", Deadline: deadline, HasDeadline: true}},
		{"schedule_prefix_tail", pSchedule, Attempt{Retries: 9, Code: "HTTP_429"}},
		{"normal_delegate_budget", pNormal, Attempt{Retries: 2, Code: "RATE_LIMIT"}},
	}
	for _, bb := range benches {
		b.Run(bb.name, func(b *testing.B) {
			p := mustResolve(b, bb.policy)
			var rng Rand = rand.New(rand.NewPCG(1, 2))
			b.ReportAllocs()
			for b.Loop() {
				_ = p.Decide(bb.attempt, now, rng)
			}
		})
	}
}

func BenchmarkResolve(b *testing.B) {
	for _, bb := range []struct {
		name   string
		policy *retrydv1.RetryPolicy
	}{
		{"normal", nil},
		{"schedule", pSchedule},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Resolve(bb.policy)
			}
		})
	}
}
