package fleet_test

import (
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
)

func TestCircuitOpens(t *testing.T) {
	t.Parallel()
	type batch struct {
		at                  time.Duration
		successes, failures int
	}
	tests := []struct {
		name     string
		cfg      fleet.Config
		batches  []batch
		wantOpen bool
	}{
		{"19 failures are below the minimum sample", config(nil), []batch{{0, 0, 19}}, false},
		{"20 failures open it", config(nil), []batch{{0, 0, 20}}, true},
		{"a 50% failure rate reaches the threshold", config(nil), []batch{{0, 10, 10}}, true},
		{"45% does not", config(nil), []batch{{0, 11, 9}}, false},
		{"failures 10 s old have left the window", config(nil), []batch{{0, 0, 10}, {10 * time.Second, 0, 10}}, false},
		{"failures 9.999 s old are still in it", config(nil), []batch{{0, 0, 10}, {ms(9999), 0, 10}}, true},
		{"successes 10 s old have left it too", config(nil), []batch{{0, 100, 0}, {10 * time.Second, 0, 20}}, true},
		{"a higher threshold", config(func(c *fleet.Config) { c.FailureThreshold = 0.9 }), []batch{{0, 3, 27}}, true},
		{"just below the higher threshold", config(func(c *fleet.Config) { c.FailureThreshold = 0.9 }), []batch{{0, 4, 26}}, false},
		{"a disabled circuit never opens", config(func(c *fleet.Config) { c.DisableCircuit = true }), []batch{{0, 0, 1000}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var s fleet.ProviderState
			last := time.Duration(0)
			for _, b := range tc.batches {
				succeedN(&s, tc.cfg, at(b.at), b.successes)
				failN(&s, tc.cfg, at(b.at), b.failures)
				last = b.at
			}
			if got := s.Circuit == fleet.Open; got != tc.wantOpen {
				t.Fatalf("circuit %v, want open %v", s.Circuit, tc.wantOpen)
			}
			if tc.wantOpen && (!s.OpenUntil.Equal(at(last+5*time.Second)) || s.Opens != 1) {
				t.Errorf("OpenUntil %v Opens %d, want %v and 1", s.OpenUntil, s.Opens, at(last+5*time.Second))
			}
		})
	}
}

