// Package store is the contract between retryd's service and the places
// its state lives, and the rules of every RPC written once over it.
//
// A place to keep state (package memory, file or redis) is a Backend: a
// few primitives — a session transaction that commits a transition with
// its events and the fleet state it touched, a read of a session, the
// retry index, the event log, the await protocol's hold on a retry, fleet
// state outside a session, stats, health and close. What an RPC does with
// them is written once, in Store: FailedStep, the cancellations,
// StepSucceeded, GetChains, WatchEvents, the timer rule (Tick) and fleet
// protection's glue. The decisions themselves are the engine's.
//
// The service passes session ids already qualified by their tenant and
// fleet keys already formed: nothing here parses a tenant.
package store

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	mrand "math/rand/v2"
	"time"

	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store/await"
)

// ErrShutdown ends the streams of a store that is closing.
var ErrShutdown = errors.New("retryd is shutting down")

// ErrUnavailable is wrapped by backends that could not make a change
// durable in time: the change was not made, or a backend whose server
// answered past the bound made it after all, so the caller may try again
// and every call is safe to repeat.
var ErrUnavailable = errors.New("retryd's store is unavailable; try again, every call is safe to repeat")

// MaxRetryIDLen bounds a retry id, those a backend makes and those a
// caller sends.
const MaxRetryIDLen = 64

// DefaultEventLogSize is roughly how many events a log keeps by default.
const DefaultEventLogSize = 100_000

