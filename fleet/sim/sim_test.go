package sim_test

import (
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/fleet"
	"github.com/retryd/retryd/fleet/sim"
)

// protection returns the named protection of sim.Protections.
func protection(t *testing.T, name string) fleet.Config {
	t.Helper()
	for _, p := range sim.Protections() {
		if p.Name == name {
			return p.Config
		}
	}
	t.Fatalf("no protection %q", name)
	return fleet.Config{}
}

// deciders are the decision functions the simulation's proofs run against.
// service.Service is not among them: its stores' timers run on the wall
// clock, so a simulated minute would take a real one. The service's fleet
// calls are tested over every store in service/fleet_test.go.
var deciders = []struct {
	name string
	new  func(fleet.Config) sim.Decider
}{
	{"local", func(cfg fleet.Config) sim.Decider { return sim.NewLocal(cfg, 7) }},
}

// forEachDecider runs test once per decider, in parallel.
func forEachDecider(t *testing.T, test func(t *testing.T, newDecider func(fleet.Config) sim.Decider)) {
	for _, d := range deciders {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			test(t, d.new)
		})
	}
}

// snapshotter is a Decider that can show a provider's fleet state (what
// GetProviderState answers).
type snapshotter interface {
	Snapshot(provider string, now time.Time) fleet.Snapshot
}

// run simulates sc with a fresh decider and returns the failing provider's
// result.
func run(sc sim.Scenario, d sim.Decider) sim.ProviderResult {
	return sim.Run(sc, d).Provider("deepseek")
}

// TestBudgetCapsRetries: during the outage the provider serves almost
// nothing, so the budget lets through its capacity, its refill and the
// credit of the few successes that still arrive, and not one retry more:
//
//	scheduled ≤ Capacity + RefillPerSecond·60 + SuccessCredit·successes
//
// This bound has no tolerance: it is the bucket's invariant (every
// normal-mode retry the fleet schedules took a token). The lower bound has
// 5 %: the bucket is full when the outage starts (the provider was healthy)
// and failures keep coming, so nearly every token is used, except what is
// left at the window's end and the credit of its last successes.
func TestBudgetCapsRetries(t *testing.T) {
	t.Parallel()
	forEachDecider(t, testBudgetCapsRetries)
}

func testBudgetCapsRetries(t *testing.T, newDecider func(fleet.Config) sim.Decider) {
	cfg := protection(t, "budget")
	d := newDecider(cfg)
	with := run(sim.Outage(sim.NormalPolicy), d)
	without := run(sim.Outage(sim.NormalPolicy), newDecider(protection(t, "policy only")))

	scheduled := sim.Between(with.ScheduledPerSecond, sim.OutageStart, sim.OutageEnd)
	successes := sim.Between(with.SuccessesPerSecond, sim.OutageStart, sim.OutageEnd)
	bound := cfg.Capacity + cfg.RefillPerSecond*(sim.OutageEnd-sim.OutageStart).Seconds() + cfg.SuccessCredit*float64(successes)
	if float64(scheduled) > bound || float64(scheduled) < 0.95*bound {
		t.Errorf("retries scheduled in the outage: %d, want within [%.1f, %.1f] (%d successes)", scheduled, 0.95*bound, bound, successes)
	}
	if l, ok := d.(*sim.Local); ok {
		if st := l.Stats("deepseek"); st.WithToken != st.Admitted {
			t.Errorf("%d of %d normal-mode retries took a token, want all", st.WithToken, st.Admitted)
		}
	}
	// Whatever was not retried was delegated for the budget, and the
	// provider saw about a hundredth of the retries it sees without it.
	if with.Delegated["fleet_budget_exhausted"] == 0 {
		t.Error("nothing was delegated fleet_budget_exhausted")
	}
	inOutage := sim.Between(with.RetriesPerSecond, sim.OutageStart, sim.OutageEnd)
	withoutInOutage := sim.Between(without.RetriesPerSecond, sim.OutageStart, sim.OutageEnd)
	if inOutage*100 > withoutInOutage {
		t.Errorf("retries started in the outage: %d with the budget, %d without; want at most a hundredth", inOutage, withoutInOutage)
	}
}

// TestCircuitSpreadsRecovery: always-mode agents never give up, so when the
// provider recovers every agent has a retry held behind its circuit. With
// the spread window they start over it — at most Agents/SpreadWindow per
// second, plus 5 % — and without it they start all in one second.
//
// The 5 %: the golden-ratio slots put 100 ± 2 of 1 000 retries in each tenth
// of the window (TestSpreadIsEven in package fleet), and the retries
// displaced by the half-open probes go behind the window, not into it.
func TestCircuitSpreadsRecovery(t *testing.T) {
	t.Parallel()
	forEachDecider(t, testCircuitSpreadsRecovery)
}

