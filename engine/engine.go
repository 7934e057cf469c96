// Package engine is retryd's per-session state machine: retry chains, the
// unique step records that make FailedStep idempotent, the one pending retry
// a session may have, and the events every transition records.
//
// A Session is not safe for concurrent use: the store that owns it
// serialises access (a shard lock in memory, a transaction elsewhere). Time,
// randomness and id generation are injected through Env, so every
// transition is deterministic under test.
//
// For durable stores a session converts to and from the storage schema
// (Snapshot, RestoreSession in retryd.state.v1), a transition that could
// not be written is undone (Checkpoint, Revert), and awaiters hear of a
// start or cancellation only once the store commits it (Commit).
package engine

import (
	"time"

	"github.com/retryd/retryd/policy"
)

// MaxChainAttempts is how many attempt trace contexts a chain remembers
// for linking its next decision to them.
const MaxChainAttempts = 32

// MaxRetainedRetries is how many retries (the pending one included) a
// session keeps so that AwaitRetry and CancelRetries can answer for them;
// older terminal retries are forgotten and answer NOT_FOUND.
const MaxRetainedRetries = 16

// Env is what a transition may observe of the outside world.
type Env struct {
	Now   time.Time
	Rand  policy.Rand
	NewID func() string
}
