package service

import (
	"crypto/rand"
	"log/slog"
	mrand "math/rand/v2"
	"time"
)

// DefaultEventLogSize is roughly how many events a store's log keeps by
// default.
const DefaultEventLogSize = 100_000

// StoreOptions are the settings every store takes (memory, file and Redis
// embed them in their own Config). Zero fields take the defaults; see
// WithDefaults.
type StoreOptions struct {
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
	// Log receives what a store notices on its own (a session whose data
	// it cannot read); nil discards it.
	Log *slog.Logger
}

// WithDefaults returns o with every zero field set to its default.
func (o StoreOptions) WithDefaults() StoreOptions {
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
