// Package reload serves a value built from files — credentials, a TLS
// certificate — and rebuilds it when the files' content changes.
//
// It polls: Kubernetes updates a mounted Secret by writing a new
// timestamped directory and swapping the "..data" symlink atomically, so
// a file's path never changes and an inotify watch on it (fsnotify) sees
// nothing, or loses its watch, depending on what it watched. Reading the
// files every interval and comparing a digest of their content is simple
// and sees every kind of update: a symlink swap, a rename over the file,
// an edit in place. Content that does not build is logged, once per
// distinct content or read error, and the last good value keeps serving:
// callers are never left without one.
package reload

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Config says how a Source reads, builds and logs.
type Config[In, T any] struct {
	// Read reads the files: their content and a digest of it.
	Read func() (In, [sha256.Size]byte, error)
	// Build makes the value of the content, with the attributes that
	// describe it in a log line (never secrets).
	Build func(In) (*T, []any, error)
	// Log receives the lines; nil discards them.
	Log *slog.Logger
	// Loaded, Reloaded and Failed are the messages of a first load, a
	// reload and a reload that failed; Attrs lead every failure's line.
	Loaded, Reloaded, Failed string
	Attrs                    []any
	// Describe, if set, adds attributes of a build error to its failure
	// line (such as the field it names).
	Describe func(error) []any
	// Result, if set, learns the outcome of every reload that tried new
	// content or met a new read error: nil when the new value serves,
	// the error when the last good one stays.
	Result func(error)
}

// Source serves the last value that built.
type Source[In, T any] struct {
	cfg     Config[In, T]
	current atomic.Pointer[T]

	mu        sync.Mutex // serialises reloads
	lastTried [sha256.Size]byte
}

// New reads and builds once; an error is returned as it is (a server
// refuses to start rather than serve with no or unknown content).
func New[In, T any](cfg Config[In, T]) (*Source[In, T], error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	in, sum, err := cfg.Read()
	if err != nil {
		return nil, err
	}
	v, attrs, err := cfg.Build(in)
	if err != nil {
		return nil, err
	}
	s := &Source[In, T]{cfg: cfg, lastTried: sum}
	s.current.Store(v)
	cfg.Log.Info(cfg.Loaded, attrs...)
	return s, nil
}

// Current returns the value in force: the last content that built.
func (s *Source[In, T]) Current() *T { return s.current.Load() }

// Watch reloads every interval until ctx is done.
func (s *Source[In, T]) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Reload()
		}
	}
}

// Reload reads the files and, if their content changed since the last
// attempt, builds and serves it. It reports whether a new value now
// serves.
func (s *Source[In, T]) Reload() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, sum, err := s.cfg.Read()
	if err != nil {
		// A file being replaced may be missing for a moment: say so once
		// per distinct problem.
		sum = sha256.Sum256([]byte("read error: " + err.Error()))
		if sum != s.lastTried {
			s.lastTried = sum
			s.failed(err)
		}
		return false
	}
	if sum == s.lastTried {
		return false
	}
	s.lastTried = sum
	v, attrs, err := s.cfg.Build(in)
	if err != nil {
		s.failed(err)
		return false
	}
	s.current.Store(v)
	s.cfg.Log.Info(s.cfg.Reloaded, attrs...)
	if s.cfg.Result != nil {
		s.cfg.Result(nil)
	}
	return true
}

func (s *Source[In, T]) failed(err error) {
	attrs := append(append([]any(nil), s.cfg.Attrs...), "err", err)
	if s.cfg.Describe != nil {
		attrs = append(attrs, s.cfg.Describe(err)...)
	}
	s.cfg.Log.Warn(s.cfg.Failed, attrs...)
	if s.cfg.Result != nil {
		s.cfg.Result(err)
	}
}
