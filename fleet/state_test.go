package fleet_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/proto"
)

func TestSnapshot(t *testing.T) {
	t.Parallel()
	cfg := config(nil)
	var s fleet.ProviderState
	succeedN(&s, cfg, t0, 10)
	failN(&s, cfg, at(time.Second), 30) // 75% of 40: opens at the 10th failure
	s.Failed(cfg, at(time.Second), fleet.Failure{RetryAfter: 20 * time.Second})
	v := s.Admit(cfg, at(time.Second), normal(ms(500)), fixedRand(0))
	if !v.Probe {
		t.Fatalf("Admit = %+v, want a probe", v)
	}
	want := fleet.Snapshot{
		Tokens: 100, Capacity: 100, // 100 + 10·0.1, capped, less one retry, plus 1 s of refill
		Failures: 31, Successes: 10, FailureRate: 31.0 / 41,
		Circuit: fleet.Open, OpenUntil: at(6 * time.Second), HalfOpenProbes: 3,
		Opens: 1, Queued: 1, EarliestStart: at(21 * time.Second),
	}
	if got := s.Snapshot(cfg, at(2*time.Second)); got != want {
		t.Errorf("Snapshot =\n%+v, want\n%+v", got, want)
	}
	before := s
	_ = s.Snapshot(cfg, at(time.Hour))
	if !reflect.DeepEqual(s, before) {
		t.Error("Snapshot changed the state")
	}
	// An hour on: closed? No — half-open, waiting for its probe; the window
	// has emptied and the Retry-After has passed.
	want = fleet.Snapshot{Tokens: 100, Capacity: 100, Circuit: fleet.HalfOpen, OpenUntil: at(6 * time.Second),
		HalfOpenProbes: 3, Opens: 1, Queued: 1, EarliestStart: at(time.Hour)}
	if got := s.Snapshot(cfg, at(time.Hour)); got != want {
		t.Errorf("an hour on: Snapshot =\n%+v, want\n%+v", got, want)
	}
}

func TestDropped(t *testing.T) {
	t.Parallel()
	cfg := config(nil)
	var s fleet.ProviderState
	s.Admit(cfg, t0, normal(ms(500)), noRand{t})
	s.Admit(cfg, t0, normal(ms(500)), noRand{t})
	s.Dropped(cfg, t0)
	if s.Queued != 1 || s.Tokens != 98 {
		t.Fatalf("Queued %d Tokens %v, want 1 and 98 (a dropped retry's token is spent)", s.Queued, s.Tokens)
	}
	s.Dropped(cfg, t0)
	s.Dropped(cfg, t0)
	if s.Queued != 0 {
		t.Fatalf("Queued %d, want 0", s.Queued)
	}
}

