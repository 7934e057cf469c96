package sim

import "time"

// Result is what one simulation produced.
type Result struct {
	Scenario  Scenario
	Providers []ProviderResult
}

// Provider returns the result of the named provider.
func (r Result) Provider(name string) ProviderResult {
	for _, p := range r.Providers {
		if p.Name == name {
			return p
		}
	}
	panic("sim: no provider " + name)
}

// ProviderResult is what one provider saw, and what its agents were told.
type ProviderResult struct {
	Name   string
	Agents int
	// Outage is the provider's outage, as configured.
	OutageStart, OutageEnd time.Duration
	// FirstAttempts and RetriesStarted are the requests the provider got.
	FirstAttempts, RetriesStarted int
	// Successes and Failures are their outcomes.
	Successes, Failures int
	// RetriesPerSecond and FirstPerSecond count starts in each simulated
	// second; ScheduledPerSecond the retries scheduled (decided), and
	// SuccessesPerSecond the successes reported.
	RetriesPerSecond, FirstPerSecond       []int
	ScheduledPerSecond, SuccessesPerSecond []int
	// Sources counts scheduled retries by delay source; Delegated counts
	// delegations by reason.
	Sources, Delegated map[string]int
	// Held counts the times a due retry was told to wait; Cancelled the
	// retries that never started.
	Held, Cancelled int
	// Drain is how long after the outage's end the last retry scheduled
	// before that end started: how long the outage's backlog took to
	// clear.
	Drain time.Duration
}

func newProviderResult(p Provider, seconds int) ProviderResult {
	return ProviderResult{
		Name: p.Name, OutageStart: p.OutageStart, OutageEnd: p.OutageEnd,
		RetriesPerSecond: make([]int, seconds), FirstPerSecond: make([]int, seconds),
		ScheduledPerSecond: make([]int, seconds), SuccessesPerSecond: make([]int, seconds),
		Sources: map[string]int{}, Delegated: map[string]int{},
	}
}

func (p *ProviderResult) countStart(t time.Duration, retry bool) {
	s := int(t / time.Second)
	if retry {
		p.RetriesStarted++
		p.RetriesPerSecond[s]++
		return
	}
	p.FirstAttempts++
	p.FirstPerSecond[s]++
}

// PeakRetries is the most retries started in one second, and that second.
func (p ProviderResult) PeakRetries() (n, second int) {
	return peak(p.RetriesPerSecond, 0, len(p.RetriesPerSecond))
}

// Between sums series (one of the per-second series) over the whole
// seconds within [from, to).
func Between(series []int, from, to time.Duration) int {
	n := 0
	for s := int(from / time.Second); s < int(to/time.Second) && s < len(series); s++ {
		n += series[s]
	}
	return n
}

func peak(series []int, from, to int) (n, second int) {
	for s := from; s < to && s < len(series); s++ {
		if series[s] > n {
			n, second = series[s], s
		}
	}
	return n, second
}