func TestAdmitCircuit(t *testing.T) {
	t.Parallel()
	sec := time.Second
	halfOpen := func(started uint32, spread uint64) fleet.ProviderState {
		return fleet.ProviderState{Circuit: fleet.HalfOpen, OpenUntil: t0, HalfOpenSince: t0, ProbesStarted: started, SpreadNext: spread}
	}
	held := func(scheduled uint32, spread uint64) fleet.ProviderState {
		s := openAt(0)
		s.ProbesScheduled, s.SpreadNext = scheduled, spread
		return s
	}
	tests := []struct {
		name  string
		state fleet.ProviderState
		now   time.Duration
		retry fleet.Retry
		want  fleet.Verdict
		// detail is the Detail's prefix; suffix its end.
		detail, suffix string
		// wantScheduled is ProbesScheduled after.
		wantScheduled uint32
	}{
		{"open: the first retry is a probe at its end", openAt(0), sec, normal(ms(500)),
			fleet.Verdict{Delay: 4 * sec, Source: fleet.SourceCircuit, Probe: true, Token: true},
			"circuit open until 12:00:05.000: scheduled as probe 1 of 3 at its end", "", 1},
		{"open: the third probe", held(2, 0), sec, normal(ms(500)),
			fleet.Verdict{Delay: 4 * sec, Source: fleet.SourceCircuit, Probe: true, Token: true},
			"circuit open until 12:00:05.000: scheduled as probe 3 of 3", "", 3},
		{"open: the fourth retry takes the first spread slot", held(3, 0), sec, normal(ms(500)),
			fleet.Verdict{Delay: 4 * sec, Source: fleet.SourceCircuit, Token: true},
			"circuit open until 12:00:05.000: held, spread to 12:00:05.000 within a 5s window after it", "", 3},
		{"open: the second spread slot is 3091 ms in", held(3, 1), sec, normal(ms(500)),
			fleet.Verdict{Delay: ms(7091), Source: fleet.SourceCircuit, Token: true},
			"circuit open until 12:00:05.000: held, spread to 12:00:08.091", "", 3},
		{"open: the third spread slot is 1181 ms in", held(3, 2), sec, always(ms(500)),
			fleet.Verdict{Delay: ms(5181), Source: fleet.SourceCircuit, Token: true}, "circuit open", "", 3},
		{"open: a longer policy delay stands", openAt(0), sec, normal(9 * sec),
			fleet.Verdict{Delay: 9 * sec, Probe: true, Token: true}, "circuit open until 12:00:05.000: scheduled as probe 1 of 3 at its end", "", 1},
		{"open: normal mode held past its cap is delegated", held(3, 1), sec,
			fleet.Retry{Delay: ms(500), Cap: 6 * sec},
			fleet.Verdict{Delegate: true, Reason: fleet.ReasonCircuitOpen},
			"circuit open until 12:00:05.000: held, spread to 12:00:08.091", "that is past the policy's cap of 6s or the deadline", 3},
		{"open: normal mode held past its deadline is delegated", openAt(0), sec,
			fleet.Retry{Delay: ms(500), Cap: 10 * sec, Latest: at(3 * sec), HasLatest: true},
			fleet.Verdict{Delegate: true, Reason: fleet.ReasonCircuitOpen}, "circuit open until", "or the deadline", 0},
		// Held to 8.091 s, past the 7 s cap: moved before the cap by the next
		// spread slot, 1181 ms.
		{"open: always mode held past its cap starts before the cap", held(3, 1), sec,
			fleet.Retry{Delay: ms(500), Cap: 6 * sec, MustNotEnd: true},
			fleet.Verdict{Delay: ms(4819), Source: fleet.SourceCircuit, Token: true},
			"circuit open until 12:00:05.000: held, spread to 12:00:08.091", "; bounded by the policy's cap of 6s or the deadline: starts at 12:00:05.819", 3},
		{"an open period that ended is half-open: a probe", openAt(-5 * sec), sec, normal(ms(500)),
			fleet.Verdict{Delay: ms(500), Probe: true, Token: true}, "circuit half-open: 0 of 3 probes started; this retry may be one", "", 0},
		{"half-open with a free probe slot", halfOpen(2, 0), sec, normal(ms(500)),
			fleet.Verdict{Delay: ms(500), Probe: true, Token: true}, "circuit half-open: 2 of 3 probes started; this retry may be one", "", 0},
		// Behind the retries spread over the 5 s after the open period: 5 s
		// plus the second spread slot, 3091 ms.
		{"half-open with every probe out: to the back of the spread window", halfOpen(3, 1), sec, normal(ms(500)),
			fleet.Verdict{Delay: ms(7091), Source: fleet.SourceCircuit, Token: true},
			"circuit half-open: 3 of 3 probes started, waiting for their outcome; held to 12:00:08.091", "", 0},
		// Half-open for longer than the spread window: a tenth of the open
		// period from now, plus the slot.
		{"half-open long after the window", halfOpen(3, 1), 20 * sec, normal(ms(500)),
			fleet.Verdict{Delay: ms(3591), Source: fleet.SourceCircuit, Token: true},
			"circuit half-open: 3 of 3 probes started, waiting for their outcome; held to 12:00:23.591", "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.state
			before := s
			got := s.Admit(config(nil), at(tc.now), tc.retry, fixedRand(0))
			if !strings.HasPrefix(got.Detail, tc.detail) || !strings.HasSuffix(got.Detail, tc.suffix) ||
				(tc.detail == "" && got.Detail != "") {
				t.Errorf("Detail = %q, want %q … %q", got.Detail, tc.detail, tc.suffix)
			}
			got.Detail = ""
			if got != tc.want {
				t.Errorf("Admit = %+v, want %+v", got, tc.want)
			}
			if got.Delegate {
				before.Tokens, before.TokensAt = s.Tokens, s.TokensAt // the budget was brought up to date
				if s.ProbesScheduled != before.ProbesScheduled || s.SpreadNext != before.SpreadNext || s.Queued != 0 {
					t.Errorf("a delegation changed the state: %+v, was %+v", s, before)
				}
				return
			}
			if s.ProbesScheduled != tc.wantScheduled || s.Queued != 1 {
				t.Errorf("ProbesScheduled %d Queued %d, want %d and 1", s.ProbesScheduled, s.Queued, tc.wantScheduled)
			}
		})
	}
}

