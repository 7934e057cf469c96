package fleet

import "time"

// Snapshot is a read-only view of a ProviderState at a moment, for the
// GetProviderState RPC, metrics and logs.
type Snapshot struct {
	// Tokens is the budget's balance; below zero while paced retries hold
	// reservations on tokens not yet refilled.
	Tokens   float64
	Capacity float64
	// Failures and Successes are the outcomes in the window; FailureRate is
	// Failures/(Failures+Successes), 0 without any.
	Failures    uint64
	Successes   uint64
	FailureRate float64
	// Circuit is the circuit's state; OpenUntil the end of the current or
	// last open period.
	Circuit   Circuit
	OpenUntil time.Time
	// ProbesStarted of HalfOpenProbes probes started in this half-open
	// round.
	ProbesStarted  uint32
	HalfOpenProbes uint32
	// Opens counts how often the circuit opened.
	Opens uint64
	// Queued counts retries admitted and not yet started or dropped.
	Queued uint64
	// EarliestStart is the earliest a retry admitted now could start, before
	// its own delay and its place in the spread window: now, or the end of
	// the open period or of the fleet-wide Retry-After.
	EarliestStart time.Time
}

// Snapshot reads the state at now without changing it.
func (s ProviderState) Snapshot(cfg Config, now time.Time) Snapshot {
	s.advance(cfg, now) // on the copy; advance never writes into Window
	f, ok := s.outcomes(cfg, now)
	snap := Snapshot{
		Tokens: s.Tokens, Capacity: cfg.Capacity,
		Failures: f, Successes: ok,
		Circuit: s.Circuit, OpenUntil: s.OpenUntil,
		ProbesStarted: s.ProbesStarted, HalfOpenProbes: uint32(cfg.HalfOpenProbes),
		Opens: s.Opens, Queued: s.Queued, EarliestStart: now,
	}
	if f+ok > 0 {
		snap.FailureRate = float64(f) / float64(f+ok)
	}
	if s.Circuit == Open {
		snap.EarliestStart = laterOf(snap.EarliestStart, s.OpenUntil)
	}
	if cfg.MaxFleetRetryAfter > 0 {
		snap.EarliestStart = laterOf(snap.EarliestStart, s.PacedUntil)
	}
	return snap
}