func testCircuitSpreadsRecovery(t *testing.T, newDecider func(fleet.Config) sim.Decider) {
	cfg := protection(t, "fleet (defaults)")
	sc := sim.Outage(sim.AlwaysPolicy)
	d := newDecider(cfg)
	spread := run(sc, d)
	herd := run(sc, newDecider(protection(t, "fleet, no spread")))
	unprotected := run(sc, newDecider(protection(t, "policy only")))

	after := func(p sim.ProviderResult) int {
		n, _ := peakBetween(p.RetriesPerSecond, sim.OutageEnd, sc.Duration)
		return n
	}
	limit := int(math.Ceil(1.05 * float64(sc.Agents) / cfg.SpreadWindow.Seconds()))
	if got := after(spread); got > limit {
		t.Errorf("with a %s spread window: %d retries started in one second after recovery, want at most %d", cfg.SpreadWindow, got, limit)
	}
	if got := after(herd); got < 9*sc.Agents/10 {
		t.Errorf("without spreading: at most %d retries in one second after recovery, want a herd of at least %d", got, 9*sc.Agents/10)
	}
	// The backlog drains within the last open period, its probe's answer
	// and two spread windows (the window, and the back of the queue).
	if want := cfg.OpenFor + sc.SuccessLatency + 2*cfg.SpreadWindow + time.Second; spread.Drain > want {
		t.Errorf("drain %v, want at most %v", spread.Drain, want)
	}
	// While the provider was down, the circuit let through its probes and
	// little else: a twentieth of the retries the policy alone starts.
	inOutage := sim.Between(spread.RetriesPerSecond, sim.OutageStart, sim.OutageEnd)
	unprotectedInOutage := sim.Between(unprotected.RetriesPerSecond, sim.OutageStart, sim.OutageEnd)
	if inOutage*20 > unprotectedInOutage {
		t.Errorf("retries started in the outage: %d behind the circuit, %d without; want at most a twentieth", inOutage, unprotectedInOutage)
	}
	if spread.Held == 0 {
		t.Error("no due retry was held back")
	}
	if l, ok := d.(*sim.Local); ok && l.Stats("deepseek").Probes == 0 {
		t.Errorf("stats %+v: want probes", l.Stats("deepseek"))
	}
	if sn, ok := d.(snapshotter); ok {
		if snap := sn.Snapshot("deepseek", sim.Epoch.Add(sc.Duration)); snap.Circuit != fleet.Closed || snap.Opens == 0 {
			t.Errorf("at the end: %+v, want a closed circuit that opened", snap)
		}
	}
}

// TestHealthyNeighbourUnaffected: two providers, each serving half of 2 000
// agents; only the first fails. The healthy one's every number — per second
// — is the same as when its neighbour does not fail at all.
func TestHealthyNeighbourUnaffected(t *testing.T) {
	t.Parallel()
	forEachDecider(t, testHealthyNeighbourUnaffected)
}

func testHealthyNeighbourUnaffected(t *testing.T, newDecider func(fleet.Config) sim.Decider) {
	for _, tc := range []struct {
		name   string
		policy sim.Scenario
	}{
		{"normal", sim.Neighbours(sim.NormalPolicy, true)},
		{"always", sim.Neighbours(sim.AlwaysPolicy, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := fleet.DefaultConfig()
			failing := tc.policy
			calm := tc.policy
			calm.Providers = append([]sim.Provider(nil), calm.Providers...)
			calm.Providers[0].OutageStart, calm.Providers[0].OutageEnd = 0, 0

			withSick := sim.Run(failing, newDecider(cfg))
			alone := sim.Run(calm, newDecider(cfg))
			// The failing provider was protected: retries delegated or held.
			if sick := withSick.Provider("deepseek"); sick.Delegated["fleet_budget_exhausted"]+sick.Held == 0 {
				t.Fatalf("the failing provider's protection never acted (%+v): the test would prove nothing", summary(sick))
			}
			got, want := withSick.Provider("healthy"), alone.Provider("healthy")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("healthy provider beside a failing one:\n%+v\nbeside a healthy one:\n%+v", summary(got), summary(want))
			}
			if got.Successes == 0 || got.RetriesStarted == 0 {
				t.Errorf("healthy provider: %+v, want successes and background retries", summary(got))
			}
		})
	}
}

// TestDeterministic: the same scenario gives the same numbers.
func TestDeterministic(t *testing.T) {
	t.Parallel()
	forEachDecider(t, func(t *testing.T, newDecider func(fleet.Config) sim.Decider) {
		a := run(sim.Outage(sim.AlwaysPolicy), newDecider(fleet.DefaultConfig()))
		b := run(sim.Outage(sim.AlwaysPolicy), newDecider(fleet.DefaultConfig()))
		if !reflect.DeepEqual(a, b) {
			t.Fatal("two runs of one scenario differ")
		}
	})
}

