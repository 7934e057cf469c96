package fleet_test

import (
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
)

func TestAdmitBudget(t *testing.T) {
	t.Parallel()
	sec := time.Second
	tests := []struct {
		name       string
		cfg        fleet.Config
		state      fleet.ProviderState
		now        time.Duration
		retry      fleet.Retry
		want       fleet.Verdict // Detail is checked for a prefix below
		detail     string
		wantTokens float64
		wantQueued uint64
	}{
		{"a fresh budget is full", config(nil), fleet.ProviderState{}, 0, normal(ms(500)),
			fleet.Verdict{Delay: ms(500), Token: true}, "", 99, 1},
		{"refill 1/s for 2.5 s", config(nil), fleet.ProviderState{TokensAt: t0}, 2500 * time.Millisecond, normal(ms(500)),
			fleet.Verdict{Delay: ms(500), Token: true}, "", 1.5, 1},
		{"refill stops at capacity", config(nil), fleet.ProviderState{Tokens: 99, TokensAt: t0}, time.Hour, normal(ms(500)),
			fleet.Verdict{Delay: ms(500), Token: true}, "", 99, 1},
		{"a lowered capacity trims the balance", config(func(c *fleet.Config) { c.Capacity = 10 }),
			fleet.ProviderState{Tokens: 99, TokensAt: t0}, 0, normal(ms(500)),
			fleet.Verdict{Delay: ms(500), Token: true}, "", 9, 1},
		{"empty: normal mode delegates and changes nothing", config(nil), fleet.ProviderState{Tokens: 0.5, TokensAt: t0}, 0, normal(ms(500)),
			fleet.Verdict{Delegate: true, Reason: fleet.ReasonBudgetExhausted},
			"retry budget exhausted: 0.50 of 100 tokens (refill 1/s, 0.1 per success)", 0.5, 0},
		{"a clock behind the budget's does not refill it", config(nil), fleet.ProviderState{Tokens: 0.5, TokensAt: at(sec)}, 0, normal(ms(500)),
			fleet.Verdict{Delegate: true, Reason: fleet.ReasonBudgetExhausted}, "retry budget exhausted", 0.5, 0},
		{"empty: always mode waits for the next token", config(nil), fleet.ProviderState{Tokens: 0.3, TokensAt: t0}, 0, always(ms(500)),
			fleet.Verdict{Delay: ms(700), Source: fleet.SourceBudget, Token: true},
			"retry budget empty: paced to the next token at 12:00:00.700 (refill 1/s)", -0.7, 1},
		{"a reservation queues behind the earlier ones", config(nil), fleet.ProviderState{Tokens: -0.7, TokensAt: t0}, 0, always(ms(500)),
			fleet.Verdict{Delay: ms(1700), Source: fleet.SourceBudget, Token: true}, "retry budget empty: paced", -1.7, 1},
		{"a policy delay beyond the next token stands", config(nil), fleet.ProviderState{Tokens: 0.5, TokensAt: t0}, 0, always(2 * sec),
			fleet.Verdict{Delay: 2 * sec, Token: true}, "", -0.5, 1},
		{"the next token beyond the cap: start at the cap without one", config(nil), fleet.ProviderState{Tokens: -9.5, TokensAt: t0}, 0, always(ms(500)),
			fleet.Verdict{Delay: 10 * sec, Source: fleet.SourceBudget},
			"retry budget empty and no token before 12:00:10.000: starts without one; bounded by the policy's cap of 10s or the deadline: starts at 12:00:10.000", -9.5, 1},
		// Retries paced to the cap together must not stay in step: the
		// second takes the next slot of the spread window before the cap.
		{"the next one is spread over the 5 s before the cap", config(nil), fleet.ProviderState{Tokens: -9.5, TokensAt: t0, SpreadNext: 1}, 0, always(ms(500)),
			fleet.Verdict{Delay: ms(6909), Source: fleet.SourceBudget},
			"retry budget empty and no token before 12:00:10.000: starts without one; bounded by the policy's cap of 10s or the deadline: starts at 12:00:06.909", -9.5, 1},
		{"never spread below the policy's own delay", config(nil), fleet.ProviderState{Tokens: -9.5, TokensAt: t0, SpreadNext: 1}, 0, always(9 * sec),
			fleet.Verdict{Delay: ms(9381), Source: fleet.SourceBudget}, "retry budget empty and no token", -9.5, 1}, // 10 s less 619 ms of a 1 s window
		{"the deadline bounds pacing", config(nil), fleet.ProviderState{Tokens: 0, TokensAt: t0}, 0,
			fleet.Retry{Delay: ms(500), Cap: 10 * sec, MustNotEnd: true, Latest: at(ms(800)), HasLatest: true},
			fleet.Verdict{Delay: ms(800), Source: fleet.SourceBudget}, "retry budget empty and no token before 12:00:00.800", 0, 1},
		{"a policy delay past the cap is the limit", config(nil), fleet.ProviderState{Tokens: -20, TokensAt: t0}, 0,
			fleet.Retry{Delay: 15 * sec, Cap: 10 * sec, MustNotEnd: true},
			fleet.Verdict{Delay: 15 * sec}, "", -20, 1},
		{"no refill rate: a paced retry starts at the cap", config(func(c *fleet.Config) { c.RefillPerSecond = 0 }),
			fleet.ProviderState{Tokens: 0.5, TokensAt: t0}, 0, always(ms(500)),
			fleet.Verdict{Delay: 10 * sec, Source: fleet.SourceBudget}, "retry budget empty and no token", 0.5, 1},
		{"schedule mode's 20 s cap", config(nil), fleet.ProviderState{Tokens: -14, TokensAt: t0}, 0,
			fleet.Retry{Delay: 2 * sec, Cap: 20 * sec, MustNotEnd: true},
			fleet.Verdict{Delay: 15 * sec, Source: fleet.SourceBudget, Token: true}, "retry budget empty: paced", -15, 1},
		{"a disabled budget takes nothing", config(func(c *fleet.Config) { c.DisableBudget = true }),
			fleet.ProviderState{Tokens: 0, TokensAt: t0}, 0, normal(ms(500)),
			fleet.Verdict{Delay: ms(500)}, "", 0, 0 + 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.state
			got := s.Admit(tc.cfg, at(tc.now), tc.retry, fixedRand(0))
			if !strings.HasPrefix(got.Detail, tc.detail) || (tc.detail == "" && got.Detail != "") {
				t.Errorf("Detail = %q, want prefix %q", got.Detail, tc.detail)
			}
			got.Detail = ""
			if got != tc.want {
				t.Errorf("Admit = %+v, want %+v", got, tc.want)
			}
			if s.Tokens != tc.wantTokens || s.Queued != tc.wantQueued {
				t.Errorf("after: Tokens %v Queued %d, want %v and %d", s.Tokens, s.Queued, tc.wantTokens, tc.wantQueued)
			}
		})
	}
}

