package policy

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfter is a provider's delay instruction after parsing.
type RetryAfter struct {
	// Valid is false when there was no instruction or it was malformed.
	Valid bool
	// Ms is the requested delay in milliseconds (meaningful when !Over).
	Ms uint64
	// Over marks an absurdly large value: too large to represent as a timer,
	// so it counts as over any cap.
	Over bool
}

func (r RetryAfter) String() string {
	switch {
	case !r.Valid:
		return "no retry-after"
	case r.Over:
		return "an unbounded delay"
	default:
		return fmt.Sprintf("%d ms", r.Ms)
	}
}

// ProviderRetryAfter interprets the two ways a failure can carry a provider
// delay: ms (already in milliseconds; takes precedence when present and not negative) and
// header (a raw HTTP Retry-After: delta-seconds or an HTTP-date, resolved
// against now). Negative or malformed values are ignored.
func ProviderRetryAfter(ms *int64, header *string, now time.Time) RetryAfter {
	if ms != nil && *ms >= 0 { // a negative value is malformed: fall back to the header
		switch v := *ms; {
		case v > MaxDelayMs:
			return RetryAfter{Valid: true, Over: true}
		default:
			return RetryAfter{Valid: true, Ms: uint64(v)}
		}
	}
	if header != nil {
		return ParseRetryAfter(*header, now)
	}
	return RetryAfter{}
}

// ParseRetryAfter parses an HTTP Retry-After value (RFC 9110 §10.2.3):
// non-negative integer delta-seconds, or an HTTP-date. A date in the past
// means no wait. Anything else is malformed and ignored.
func ParseRetryAfter(v string, now time.Time) RetryAfter {
	v = strings.TrimSpace(v)
	if v == "" {
		return RetryAfter{}
	}
	if isDigits(v) {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil || secs > MaxDelayMs/1000 {
			return RetryAfter{Valid: true, Over: true}
		}
		return RetryAfter{Valid: true, Ms: secs * 1000}
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return RetryAfter{}
	}
	d := t.Sub(now)
	switch {
	case d <= 0:
		return RetryAfter{Valid: true}
	case d > MaxDelayMs*time.Millisecond:
		return RetryAfter{Valid: true, Over: true}
	default:
		// Round up: waiting a little longer than asked is always safe.
		return RetryAfter{Valid: true, Ms: uint64((d + time.Millisecond - 1) / time.Millisecond)}
	}
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
