package fleet

import (
	"fmt"
	"time"
)

// Action is what Start tells the service to do with a retry that fell due.
type Action int32

// The start actions.
const (
	// StartNow: record Started; the agent starts the attempt.
	StartNow Action = iota
	// StartLater: the circuit holds the retry; ask again at At.
	StartLater
	// StartNever: the circuit would hold the retry past the last start its
	// operation can use; cancel it.
	StartNever
)

func (a Action) String() string {
	switch a {
	case StartNow:
		return "start_now"
	case StartLater:
		return "start_later"
	case StartNever:
		return "start_never"
	}
	return "unknown"
}

// Pending is a scheduled retry that fell due, as Start needs it.
type Pending struct {
	// Latest, when HasLatest, is the latest start the operation can still
	// use (its deadline less the policy's minimum attempt time).
	Latest    time.Time
	HasLatest bool
}

// StartVerdict is the fleet's answer when a retry falls due.
type StartVerdict struct {
	Action Action
	// At is when to ask again (StartLater).
	At time.Time
	// Probe is set when the retry starts as a half-open probe: its outcome,
	// reported with Failure.Probe or Success.Probe, closes or reopens the
	// circuit. The service keeps it with the started retry.
	Probe bool
	// Detail explains a held or cancelled start; empty for StartNow.
	Detail string
}

// Start is asked when a scheduled retry falls due, before Started is
// recorded. The decision at admission fixed a delay, but the circuit may
// have opened since, or be half-open with its probes out: then the retry
// waits (StartLater) — behind an open circuit until its end plus its place
// in the spread window, behind half-open probes until after that window —
// so that no retry starts while the circuit is open and at most
// HalfOpenProbes start while it is half-open. A closed circuit
// lets every retry start; the budget is not checked again (the retry took
// its token at admission).
func (s *ProviderState) Start(cfg Config, now time.Time, p Pending, rng Rand) StartVerdict {
	s.advance(cfg, now)
	v := s.gate(cfg, now, rng)
	if v.Action == StartLater && p.HasLatest && v.At.After(p.Latest) {
		v = StartVerdict{Action: StartNever, Detail: fmt.Sprintf(
			"%s, past the operation's last useful start %s", v.Detail, stamp(p.Latest))}
	}
	if v.Action != StartLater {
		s.Queued = decr(s.Queued)
	}
	return v
}

func (s *ProviderState) gate(cfg Config, now time.Time, rng Rand) StartVerdict {
	probes := uint32(cfg.HalfOpenProbes)
	switch s.Circuit {
	case Open:
		at := s.OpenUntil.Add(s.spreadOffset(cfg.SpreadWindow, rng))
		return StartVerdict{Action: StartLater, At: at, Detail: fmt.Sprintf(
			"circuit open until %s: held to %s", stamp(s.OpenUntil), stamp(at))}
	case HalfOpen:
		if s.ProbesStarted < probes {
			s.ProbesStarted++
			return StartVerdict{Action: StartNow, Probe: true}
		}
		at := s.halfOpenAt(cfg, now, rng)
		return StartVerdict{Action: StartLater, At: at, Detail: fmt.Sprintf(
			"circuit half-open: %d probes out, waiting for their outcome; held to %s", probes, stamp(at))}
	}
	return StartVerdict{Action: StartNow}
}

// Dropped reports that an admitted retry will never start (cancelled,
// abandoned, expired) without having been refused by Start, so that Queued
// stays true. Its token is not returned: it was spent on a decision.
func (s *ProviderState) Dropped(cfg Config, now time.Time) {
	s.advance(cfg, now)
	s.Queued = decr(s.Queued)
}

func decr(n uint64) uint64 {
	if n == 0 {
		return 0
	}
	return n - 1
}
