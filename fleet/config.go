package fleet

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Defaults. See the package documentation (and docs/fleet.md) for how to
// size the budget for a fleet; these are a starting point for one provider
// of one tenant, not a recommendation for every workload.
const (
	// DefaultCapacity is the burst of retries a healthy provider's budget
	// holds: enough for a brief blip across a small fleet, soon spent by a
	// large one that fails as a whole.
	DefaultCapacity = 100
	// DefaultRefillPerSecond is the retry rate the budget allows while the
	// provider serves nothing at all (no successes to earn credit).
	DefaultRefillPerSecond = 1
	// DefaultSuccessCredit makes retries at most about a tenth of healthy
	// traffic: the SRE book's per-client retry ratio and gRPC's retry
	// throttling token_ratio.
	DefaultSuccessCredit = 0.1
	// DefaultWindow and DefaultWindowBuckets give the failure rate over the
	// last 10 s in 1 s steps.
	DefaultWindow        = 10 * time.Second
	DefaultWindowBuckets = 10
	// DefaultMinSamples keeps a handful of failures of a quiet provider
	// from opening its circuit.
	DefaultMinSamples = 20
	// DefaultFailureThreshold opens the circuit when at least half the
	// recent requests failed.
	DefaultFailureThreshold = 0.5
	// DefaultOpenFor is how long an open circuit holds retries back.
	DefaultOpenFor = 5 * time.Second
	// DefaultHalfOpenProbes is how many retries test the provider when the
	// open period ends.
	DefaultHalfOpenProbes = 3
	// DefaultProbeTimeout starts a new round of probes when none of the
	// last round's reported back (their agents went away).
	DefaultProbeTimeout = time.Minute
	// DefaultSpreadWindow spreads the retries held behind an open or paced
	// provider over 5 s. With DefaultOpenFor it keeps every held retry
	// within normal mode's default 10 s delay cap.
	DefaultSpreadWindow = 5 * time.Second
	// DefaultMaxFleetRetryAfter bounds how far one provider Retry-After
	// pushes the whole fleet's retries.
	DefaultMaxFleetRetryAfter = 30 * time.Second
)

// MaxDuration bounds every duration of a Config: the largest delay a policy
// may name (a signed 32-bit millisecond timer).
const MaxDuration = math.MaxInt32 * time.Millisecond

// maxWindowBuckets bounds the state a store persists per provider.
const maxWindowBuckets = 3600

// Config is the fleet protection of one (tenant, provider). It is server
// configuration, not part of a request: every agent reporting failures for
// the provider shares it. Start from DefaultConfig and change fields; the
// zero Config is not valid.
type Config struct {
	// DisableBudget turns the retry budget off: retries take no tokens.
	DisableBudget bool
	// Capacity is the most tokens the budget holds: the burst of retries
	// allowed before the refill rate and success credit pace them. At
	// least 1, since a retry takes a whole token.
	Capacity float64
	// RefillPerSecond tokens are added every second, up to Capacity: the
	// retry rate allowed while the provider serves no successes at all.
	RefillPerSecond float64
	// SuccessCredit tokens (usually a fraction of one) are added for every
	// success (StepSucceeded): while the provider is healthy, retries may be
	// about this fraction of its successes.
	SuccessCredit float64

	// DisableCircuit turns the circuit off: it never opens.
	DisableCircuit bool
	// Window is how far back the failure rate looks.
	Window time.Duration
	// WindowBuckets is how many counters the window is kept in; the window
	// slides by Window/WindowBuckets.
	WindowBuckets int
	// MinSamples is the fewest outcomes (failures plus successes) in the
	// window for the failure rate to open the circuit.
	MinSamples int
	// FailureThreshold opens the circuit when failures/(failures+successes)
	// in the window reaches it; within (0, 1].
	FailureThreshold float64
	// OpenFor is how long the circuit stays open: no retry starts before it
	// ends.
	OpenFor time.Duration
	// HalfOpenProbes retries may start when the open period ends; the first
	// outcome reported for one of them closes the circuit (success) or opens
	// it again (failure). The others wait.
	HalfOpenProbes int
	// ProbeTimeout starts a new round of probes when no probe of the current
	// round reported an outcome for this long (its agent went away).
	ProbeTimeout time.Duration
	// SpreadWindow is the width over which retries held behind an open or a
	// paced provider are spread, so they do not all start on the same
	// millisecond when it recovers. 0 turns spreading off.
	SpreadWindow time.Duration

	// MaxFleetRetryAfter bounds how far one provider Retry-After raises the
	// whole fleet's earliest start; 0 turns fleet-wide Retry-After off (each
	// agent still honours its own through its policy).
	MaxFleetRetryAfter time.Duration
}