// TestRunFollowsTheDecider: the agents do what the Decider says, at the
// times it says: the contract every Decider is held to.
func TestRunFollowsTheDecider(t *testing.T) {
	t.Parallel()
	var calls []string
	var failedAt []time.Time
	d := &fakeDecider{
		failedStep: func(now time.Time, f sim.Failure) sim.Decision {
			failedAt = append(failedAt, now)
			calls = append(calls, "failed")
			if len(failedAt) == 3 {
				return sim.Decision{Reason: "budget_exhausted"}
			}
			return sim.Decision{Schedule: true, RetryID: "r", DueAt: now.Add(time.Second), Source: "backoff"}
		},
		awaitStart: func(now time.Time, id string) sim.Start {
			calls = append(calls, "await "+now.Sub(failedAt[len(failedAt)-1]).String())
			if now.Sub(failedAt[len(failedAt)-1]) == time.Second {
				return sim.Start{At: now.Add(2 * time.Second)} // hold it 2 s more
			}
			return sim.Start{Now: true}
		},
		stepSucceeded: func(time.Time, sim.Success) { calls = append(calls, "succeeded") },
	}
	// One agent starts within the first millisecond; the run ends after
	// its third failure (at about 6.6 s).
	sc := sim.Scenario{
		Agents: 1, Providers: []sim.Provider{{Name: "deepseek", OutageStart: 0, OutageEnd: time.Minute}},
		Duration: 6700 * time.Millisecond, SuccessLatency: time.Second, FailureLatency: 200 * time.Millisecond,
		Period: time.Millisecond, Seed: 1,
	}
	res := sim.Run(sc, d).Provider("deepseek")
	want := []string{"failed", "await 1s", "await 3s", "failed", "await 1s", "await 3s", "failed"}
	if strings.Join(calls, ", ") != strings.Join(want, ", ") {
		t.Errorf("calls:\n%s\nwant\n%s", strings.Join(calls, ", "), strings.Join(want, ", "))
	}
	// Each retry started 3 s after its failure was reported and failed
	// 200 ms later.
	for i := 1; i < len(failedAt); i++ {
		if gap := failedAt[i].Sub(failedAt[i-1]); gap != 3200*time.Millisecond {
			t.Errorf("failure %d came %v after the one before, want 3.2s", i+1, gap)
		}
	}
	// After the delegation the next operation starts at once (its period
	// passed long ago); the run ends before it fails.
	if res.FirstAttempts != 2 || res.RetriesStarted != 2 || res.Held != 2 || res.Delegated["budget_exhausted"] != 1 {
		t.Errorf("result %+v", summary(res))
	}
}

// fakeDecider is a Decider made of functions.
type fakeDecider struct {
	failedStep    func(time.Time, sim.Failure) sim.Decision
	awaitStart    func(time.Time, string) sim.Start
	stepSucceeded func(time.Time, sim.Success)
}

func (f *fakeDecider) FailedStep(now time.Time, x sim.Failure) sim.Decision {
	return f.failedStep(now, x)
}
func (f *fakeDecider) AwaitStart(now time.Time, id string) sim.Start { return f.awaitStart(now, id) }
func (f *fakeDecider) StepSucceeded(now time.Time, s sim.Success)    { f.stepSucceeded(now, s) }

// TestDocsAreCurrent: the table in docs/fleet.md and the plot beside it are
// what the command produces today. After a change that moves the numbers,
// run go run ./fleet/sim/cmd/fleet-sim from the repository root.
func TestDocsAreCurrent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole report (8 simulations); skipped with -short")
	}
	rows := sim.Report()
	doc, err := os.ReadFile("../../docs/fleet.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := sim.UpdateDoc(string(doc), sim.Table(rows))
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != want {
		t.Error("docs/fleet.md's table is stale: run go run ./fleet/sim/cmd/fleet-sim")
	}
	svg, err := os.ReadFile("../../docs/fleet-retries.svg")
	if err != nil {
		t.Fatal(err)
	}
	if string(svg) != string(sim.Plot(rows)) {
		t.Error("docs/fleet-retries.svg is stale: run go run ./fleet/sim/cmd/fleet-sim")
	}
}

func peakBetween(series []int, from, to time.Duration) (n, second int) {
	for s := int(from / time.Second); s < int(to/time.Second) && s < len(series); s++ {
		if series[s] > n {
			n, second = series[s], s
		}
	}
	return n, second
}

// summary leaves the per-second series out of a failure message.
func summary(p sim.ProviderResult) sim.ProviderResult {
	p.RetriesPerSecond, p.FirstPerSecond, p.ScheduledPerSecond, p.SuccessesPerSecond = nil, nil, nil, nil
	return p
}
