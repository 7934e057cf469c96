package fleet

import (
	"fmt"
	"time"
)

// record counts one outcome in the failure-rate window.
func (s *ProviderState) record(cfg Config, now time.Time, failed bool) {
	if len(s.Window) != cfg.WindowBuckets {
		s.Window = make([]WindowBucket, cfg.WindowBuckets)
	}
	epoch := floorDiv(now.UnixNano(), int64(cfg.bucketWidth()))
	b := &s.Window[floorMod(epoch, int64(len(s.Window)))]
	if b.Epoch < epoch {
		*b = WindowBucket{Epoch: epoch}
	}
	// An older time (a clock behind another replica's) counts into the
	// newer bucket that holds its slot: close enough, and never lost.
	if failed {
		b.Failures = satInc(b.Failures)
	} else {
		b.Successes = satInc(b.Successes)
	}
}

// outcomes sums the window's buckets that are still within it at now.
func (s *ProviderState) outcomes(cfg Config, now time.Time) (failures, successes uint64) {
	if len(s.Window) != cfg.WindowBuckets {
		return 0, 0
	}
	oldest := floorDiv(now.UnixNano(), int64(cfg.bucketWidth())) - int64(cfg.WindowBuckets)
	for _, b := range s.Window {
		if b.Epoch > oldest {
			failures += uint64(b.Failures)
			successes += uint64(b.Successes)
		}
	}
	return failures, successes
}

// tripped reports whether the window's failure rate opens the circuit.
func (s *ProviderState) tripped(cfg Config, now time.Time) bool {
	f, ok := s.outcomes(cfg, now)
	total := f + ok
	return total >= uint64(cfg.MinSamples) && float64(f) >= cfg.FailureThreshold*float64(total)
}

// open starts an open period of OpenFor from now.
func (s *ProviderState) open(cfg Config, now time.Time) {
	s.Circuit, s.OpenUntil = Open, now.Add(cfg.OpenFor)
	s.ProbesScheduled, s.ProbesStarted = 0, 0
	s.Opens++
}

// close ends the circuit's episode. The window starts empty: its failures
// are the episode's own, and counting them again would reopen the circuit
// on the first failure after recovery.
func (s *ProviderState) close() {
	s.Circuit, s.ProbesScheduled, s.ProbesStarted = Closed, 0, 0
	clear(s.Window)
}

// hold is what the circuit does to one retry at admission.
type hold struct {
	held   bool      // the circuit delays the retry
	at     time.Time // not before this, when held
	probe  bool      // scheduled as one of the half-open probes
	detail string
}

// circuitHold is the circuit's part of admitting a retry. While open, the
// first HalfOpenProbes retries are scheduled for the end of the open period
// (the probes) and the others spread over SpreadWindow after it; while
// half-open, a retry may become a probe if a slot is free, or else waits
// for the probes' outcome.
func (s *ProviderState) circuitHold(cfg Config, now time.Time, rng Rand) hold {
	probes := uint32(cfg.HalfOpenProbes)
	switch s.Circuit {
	case Open:
		if s.ProbesScheduled < probes {
			s.ProbesScheduled++
			return hold{held: true, at: s.OpenUntil, probe: true, detail: fmt.Sprintf(
				"circuit open until %s: scheduled as probe %d of %d at its end",
				stamp(s.OpenUntil), s.ProbesScheduled, probes)}
		}
		at := s.OpenUntil.Add(s.spreadOffset(cfg.SpreadWindow, rng))
		return hold{held: true, at: at, detail: fmt.Sprintf(
			"circuit open until %s: held, spread to %s within a %s window after it",
			stamp(s.OpenUntil), stamp(at), cfg.SpreadWindow)}
	case HalfOpen:
		if s.ProbesStarted < probes {
			return hold{probe: true, detail: fmt.Sprintf(
				"circuit half-open: %d of %d probes started; this retry may be one", s.ProbesStarted, probes)}
		}
		at := s.halfOpenAt(cfg, now, rng)
		return hold{held: true, at: at, detail: fmt.Sprintf(
			"circuit half-open: %d of %d probes started, waiting for their outcome; held to %s",
			s.ProbesStarted, probes, stamp(at))}
	}
	return hold{}
}

// halfOpenAt is when a retry the half-open probes keep waiting asks again:
// behind the retries already spread over the window after the open period
// (it goes to the back of that queue instead of piling onto it), and at
// least a tenth of the open period from now, plus its own place in the
// spread window so that the waiting retries do not all ask on the same
// millisecond.
func (s *ProviderState) halfOpenAt(cfg Config, now time.Time, rng Rand) time.Time {
	back := laterOf(now.Add(max(ceilMs(cfg.OpenFor/10), time.Millisecond)), s.OpenUntil.Add(cfg.SpreadWindow))
	return back.Add(s.spreadOffset(cfg.SpreadWindow, rng))
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

func satInc(n uint32) uint32 {
	if n == ^uint32(0) {
		return n
	}
	return n + 1
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }
