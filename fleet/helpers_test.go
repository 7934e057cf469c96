package fleet_test

import (
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
)

// t0 is the fixed clock of every test: Sunday 1 March 2026, noon UTC.
var t0 = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// fixedRand always returns u: with u = 0 the spread window's phase is 0, so
// the k-th held retry of a 5 s window sits at 0, 3091, 1181, 4271, 2361,
// 451 … ms (k·0.618… mod 1 of 5 s, rounded up to the millisecond).
type fixedRand float64

func (r fixedRand) Float64() float64 { return float64(r) }

// noRand fails the test when a random draw is taken where none may be.
type noRand struct{ t testing.TB }

func (r noRand) Float64() float64 {
	r.t.Helper()
	r.t.Error("drew from the random source")
	return 0
}

// config is DefaultConfig changed by fn.
func config(fn func(*fleet.Config)) fleet.Config {
	c := fleet.DefaultConfig()
	if fn != nil {
		fn(&c)
	}
	return c
}

// normal and always are retries of the default normal and always policies
// with the given policy delay (cap 10 s).
func normal(delay time.Duration) fleet.Retry {
	return fleet.Retry{Delay: delay, Cap: 10 * time.Second}
}

func always(delay time.Duration) fleet.Retry {
	return fleet.Retry{Delay: delay, Cap: 10 * time.Second, MustNotEnd: true}
}

// openAt is a state whose circuit opened at t0+d (OpenFor 5 s).
func openAt(d time.Duration) fleet.ProviderState {
	return fleet.ProviderState{Circuit: fleet.Open, OpenUntil: at(d + 5*time.Second), Opens: 1}
}

// failN reports n failures at now.
func failN(s *fleet.ProviderState, cfg fleet.Config, now time.Time, n int) {
	for range n {
		s.Failed(cfg, now, fleet.Failure{})
	}
}

// succeedN reports n successes at now.
func succeedN(s *fleet.ProviderState, cfg fleet.Config, now time.Time, n int) {
	for range n {
		s.Succeeded(cfg, now, fleet.Success{})
	}
}