// TestSuccessCredit: successes refill the budget by SuccessCredit each, so
// ten successes pay for one retry when nothing else refills it.
func TestSuccessCredit(t *testing.T) {
	t.Parallel()
	cfg := config(func(c *fleet.Config) { c.RefillPerSecond = 0 })
	s := fleet.ProviderState{Tokens: 0, TokensAt: t0}
	for i := range 9 {
		s.Succeeded(cfg, t0, fleet.Success{})
		if v := s.Admit(cfg, t0, normal(ms(500)), noRand{t}); !v.Delegate {
			t.Fatalf("after %d successes: admitted with %v tokens", i+1, s.Tokens)
		}
	}
	s.Succeeded(cfg, t0, fleet.Success{})
	if v := s.Admit(cfg, t0, normal(ms(500)), noRand{t}); v.Delegate || !v.Token {
		t.Fatalf("after 10 successes: %+v, want a retry with a token", v)
	}
	if s.Tokens > 1e-9 || s.Tokens < -1e-9 {
		t.Errorf("Tokens = %v, want 0", s.Tokens)
	}
}

// TestBudgetBound is the sizing formula as a property: over any run of
// successes, refill and retries, the retries admitted with a token never
// exceed Capacity + RefillPerSecond·T + SuccessCredit·S.
func TestBudgetBound(t *testing.T) {
	t.Parallel()
	cfg := config(func(c *fleet.Config) { c.Capacity, c.RefillPerSecond, c.SuccessCredit = 5, 0.5, 0.25 })
	s := fleet.ProviderState{}
	tokens, successes := 0, 0
	now := t0
	for i := range 2000 {
		now = now.Add(ms(int64(37 * (i % 7))))
		switch i % 5 {
		case 0:
			s.Succeeded(cfg, now, fleet.Success{})
			successes++
		default:
			if v := s.Admit(cfg, now, normal(ms(500)), noRand{t}); v.Token {
				tokens++
			}
		}
		bound := cfg.Capacity + cfg.RefillPerSecond*now.Sub(t0).Seconds() + cfg.SuccessCredit*float64(successes)
		if float64(tokens) > bound {
			t.Fatalf("step %d: %d retries with a token, bound %v", i, tokens, bound)
		}
	}
	if tokens == 0 {
		t.Fatal("no retry was admitted at all")
	}
}
