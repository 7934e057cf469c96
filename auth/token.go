package auth

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// maxTokenInput bounds what ReadToken reads: a token is one short line.
const maxTokenInput = 4096

// ReadToken reads one bearer token from r (typically stdin): a single
// line, its trailing newline (LF or CRLF) dropped. The token must be
// visible ASCII without spaces — what fits an "authorization: Bearer"
// header — so that the hash printed is the hash of what clients will send.
func ReadToken(r io.Reader) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxTokenInput+1))
	if err != nil {
		return "", fmt.Errorf("reading the token: %w", err)
	}
	if len(b) > maxTokenInput {
		return "", fmt.Errorf("the token is longer than %d bytes", maxTokenInput)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", errors.New("no token on stdin (e.g. printf %s \"$TOKEN\" | retryd hash-token)")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return "", fmt.Errorf("the token has a space, control or non-ASCII byte at offset %d: a bearer token is one line of visible ASCII", i)
		}
	}
	return s, nil
}
