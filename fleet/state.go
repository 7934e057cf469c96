package fleet

import (
	"math"
	"time"
)

// Circuit is the state of a provider's circuit.
type Circuit int32

// The circuit states. The zero value is Closed, so a fresh ProviderState
// lets retries through.
const (
	// Closed: retries start when their delay ends.
	Closed Circuit = iota
	// Open: no retry starts before OpenUntil.
	Open
	// HalfOpen: the open period ended; up to HalfOpenProbes retries may
	// start as probes, the others wait for the first probe's outcome.
	HalfOpen
)

func (c Circuit) String() string {
	switch c {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// WindowBucket counts the outcomes of one slice of the failure-rate window.
type WindowBucket struct {
	// Epoch numbers the slice: its start divided by the slice width, since
	// the Unix epoch. A bucket whose Epoch is out of the window counts as
	// empty.
	Epoch     int64
	Failures  uint32
	Successes uint32
}

// ProviderState is the fleet state of one (tenant, provider): plain data, so
// that a store can persist it, load it, apply one operation (Failed,
// Succeeded, Admit, Start, Dropped) and save it. The zero value is a fresh
// provider: a full budget and a closed circuit.
//
// Every operation takes the Config and the current time; a Config changed
// between two operations takes effect from the next one (a smaller Capacity
// trims the tokens, a different WindowBuckets resets the window). Time that
// goes backwards (a replica's clock behind another's) neither refills the
// budget nor ages the window.
type ProviderState struct {
	// Tokens is the budget's balance at TokensAt. It is below zero while
	// paced retries hold reservations on tokens not yet refilled.
	Tokens float64
	// TokensAt is when Tokens was last brought up to date; zero means the
	// budget was never used and is full.
	TokensAt time.Time

	// Window holds the recent failures and successes, WindowBuckets long.
	Window []WindowBucket

	// Circuit is the circuit's state as of the last operation (an open
	// circuit whose OpenUntil passed turns half-open on the next one).
	Circuit Circuit
	// OpenUntil is when the current or last open period ends.
	OpenUntil time.Time
	// HalfOpenSince is when the current round of probes began.
	HalfOpenSince time.Time
	// ProbesScheduled counts the retries of this open period scheduled to
	// start at its end as probes.
	ProbesScheduled uint32
	// ProbesStarted counts the probes started in the current round.
	ProbesStarted uint32
	// Opens counts how often the circuit opened, for operators.
	Opens uint64

	// PacedUntil is the earliest start the latest provider Retry-After set
	// for the whole fleet.
	PacedUntil time.Time

	// SpreadPhase and SpreadNext place held retries in the spread window:
	// the k-th held retry goes to SpreadPhase + k·(golden ratio) mod 1 of
	// it, so any run of consecutive held retries covers the window evenly,
	// however many there turn out to be. SpreadPhase is drawn from the
	// random source on the first held retry.
	SpreadPhase float64
	SpreadNext  uint64

	// Queued counts retries admitted and not yet started or dropped.
	Queued uint64
}

// advance brings the state up to now: refills the budget, ends an open
// period and restarts a round of probes that timed out.
func (s *ProviderState) advance(cfg Config, now time.Time) {
	s.refill(cfg, now)
	if cfg.DisableCircuit {
		s.Circuit = Closed
	}
	if s.Circuit == Open && !now.Before(s.OpenUntil) {
		s.Circuit, s.HalfOpenSince, s.ProbesStarted = HalfOpen, s.OpenUntil, 0
	}
	if s.Circuit == HalfOpen && now.Sub(s.HalfOpenSince) >= cfg.ProbeTimeout {
		s.HalfOpenSince, s.ProbesStarted = now, 0
	}
}

// spreadOffset is where the next held retry goes within a window of width w.
// The golden-ratio sequence needs no knowledge of how many retries will be
// held: every prefix of it is spread almost evenly (three-distance theorem).
func (s *ProviderState) spreadOffset(w time.Duration, rng Rand) time.Duration {
	if w <= 0 {
		return 0
	}
	if s.SpreadNext == 0 {
		s.SpreadPhase = unit(rng.Float64())
	}
	const golden = 0.6180339887498949 // (√5 − 1) / 2
	// Below 2³², k·golden keeps its fraction to about 5e-7: microseconds of
	// any window, far below the millisecond the offset is rounded to.
	k := float64(s.SpreadNext % (1 << 32))
	s.SpreadNext++
	_, f := math.Modf(s.SpreadPhase + k*golden)
	return ceilMs(time.Duration(f * float64(w)))
}

// unit maps a misbehaving random draw (outside [0, 1), NaN) to 0, as policy
// does.
func unit(u float64) float64 {
	if u < 0 || u >= 1 || math.IsNaN(u) {
		return 0
	}
	return u
}

// ceilMs rounds d up to a whole millisecond: the API speaks milliseconds,
// and rounding down could start a retry before the time it waits for.
func ceilMs(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		d += time.Millisecond - r
	}
	return d
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
