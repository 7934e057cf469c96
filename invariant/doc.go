// Package invariant checks a retryd event log for broken invariants.
//
// The log is the ordered stream of retrydv1.Event values that WatchEvents
// serves and `retryd verify` reads as proto-JSON lines. A [Checker] consumes
// the events one at a time, so it can follow a live stream, and keeps state
// per session: events of different sessions are independent, except that a
// retry id must be unique across the whole log.
//
// The checker assumes it sees every session from its first event. A log
// that starts part way through a session (the server's event ring dropped
// older events, or a WatchEvents client resumed late) reports starts of
// retries it never saw scheduled, and chains numbered from where they were.
//
// Every broken invariant is reported as a [Violation] whose Rule is one of
// the stable ids below; the Message names the retry id and the numbers
// involved.
//
// Log shape:
//
//   - empty-session-id: every event names its session.
//   - sequence-not-increasing: within a session, Event.sequence strictly
//     increases.
//   - missing-kind: every event carries one of scheduled, delegated, started,
//     cancelled or closed.
//
// Scheduled retries (the harness's llm/retry record):
//
//   - scheduled-missing-field: provider, policy_key, retry_id, the resolved
//     policy and a failure with a code are all present.
//   - scheduled-stale-turn-step: the retry names the session's open turn and
//     latest closed step, so its (turn, step) is not lexicographically lower
//     than that of any earlier scheduled or delegated event of the session.
//   - duplicate-step-record: at most one scheduled retry per (turn, step), and
//     none after a delegation of that step that answered a downstream
//     declined or handled report. A delegation that asked for downstream
//     recovery first (always mode's handshake) may be followed by a retry of
//     the same step.
//   - duplicate-retry-id: retry ids are unique across the log.
//   - scheduled-while-pending: a session has at most one pending retry
//     (scheduled, and neither started nor cancelled); the server rejects a
//     failure reported while one is pending.
//   - retry-number: a chain is (session, provider, policy_key); its first
//     retry is number 1 and each next one the previous plus 1. A ChainClosed
//     event for the chain starts it again at 1.
//
// Mode-specific bounds, checked against the resolved policy the retry
// carries (omitted policy fields take their documented defaults):
//
//   - mode-invalid: the retry's mode is a known mode and equals the policy's
//     (unspecified counts as normal).
//   - max-retries-bound: normal mode has max_retries and retry_number is at
//     most max_retries; always mode has no max_retries (it is unlimited);
//     schedule mode may have max_retries and then stays within it.
//   - delay-source-invalid: normal and always modes use backoff or the
//     provider's Retry-After; schedule mode uses a schedule entry (for retries
//     1..len(schedule)), the tail delay (after them) or the provider's
//     Retry-After. Unspecified is never valid.
//   - delay-out-of-bounds: the delay fits a timer (at most 2147483647 ms);
//     a backoff delay lies within the jitter range of
//     base = min(initial_delay_ms * multiplier^(retry_number-1), max_delay_ms)
//     (symmetric jitter with ratio r: floor(base*(1-r)) to
//     min(ceil(base*(1+r)), max_delay_ms), with 1 ms of rounding slack; full
//     jitter: 0 to ceil(base), so zero is legal); a provider Retry-After is
//     at most the policy's cap (max_delay_ms, or in schedule mode the largest
//     schedule or tail delay) unless the policy honours longer ones; a
//     schedule or tail delay equals the policy's entry.
//
// Starts and cancellations:
//
//   - started-unknown-retry: a started event names a retry scheduled earlier
//     in the same session.
//   - started-mismatch: it repeats that retry's turn, step and retry number.
//   - started-repeated: a retry starts at most once.
//   - started-after-cancel: a cancelled retry never starts.
//   - cancelled-unknown-retry, cancelled-mismatch, cancelled-repeated: the
//     same for a cancelled event that names a retry. A cancelled event with
//     an empty retry id closes an always-mode delegation and is not checked.
//   - cancelled-after-start: a started retry is never cancelled.
package invariant
