package auth

import (
	"crypto/sha256"
	"log/slog"

	"github.com/retryd/retryd/internal/reload"
)

// Source serves the credentials of one file and reloads them when the
// file's content changes (polling; see internal/reload for why). A
// reload that does not validate is logged and the last good credentials
// keep serving; calls are never left without credentials.
type Source struct {
	path string
	*reload.Source[[]byte, Credentials]
}

// NewSource loads the file once; a missing, unreadable or invalid file is
// an error (the server refuses to start rather than serve with no or
// unknown credentials). Current returns the credentials in force, Watch
// reloads every interval, Reload once.
func NewSource(path string, log *slog.Logger) (*Source, error) {
	src, err := reload.New(reload.Config[[]byte, Credentials]{
		Read: func() ([]byte, [sha256.Size]byte, error) {
			data, err := readFile(path)
			return data, sha256.Sum256(data), err
		},
		Build: func(data []byte) (*Credentials, []any, error) {
			creds, err := Parse(data)
			if err != nil {
				return nil, nil, err
			}
			return creds, credAttrs(path, creds), nil
		},
		Log:      log,
		Loaded:   "auth credentials loaded",
		Reloaded: "auth credentials reloaded",
		Failed:   "auth credentials reload failed; serving the previous credentials",
		Attrs:    []any{"file", path},
	})
	if err != nil {
		return nil, err
	}
	return &Source{path: path, Source: src}, nil
}

// Path returns the file the source reads.
func (s *Source) Path() string { return s.path }

// credAttrs describes credentials for a log line: counts only, no hashes.
func credAttrs(path string, c *Credentials) []any {
	tenants, tokens, certs := c.Len()
	return []any{"file", path, "tenants", tenants, "tokens", tokens, "client_certificates", certs}
}