// Options are the settings every backend takes (memory, file and Redis
// embed them in their own Config). Zero fields take the defaults; see
// WithDefaults.
type Options struct {
	// ChainTTL is how long an idle session (no pending retry) is kept.
	// Default 1h.
	ChainTTL time.Duration
	// AbandonGrace is how long a due retry waits for an awaiter before it
	// is cancelled as abandoned. Default 60s.
	AbandonGrace time.Duration
	// EventLogSize is roughly how many events the log keeps. Default
	// DefaultEventLogSize.
	EventLogSize int
	// Now replaces time.Now (tests).
	Now func() time.Time
	// NewID replaces the random retry id generator (tests).
	NewID func() string
	// Rand replaces the jitter source (tests).
	Rand interface{ Float64() float64 }
	// Log receives what a backend notices on its own (a session whose
	// data it cannot read); nil discards it.
	Log *slog.Logger
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.ChainTTL <= 0 {
		o.ChainTTL = time.Hour
	}
	if o.AbandonGrace <= 0 {
		o.AbandonGrace = time.Minute
	}
	if o.EventLogSize <= 0 {
		o.EventLogSize = DefaultEventLogSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewID == nil {
		o.NewID = rand.Text
	}
	if o.Rand == nil {
		o.Rand = globalRand{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// globalRand is the default jitter source.
type globalRand struct{}

func (globalRand) Float64() float64 { return mrand.Float64() }

// Stats is a backend's current population.
type Stats struct {
	Sessions       int64
	OpenChains     int64
	PendingRetries int64
	Awaiters       int64
}

// Backend is what a place to keep state provides.
type Backend interface {
	// Update applies tr to session sessionID in one transaction and
	// commits what it recorded in it (Txn) atomically: the session, its
	// events, the fleet states it saved. An error of tr is returned as it
	// is, and nothing of tr is committed then. fleetKey, when not empty,
	// names a fleet state tr will read (a backend may read it with the
	// session). The Txn is valid only until tr returns. A backend may apply
	// tr more than once (a transaction that lost a race is decided again)
	// and, when it answers at its bound before its commit ended (Redis's
	// unavailable_after), even after Update returned an error: only a nil
	// error says tr is done with.
	Update(ctx context.Context, sessionID, fleetKey string, tr Transition) error
	// Read runs fn on the session as committed, nil when there is none.
	// fn must not change it.
	Read(ctx context.Context, sessionID string, fn func(*engine.Session) error) error
	// Locate returns the session that retains retry retryID, or a
	// not-found *engine.Error.
	Locate(ctx context.Context, retryID string) (sessionID string, err error)
	// Await returns the await protocol's primitives for one stream of
	// retry retryID of session sessionID.
	Await(sessionID, retryID string) await.Store
	// Events returns a reader of the event log after sequence after: of
	// session sessionID alone when it is not empty.
	Events(sessionID string, after uint64) EventReader
	// FleetState reads the fleet state under key; a missing one is the
	// zero (fresh) state.
	FleetState(ctx context.Context, key string) (fleet.ProviderState, error)
	// UpdateFleet applies report r at now to the fleet state under key
	// atomically (fleet.Apply), and keeps cfg as the configuration the
	// state is decided with.
	UpdateFleet(ctx context.Context, key string, cfg fleet.Config, r fleet.Report, now time.Time) error
	// Stats counts the population; it may scan, so it is for metrics
	// scrapes, not hot paths.
	Stats() Stats
	// Now is the backend's decision clock (Options.Now).
	Now() time.Time
	// Closing is closed when Close begins: streams end with ErrShutdown.
	Closing() <-chan struct{}
	// Close ends every stream and stops the backend's goroutines.
	Close() error
}

// Transition is a rule's change of one session, applied in a Backend's
// transaction. An interface rather than a func, so that the rule of the
// hottest call (FailedStep) can pass a pooled value and allocate nothing
// for it: a closure handed to a Backend escapes.
type Transition interface {
	Apply(t Txn) error
}

// TransitionFunc is a Transition written as a function.
type TransitionFunc func(Txn) error

// Apply implements Transition.
func (f TransitionFunc) Apply(t Txn) error { return f(t) }

// Txn is one session's transaction, as a Backend's Update hands it to a
// rule.
type Txn interface {
	// Env is the transaction's clock, jitter and id source.
	Env() engine.Env
	// Session is the session, nil when there is none.
	Session() *engine.Session
	// Create makes the session, which did not exist, and returns it.
	Create() *engine.Session
	// Record notes that the session changed, with the events that say
	// how (none: it changed all the same, for example its position).
	Record(events ...*retrydv1.Event)
	// Forget notes retries the session no longer retains.
	Forget(retries []*engine.Retry)
	// Fleet reads the fleet state under key, with the configuration it
	// was last decided with; ok is false when none is kept with one.
	Fleet(key string) (fl engine.Fleet, ok bool)
	// SaveFleet keeps a fleet state a transition returned, committed with
	// the session.
	SaveFleet(fl engine.Fleet)
}

// EventReader reads an event log in order, for one WatchEvents stream.
type EventReader interface {
	// Next returns the next events after those it returned before.
	Next(ctx context.Context) (Batch, error)
	// Held reports events read but not yet returned (a backend that
	// merges several logs holds events until their order is certain).
	Held() bool
}

// Batch is one read of an event log.
type Batch struct {
	// Events are the events read, in order, up to a batch.
	Events []*retrydv1.Event
	// More is set when another batch is ready at once.
	More bool
	// Wake is ready when more may have been appended since the read.
	Wake <-chan struct{}
	// Recheck, when not zero, is when to read again even if Wake is not
	// ready (a notification can be lost, a held event falls due).
	Recheck time.Duration
	// Release frees Wake; call it once, after the wait.
	Release func()
}

// Optional primitives, which a backend implements when it can.

// DueSource is implemented by backends that answer a retained retry's
// due time from memory. With one, the service keeps no copy of every
// pending retry's due time for the start-lateness metric.
type DueSource interface {
	// Due returns the due time of a retry the backend retains.
	Due(retryID string) (time.Time, bool)
}

// Pinger is implemented by backends that keep their state in a server of
// their own (Redis), which can go away while retryd keeps running. The
// server probes it about once a second and reports NOT_SERVING on gRPC
// health while Ping fails. Backends whose state lives in the process or
// on a local disk do not implement it.
type Pinger interface {
	// Ping returns nil when the backend can reach its state now, and an
	// error (wrapping ErrUnavailable) when it cannot.
	Ping(ctx context.Context) error
}

// Partitioned is implemented by backends that keep their state in
// partitions, each with its own fleet state (the Redis store's
// partitioned key layout).
type Partitioned interface {
	// Partitions returns the number of partitions.
	Partitions() int
}

// DamagedTimerSource is implemented by backends whose stored data can be
// found damaged (it does not decode), which then postpone that session's
// due timers instead of trying them at every poll.
type DamagedTimerSource interface {
	// TimersPostponed counts the timers this replica postponed because
	// their session's data did not decode, since it started.
	TimersPostponed() int64
}
