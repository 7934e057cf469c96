package engine

import "fmt"

// ErrorKind classifies a refused transition; the service maps it to a gRPC
// status code.
type ErrorKind int

const (
	// KindNotFound: the retry or session is unknown.
	KindNotFound ErrorKind = iota + 1
	// KindConflict: the same step record with different content.
	KindConflict
	// KindStale: a report older than the session's latest step.
	KindStale
	// KindPending: the session has a scheduled retry that has not started.
	KindPending
	// KindClosed: the step's open delegation was cancelled.
	KindClosed
)

// Error is a refused transition. Nothing changed.
type Error struct {
	Kind    ErrorKind
	Message string
	// RetryID names the pending retry for KindPending.
	RetryID string
}

func (e *Error) Error() string { return "engine: " + e.Message }

func errorf(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}
