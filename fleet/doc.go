// Package fleet is retryd's fleet protection for one (tenant, provider): a
// shared retry budget, a circuit with half-open probes and spread release,
// and fleet-wide provider Retry-After. It is what no single agent process
// can do, because only retryd sees every agent's failures.
//
// Like package policy it is pure: no goroutines, no clock, no global random
// source. The caller passes the current time and a random source, and the
// state is plain data (ProviderState) that a store loads, changes with one
// operation and saves:
//
//   - Failed, for every failed request whose code is a ProviderFault;
//   - Admit, after Failed, when the policy scheduled a retry: the fleet's
//     Verdict (delegate, or the delay and its Source);
//   - Start, when a scheduled retry falls due, before Started is recorded:
//     start now, later (the circuit holds it) or never (past its deadline);
//   - Dropped, when an admitted retry is cancelled before Start refused it;
//   - Succeeded, for every success (StepSucceeded);
//   - Snapshot, to read it.
//
// Decide and StartDue are the two a store's transitions run (through the
// engine) with the state it read with the session: Failed and Admit for
// one failure, Start for one due retry, each on a copy, returning the
// state to save.
//
// # Sizing the budget
//
// The budget is a token bucket: a first attempt costs nothing, a retry takes
// one token, tokens refill at RefillPerSecond up to Capacity, and each
// success adds SuccessCredit. Over any interval of T seconds with S
// successes, the retries admitted with a token are at most
//
//	Capacity + RefillPerSecond·T + SuccessCredit·S
//
// so, once the burst is spent, retries are at most SuccessCredit of the
// successes plus RefillPerSecond. Size the three from the provider's healthy
// traffic and the extra load you accept when it fails.
//
// Worked example: 1 000 agents each send a request every 3 s to one
// provider, 333 requests/s when healthy.
//
//   - SuccessCredit = 0.1: while healthy, retries may be about 10 % of
//     successes, 33/s — far above the 1 % background failure rate, so the
//     budget never bites a healthy provider.
//   - RefillPerSecond = 1: when the provider fails completely there are no
//     successes, and retries fall to 1/s, 0.3 % of the healthy load, on top
//     of the first attempts that keep coming.
//   - Capacity = 100: the first 100 retries of an incident go through at
//     once (0.3 s of healthy traffic), so a blip that ends within a second
//     or two is retried in full.
//
// During a 60 s outage that fails every request, the successes stop and the
// budget admits at most 100 + 60·1 retries (plus a tenth of the few
// successes still arriving), where normal-mode agents alone would retry
// every failure twice. docs/fleet.md has the table of the simulation
// (package fleet/sim) that checks this, and how to run it.
//
// Always- and schedule-mode agents must not end on a fleet limit, so an
// empty budget paces them instead of delegating: each waits for the next
// token, reserving it, and when that token lies beyond the policy's delay
// cap it starts without one, within the SpreadWindow before the cap. The
// budget therefore slows such a fleet to about one retry per agent per cap;
// the circuit is what holds it back during an outage.
//
// # The circuit
//
// The failure rate over Window (in WindowBuckets steps) opens the circuit
// when it reaches FailureThreshold with at least MinSamples outcomes. While
// it is open no retry starts — Admit schedules after the open period, Start
// holds those that fall due — and when the period ends HalfOpenProbes
// retries start as probes; the first probe outcome closes the circuit or
// reopens it. Retries held behind the circuit (or a fleet-wide Retry-After)
// are spread over SpreadWindow after it ends, by a golden-ratio sequence
// with a random phase, so recovery is not met by every held retry on the
// same millisecond.
package fleet
