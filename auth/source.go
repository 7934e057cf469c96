package auth

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Source serves the credentials of one file and reloads them when the
// file's content changes.
//
// It polls: Kubernetes updates a mounted Secret by writing a new
// timestamped directory and swapping the "..data" symlink atomically, so
// the file's path never changes and an inotify watch on it (fsnotify) sees
// nothing, or loses its watch, depending on what it watched. Reading the
// file every interval and comparing a hash of its content is simple and
// sees every kind of update: a symlink swap, a rename over the file, an
// edit in place. A reload that does not validate is logged and the last
// good credentials keep serving; calls are never left without
// credentials.
type Source struct {
	path string
	log  *slog.Logger

	current atomic.Pointer[Credentials]

	mu        sync.Mutex // serialises reloads
	lastTried [sha256.Size]byte
}

// NewSource loads the file once; a missing, unreadable or invalid file is
// an error (the server refuses to start rather than serve with no or
// unknown credentials).
func NewSource(path string, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{path: path, log: log}
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	creds, err := Parse(data)
	if err != nil {
		return nil, err
	}
	s.current.Store(creds)
	s.lastTried = sha256.Sum256(data)
	log.Info("auth credentials loaded", credAttrs(path, creds)...)
	return s, nil
}

// Path returns the file the source reads.
func (s *Source) Path() string { return s.path }

// Current returns the credentials in force: the last file that loaded.
func (s *Source) Current() *Credentials { return s.current.Load() }

// Watch reloads the file every interval until ctx is done.
func (s *Source) Watch(ctx context.Context, interval time.Duration) {
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

// Reload reads the file and, if its content changed since the last
// attempt, validates it and serves it. It reports whether new credentials
// now serve. A failure is logged once per distinct content or error, not
// on every poll.
func (s *Source) Reload() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := readFile(s.path)
	if err != nil {
		// A file being replaced by hand may be missing for a moment.
		sum := sha256.Sum256([]byte("read error: " + err.Error()))
		if sum != s.lastTried {
			s.lastTried = sum
			s.log.Warn("auth credentials reload failed; serving the previous credentials",
				"file", s.path, "err", err)
		}
		return false
	}
	sum := sha256.Sum256(data)
	if sum == s.lastTried {
		return false
	}
	s.lastTried = sum
	creds, err := Parse(data)
	if err != nil {
		s.log.Warn("auth credentials reload failed; serving the previous credentials",
			"file", s.path, "err", err)
		return false
	}
	s.current.Store(creds)
	s.log.Info("auth credentials reloaded", credAttrs(s.path, creds)...)
	return true
}

// credAttrs describes credentials for a log line: counts only, no hashes.
func credAttrs(path string, c *Credentials) []any {
	tenants, tokens, certs := c.Len()
	return []any{"file", path, "tenants", tenants, "tokens", tokens, "client_certificates", certs}
}