// DefaultConfig returns the defaults above: budget, circuit and fleet-wide
// Retry-After all on.
func DefaultConfig() Config {
	return Config{
		Capacity:           DefaultCapacity,
		RefillPerSecond:    DefaultRefillPerSecond,
		SuccessCredit:      DefaultSuccessCredit,
		Window:             DefaultWindow,
		WindowBuckets:      DefaultWindowBuckets,
		MinSamples:         DefaultMinSamples,
		FailureThreshold:   DefaultFailureThreshold,
		OpenFor:            DefaultOpenFor,
		HalfOpenProbes:     DefaultHalfOpenProbes,
		ProbeTimeout:       DefaultProbeTimeout,
		SpreadWindow:       DefaultSpreadWindow,
		MaxFleetRetryAfter: DefaultMaxFleetRetryAfter,
	}
}

// FieldError is one invalid Config field, named as in the struct.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("fleet: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Validate checks every field and reports all problems at once, each as a
// *FieldError. Fields of a disabled part are checked too: turning a part
// back on must not start an invalid configuration.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: value, Reason: reason})
	}
	c.validateBudget(bad)
	c.validateCircuit(bad)
	checkDuration(bad, "SpreadWindow", c.SpreadWindow, 0)
	checkDuration(bad, "MaxFleetRetryAfter", c.MaxFleetRetryAfter, 0)
	return errors.Join(errs...)
}

func (c Config) validateBudget(bad func(field, value, reason string)) {
	checkFloat(bad, "Capacity", c.Capacity, 1, 1e9)
	checkFloat(bad, "RefillPerSecond", c.RefillPerSecond, 0, 1e9)
	checkFloat(bad, "SuccessCredit", c.SuccessCredit, 0, 1e9)
	if c.RefillPerSecond == 0 && c.SuccessCredit == 0 {
		bad("RefillPerSecond", "0", "RefillPerSecond and SuccessCredit are both 0: an empty budget would never refill")
	}
}

func (c Config) validateCircuit(bad func(field, value, reason string)) {
	checkDuration(bad, "Window", c.Window, time.Millisecond)
	switch {
	case c.WindowBuckets < 1 || c.WindowBuckets > maxWindowBuckets:
		bad("WindowBuckets", strconv.Itoa(c.WindowBuckets), fmt.Sprintf("must be within [1, %d]", maxWindowBuckets))
	case c.Window/time.Duration(c.WindowBuckets) < time.Millisecond:
		bad("WindowBuckets", strconv.Itoa(c.WindowBuckets), "Window/WindowBuckets must be at least 1ms")
	}
	if c.MinSamples < 1 {
		bad("MinSamples", strconv.Itoa(c.MinSamples), "must be at least 1")
	}
	if math.IsNaN(c.FailureThreshold) || c.FailureThreshold <= 0 || c.FailureThreshold > 1 {
		bad("FailureThreshold", fmtFloat(c.FailureThreshold), "must be within (0, 1]")
	}
	checkDuration(bad, "OpenFor", c.OpenFor, time.Millisecond)
	if c.HalfOpenProbes < 1 {
		bad("HalfOpenProbes", strconv.Itoa(c.HalfOpenProbes), "must be at least 1")
	}
	checkDuration(bad, "ProbeTimeout", c.ProbeTimeout, time.Millisecond)
}

func checkFloat(bad func(field, value, reason string), field string, v, lo, hi float64) {
	if math.IsNaN(v) || v < lo || v > hi {
		bad(field, fmtFloat(v), fmt.Sprintf("must be a number within [%s, %s]", fmtFloat(lo), fmtFloat(hi)))
	}
}

func checkDuration(bad func(field, value, reason string), field string, d, lo time.Duration) {
	if d < lo || d > MaxDuration {
		bad(field, d.String(), fmt.Sprintf("must be within [%s, %s]", lo, MaxDuration))
	}
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// bucketWidth is the step the failure-rate window slides by.
func (c Config) bucketWidth() time.Duration { return c.Window / time.Duration(c.WindowBuckets) }