// TestAdmitCircuitBeforeBudget: a normal-mode retry the circuit would hold
// past its cap is delegated for the circuit, and takes no token.
func TestAdmitCircuitBeforeBudget(t *testing.T) {
	t.Parallel()
	s := openAt(0)
	s.ProbesScheduled, s.SpreadNext, s.Tokens, s.TokensAt = 3, 1, 50, t0
	v := s.Admit(config(nil), t0, fleet.Retry{Delay: ms(500), Cap: 6 * time.Second}, fixedRand(0))
	if v.Reason != fleet.ReasonCircuitOpen || s.Tokens != 50 {
		t.Fatalf("Admit = %+v, Tokens %v; want circuit_open and 50 tokens", v, s.Tokens)
	}
	s.Tokens = 0
	v = s.Admit(config(nil), t0, normal(ms(500)), fixedRand(0))
	if v.Reason != fleet.ReasonBudgetExhausted {
		t.Fatalf("Admit = %+v, want budget exhausted when the hold fits but the budget is empty", v)
	}
}

func TestStart(t *testing.T) {
	t.Parallel()
	sec := time.Second
	tests := []struct {
		name        string
		cfg         fleet.Config
		state       fleet.ProviderState
		now         time.Duration
		pending     fleet.Pending
		want        fleet.StartVerdict // Detail checked for a prefix
		detail      string
		wantStarted uint32
		wantQueued  uint64
	}{
		{"closed: start", config(nil), fleet.ProviderState{Queued: 2}, 0, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartNow}, "", 0, 1},
		{"open: wait for its end and the first spread slot", config(nil), fleet.ProviderState{Circuit: fleet.Open, OpenUntil: at(5 * sec), Queued: 2}, sec, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartLater, At: at(5 * sec)}, "circuit open until 12:00:05.000: held to 12:00:05.000", 0, 2},
		{"open: the second spread slot", config(nil), fleet.ProviderState{Circuit: fleet.Open, OpenUntil: at(5 * sec), SpreadNext: 1, Queued: 2}, sec, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartLater, At: at(ms(8091))}, "circuit open until 12:00:05.000: held to 12:00:08.091", 0, 2},
		{"open past the last useful start: never", config(nil), fleet.ProviderState{Circuit: fleet.Open, OpenUntil: at(5 * sec), Queued: 2}, sec,
			fleet.Pending{Latest: at(4 * sec), HasLatest: true},
			fleet.StartVerdict{Action: fleet.StartNever}, "circuit open until 12:00:05.000: held to 12:00:05.000, past the operation's last useful start 12:00:04.000", 0, 1},
		{"the open period ended: the first probe", config(nil), fleet.ProviderState{Circuit: fleet.Open, OpenUntil: at(5 * sec), Queued: 2}, 5 * sec, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartNow, Probe: true}, "", 1, 1},
		{"half-open: the third probe", config(nil), fleet.ProviderState{Circuit: fleet.HalfOpen, HalfOpenSince: t0, ProbesStarted: 2, Queued: 2}, sec, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartNow, Probe: true}, "", 3, 1},
		{"half-open with every probe out: after the spread window", config(nil),
			fleet.ProviderState{Circuit: fleet.HalfOpen, OpenUntil: t0, HalfOpenSince: t0, ProbesStarted: 3, Queued: 2}, sec, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartLater, At: at(5 * sec)}, "circuit half-open: 3 probes out, waiting for their outcome; held to 12:00:05.000", 3, 2},
		{"half-open past the spread window: a tenth of the open period", config(nil),
			fleet.ProviderState{Circuit: fleet.HalfOpen, OpenUntil: t0, HalfOpenSince: t0, ProbesStarted: 3, Queued: 2}, 10 * sec, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartLater, At: at(ms(10500))}, "circuit half-open: 3 probes out, waiting for their outcome; held to 12:00:10.500", 3, 2},
		{"probes silent for ProbeTimeout: a new round", config(nil), fleet.ProviderState{Circuit: fleet.HalfOpen, OpenUntil: t0, HalfOpenSince: t0, ProbesStarted: 3, Queued: 2}, time.Minute, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartNow, Probe: true}, "", 1, 1},
		{"a disabled circuit lets an open state's retries start", config(func(c *fleet.Config) { c.DisableCircuit = true }),
			fleet.ProviderState{Circuit: fleet.Open, OpenUntil: at(5 * sec), Queued: 2}, sec, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartNow}, "", 0, 1},
		{"Queued never goes below zero", config(nil), fleet.ProviderState{}, 0, fleet.Pending{},
			fleet.StartVerdict{Action: fleet.StartNow}, "", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.state
			got := s.Start(tc.cfg, at(tc.now), tc.pending, fixedRand(0))
			if !strings.HasPrefix(got.Detail, tc.detail) || (tc.detail == "" && got.Detail != "") {
				t.Errorf("Detail = %q, want prefix %q", got.Detail, tc.detail)
			}
			got.Detail = ""
			if got != tc.want {
				t.Errorf("Start = %+v, want %+v", got, tc.want)
			}
			if s.ProbesStarted != tc.wantStarted || s.Queued != tc.wantQueued {
				t.Errorf("ProbesStarted %d Queued %d, want %d and %d", s.ProbesStarted, s.Queued, tc.wantStarted, tc.wantQueued)
			}
		})
	}
}

