package fleet

import (
	"math"
	"time"
)

// refill brings the budget up to now: RefillPerSecond tokens per second,
// never above Capacity. A budget never used starts full.
func (s *ProviderState) refill(cfg Config, now time.Time) {
	if s.TokensAt.IsZero() {
		s.Tokens, s.TokensAt = cfg.Capacity, now
		return
	}
	if dt := now.Sub(s.TokensAt); dt > 0 {
		s.Tokens += dt.Seconds() * cfg.RefillPerSecond
		s.TokensAt = now
	}
	s.Tokens = min(s.Tokens, cfg.Capacity)
}

// credit adds a success's share of a token.
func (s *ProviderState) credit(cfg Config) {
	s.Tokens = min(s.Tokens+cfg.SuccessCredit, cfg.Capacity)
}

// tokenEpsilon absorbs floating-point sums: ten credits of 0.1 are a token,
// though they add up to 0.9999999999999999.
const tokenEpsilon = 1e-9

// tokenWait is how long until a whole token is free, counting the tokens
// already reserved by paced retries; ok is false when refill alone never
// frees one (RefillPerSecond 0: only successes would).
func (s *ProviderState) tokenWait(cfg Config) (wait time.Duration, ok bool) {
	if s.Tokens >= 1-tokenEpsilon {
		return 0, true
	}
	if cfg.RefillPerSecond <= 0 {
		return 0, false
	}
	secs := (1 - s.Tokens) / cfg.RefillPerSecond
	if secs > MaxDuration.Seconds() {
		return 0, false
	}
	// Round to the nanosecond first: 0.7 s must not become 701 ms by a
	// floating-point hair.
	return ceilMs(time.Duration(math.Round(secs * float64(time.Second)))), true
}