// TestStateRoundTrips: the state is plain data. A store that serialises it
// between every operation (JSON here; the stores will use a proto) gets
// exactly the verdicts of one kept in memory.
func TestStateRoundTrips(t *testing.T) {
	t.Parallel()
	cfg := config(func(c *fleet.Config) { c.Capacity = 5 })
	type op func(s *fleet.ProviderState, now time.Time, rng fleet.Rand) any
	fail := func(probe bool, ra time.Duration) op {
		return func(s *fleet.ProviderState, now time.Time, _ fleet.Rand) any {
			s.Failed(cfg, now, fleet.Failure{Probe: probe, RetryAfter: ra})
			return nil
		}
	}
	succeed := func(probe bool) op {
		return func(s *fleet.ProviderState, now time.Time, _ fleet.Rand) any {
			s.Succeeded(cfg, now, fleet.Success{Probe: probe})
			return nil
		}
	}
	admit := func(r fleet.Retry) op {
		return func(s *fleet.ProviderState, now time.Time, rng fleet.Rand) any { return s.Admit(cfg, now, r, rng) }
	}
	start := func(s *fleet.ProviderState, now time.Time, rng fleet.Rand) any {
		return s.Start(cfg, now, fleet.Pending{}, rng)
	}
	var script []op
	for i := range 40 {
		script = append(script, fail(false, time.Duration(i%3)*time.Second), admit(normal(ms(500))), admit(always(ms(700))))
	}
	script = append(script, start, start, start, start, fail(true, 0), start, succeed(false), start, start, succeed(true), start, admit(normal(ms(100))))

	run := func(persist bool) []any {
		var s fleet.ProviderState
		var out []any
		rng := fixedRand(0.3)
		for i, o := range script {
			now := at(time.Duration(i) * 97 * time.Millisecond)
			out = append(out, o(&s, now, rng))
			if persist {
				b, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				s = fleet.ProviderState{}
				if err := json.Unmarshal(b, &s); err != nil {
					t.Fatal(err)
				}
			}
		}
		out = append(out, s.Snapshot(cfg, at(time.Minute)))
		return out
	}
	mem, stored := run(false), run(true)
	if !reflect.DeepEqual(mem, stored) {
		for i := range mem {
			if !reflect.DeepEqual(mem[i], stored[i]) {
				t.Fatalf("step %d: in memory %+v, through storage %+v", i, mem[i], stored[i])
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := fleet.DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	tests := []struct {
		name string
		edit func(*fleet.Config)
		want []string // every FieldError, as text
	}{
		{"capacity below one token", func(c *fleet.Config) { c.Capacity = 0.5 },
			[]string{`fleet: invalid Capacity "0.5": must be a number within [1, 1e+09]`}},
		{"a budget that never refills", func(c *fleet.Config) { c.RefillPerSecond, c.SuccessCredit = 0, 0 },
			[]string{`fleet: invalid RefillPerSecond "0": RefillPerSecond and SuccessCredit are both 0: an empty budget would never refill`}},
		{"negative credit", func(c *fleet.Config) { c.SuccessCredit = -1 },
			[]string{`fleet: invalid SuccessCredit "-1": must be a number within [0, 1e+09]`}},
		{"window slices under a millisecond", func(c *fleet.Config) { c.Window = 5 * time.Millisecond; c.WindowBuckets = 10 },
			[]string{`fleet: invalid WindowBuckets "10": Window/WindowBuckets must be at least 1ms`}},
		{"every circuit field", func(c *fleet.Config) {
			c.Window, c.WindowBuckets, c.MinSamples, c.FailureThreshold = 0, 0, 0, 1.5
			c.OpenFor, c.HalfOpenProbes, c.ProbeTimeout = -time.Second, 0, 0
		}, []string{
			`fleet: invalid Window "0s": must be within [1ms, 596h31m23.647s]`,
			`fleet: invalid WindowBuckets "0": must be within [1, 3600]`,
			`fleet: invalid MinSamples "0": must be at least 1`,
			`fleet: invalid FailureThreshold "1.5": must be within (0, 1]`,
			`fleet: invalid OpenFor "-1s": must be within [1ms, 596h31m23.647s]`,
			`fleet: invalid HalfOpenProbes "0": must be at least 1`,
			`fleet: invalid ProbeTimeout "0s": must be within [1ms, 596h31m23.647s]`,
		}},
		{"negative spread and Retry-After bound", func(c *fleet.Config) { c.SpreadWindow, c.MaxFleetRetryAfter = -1, -1 }, []string{
			`fleet: invalid SpreadWindow "-1ns": must be within [0s, 596h31m23.647s]`,
			`fleet: invalid MaxFleetRetryAfter "-1ns": must be within [0s, 596h31m23.647s]`,
		}},
		{"disabled parts are still checked", func(c *fleet.Config) { c.DisableBudget, c.Capacity = true, 0 },
			[]string{`fleet: invalid Capacity "0": must be a number within [1, 1e+09]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := config(tc.edit).Validate()
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var fe *fleet.FieldError
				if !errors.As(e, &fe) {
					t.Errorf("%v is not a *FieldError", e)
				}
				got = append(got, e.Error())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Validate:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestRetryOf(t *testing.T) {
	t.Parallel()
	resolve := func(p *retrydv1.RetryPolicy) *policy.Policy {
		r, err := policy.Resolve(p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	deadline := at(time.Minute)
	tests := []struct {
		name    string
		policy  *retrydv1.RetryPolicy
		attempt policy.Attempt
		delayMs uint64
		want    fleet.Retry
	}{
		{"normal mode may end", nil, policy.Attempt{}, 500, fleet.Retry{Delay: ms(500), Cap: 10 * time.Second}},
		{"always mode must not", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS, Backoff: &retrydv1.Backoff{MaxDelayMs: proto.Uint64(30000)}},
			policy.Attempt{}, 1000, fleet.Retry{Delay: time.Second, Cap: 30 * time.Second, MustNotEnd: true}},
		{"schedule mode's cap is its longest delay", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE},
			policy.Attempt{}, 2000, fleet.Retry{Delay: 2 * time.Second, Cap: 20 * time.Second, MustNotEnd: true}},
		{"a deadline less the minimum attempt", nil, policy.Attempt{Deadline: deadline, HasDeadline: true}, 500,
			fleet.Retry{Delay: ms(500), Cap: 10 * time.Second, Latest: deadline.Add(-ms(100)), HasLatest: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := fleet.RetryOf(resolve(tc.policy), policy.Decision{Schedule: true, DelayMs: tc.delayMs}, tc.attempt)
			if got != tc.want {
				t.Errorf("RetryOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestProviderFaultAndRetryAfterOf(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"RATE_LIMIT": true, "SERVER": true, "TIMEOUT": true, "TRANSPORT": true,
		"EMPTY_RESPONSE": true, "INVALID_REQUEST": false, "AUTH": false, "ABORTED": false} {
		if got := fleet.ProviderFault(code); got != want {
			t.Errorf("ProviderFault(%s) = %v, want %v", code, got, want)
		}
	}
	for _, tc := range []struct {
		ra   policy.RetryAfter
		want time.Duration
	}{
		{policy.RetryAfter{}, 0},
		{policy.RetryAfter{Valid: true, Ms: 2000}, 2 * time.Second},
		{policy.RetryAfter{Valid: true, Over: true}, fleet.MaxDuration},
	} {
		if got := fleet.RetryAfterOf(tc.ra); got != tc.want {
			t.Errorf("RetryAfterOf(%v) = %v, want %v", tc.ra, got, tc.want)
		}
	}
}

// TestClockBackwards: a replica whose clock is behind neither refills the
// budget nor loses its outcomes.
func TestClockBackwards(t *testing.T) {
	t.Parallel()
	cfg := config(nil)
	s := fleet.ProviderState{Tokens: 0, TokensAt: at(10 * time.Second)}
	failN(&s, cfg, at(10*time.Second), 5)
	failN(&s, cfg, at(9*time.Second), 5) // a replica one second behind
	if snap := s.Snapshot(cfg, at(10*time.Second)); snap.Failures != 10 || snap.Tokens != 0 {
		t.Fatalf("Snapshot %+v, want 10 failures and no refill", snap)
	}
}