func TestProbeOutcomes(t *testing.T) {
	t.Parallel()
	cfg := config(nil)
	now := at(6 * time.Second)
	halfOpen := func() fleet.ProviderState {
		s := fleet.ProviderState{Circuit: fleet.HalfOpen, OpenUntil: at(5 * time.Second),
			HalfOpenSince: at(5 * time.Second), ProbesStarted: 3, Opens: 1}
		failN(&s, cfg, at(5*time.Second), 30) // the window is full of the outage
		return s
	}
	tests := []struct {
		name        string
		report      func(*fleet.ProviderState)
		wantCircuit fleet.Circuit
		wantOpens   uint64
	}{
		{"a probe's failure reopens", func(s *fleet.ProviderState) { s.Failed(cfg, now, fleet.Failure{Probe: true}) }, fleet.Open, 2},
		{"another request's failure does not", func(s *fleet.ProviderState) { s.Failed(cfg, now, fleet.Failure{}) }, fleet.HalfOpen, 1},
		{"a probe's success closes", func(s *fleet.ProviderState) { s.Succeeded(cfg, now, fleet.Success{Probe: true}) }, fleet.Closed, 1},
		{"another request's success does not", func(s *fleet.ProviderState) { s.Succeeded(cfg, now, fleet.Success{}) }, fleet.HalfOpen, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := halfOpen()
			tc.report(&s)
			if s.Circuit != tc.wantCircuit || s.Opens != tc.wantOpens {
				t.Fatalf("circuit %v Opens %d, want %v and %d", s.Circuit, s.Opens, tc.wantCircuit, tc.wantOpens)
			}
			switch s.Circuit {
			case fleet.Open:
				if !s.OpenUntil.Equal(now.Add(5*time.Second)) || s.ProbesStarted != 0 || s.ProbesScheduled != 0 {
					t.Errorf("reopened: %+v, want OpenUntil %v and no probes", s, now.Add(5*time.Second))
				}
			case fleet.Closed:
				// The outage's failures are forgotten: one more does not reopen.
				s.Failed(cfg, now, fleet.Failure{})
				if snap := s.Snapshot(cfg, now); snap.Circuit != fleet.Closed || snap.Failures != 1 || snap.Successes != 0 {
					t.Errorf("after closing and one failure: %+v", snap)
				}
			}
		})
	}
}
