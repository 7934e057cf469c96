package fleet_test

import (
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
)

func TestFleetRetryAfter(t *testing.T) {
	t.Parallel()
	sec := time.Second
	tests := []struct {
		name       string
		cfg        fleet.Config
		retryAfter []time.Duration // reported at t0, in order
		spreadNext uint64
		retry      fleet.Retry
		want       fleet.Verdict
		detail     string
		wantPaced  time.Time
	}{
		{"one agent's Retry-After holds another's retry", config(nil), []time.Duration{2 * sec}, 0, normal(ms(500)),
			fleet.Verdict{Delay: 2 * sec, Source: fleet.SourcePacing, Token: true},
			"the provider asked the fleet to wait until 12:00:02.000 (Retry-After): spread to 12:00:02.000", at(2 * sec)},
		{"the next held retry takes the next spread slot", config(nil), []time.Duration{2 * sec}, 1, normal(ms(500)),
			fleet.Verdict{Delay: ms(5091), Source: fleet.SourcePacing, Token: true}, "the provider asked the fleet to wait until 12:00:02.000 (Retry-After): spread to 12:00:05.091", at(2 * sec)},
		{"a shorter Retry-After does not lower it", config(nil), []time.Duration{2 * sec, sec}, 0, normal(ms(500)),
			fleet.Verdict{Delay: 2 * sec, Source: fleet.SourcePacing, Token: true}, "the provider asked the fleet", at(2 * sec)},
		// Held to 30 s, past the 10 s cap: moved before the cap by the next
		// spread slot, 3091 ms.
		{"bounded by MaxFleetRetryAfter, then by the policy's cap", config(nil), []time.Duration{time.Hour}, 0, normal(ms(500)),
			fleet.Verdict{Delay: ms(6909), Source: fleet.SourcePacing, Token: true},
			"the provider asked the fleet to wait until 12:00:30.000 (Retry-After): spread to 12:00:30.000; bounded by the policy's cap of 10s or the deadline: starts at 12:00:06.909", at(30 * sec)},
		{"a longer policy delay stands", config(nil), []time.Duration{2 * sec}, 0, normal(3 * sec),
			fleet.Verdict{Delay: 3 * sec, Token: true}, "", at(2 * sec)},
		{"MaxFleetRetryAfter 0 turns it off", config(func(c *fleet.Config) { c.MaxFleetRetryAfter = 0 }), []time.Duration{2 * sec}, 0, normal(ms(500)),
			fleet.Verdict{Delay: ms(500), Token: true}, "", time.Time{}},
		{"SpreadWindow 0 holds every retry to the same instant", config(func(c *fleet.Config) { c.SpreadWindow = 0 }), []time.Duration{2 * sec}, 5, normal(ms(500)),
			fleet.Verdict{Delay: 2 * sec, Source: fleet.SourcePacing, Token: true}, "the provider asked the fleet", at(2 * sec)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := fleet.ProviderState{SpreadNext: tc.spreadNext}
			for _, ra := range tc.retryAfter {
				s.Failed(tc.cfg, t0, fleet.Failure{RetryAfter: ra})
			}
			if !s.PacedUntil.Equal(tc.wantPaced) {
				t.Errorf("PacedUntil = %v, want %v", s.PacedUntil, tc.wantPaced)
			}
			got := s.Admit(tc.cfg, t0, tc.retry, fixedRand(0))
			if !strings.HasPrefix(got.Detail, tc.detail) || (tc.detail == "" && got.Detail != "") {
				t.Errorf("Detail = %q, want prefix %q", got.Detail, tc.detail)
			}
			got.Detail = ""
			if got != tc.want {
				t.Errorf("Admit = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestSpreadIsEven: however many retries end up held, consecutive spread
// slots cover the window evenly — 1 000 held retries put 100 ± 2 in each
// tenth of it, for any phase.
func TestSpreadIsEven(t *testing.T) {
	t.Parallel()
	noBudget := config(func(c *fleet.Config) { c.DisableBudget = true })
	for _, phase := range []float64{0, 0.25, 0.999} {
		s := openAt(0)
		s.ProbesScheduled = 3
		var counts [10]int
		for range 1000 {
			v := s.Admit(noBudget, t0, always(0), fixedRand(phase))
			offset := v.Delay - 5*time.Second
			if offset < 0 || offset > 5*time.Second {
				t.Fatalf("phase %v: offset %v outside the 5 s window", phase, offset)
			}
			counts[min(int(offset/(500*time.Millisecond)), 9)]++
		}
		for i, n := range counts {
			if n < 98 || n > 102 {
				t.Errorf("phase %v: %d retries in tenth %d of the window, want 100 ± 2 (%v)", phase, n, i, counts)
			}
		}
	}
}
