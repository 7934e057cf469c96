package service

import (
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Request bounds.
const (
	MaxSessionIDLen  = 256
	MaxLabelLen      = 256
	MaxMessageLen    = 4096
	MaxRetryAfterLen = 256
	MaxRetryIDLen    = store.MaxRetryIDLen
)

// validator collects field violations; err returns INVALID_ARGUMENT with a
// google.rpc.BadRequest listing all of them.
type validator struct {
	violations []*errdetails.BadRequest_FieldViolation
}

func (v *validator) add(field, description string) {
	v.violations = append(v.violations, &errdetails.BadRequest_FieldViolation{Field: field, Description: description})
}

func (v *validator) ok() bool { return len(v.violations) == 0 }

func (v *validator) err() error {
	if v.ok() {
		return nil
	}
	msg := "invalid request: " + v.violations[0].Field + ": " + v.violations[0].Description
	if n := len(v.violations); n > 1 {
		msg += fmt.Sprintf(" (and %d more)", n-1)
	}
	st, err := status.New(codes.InvalidArgument, msg).WithDetails(&errdetails.BadRequest{FieldViolations: v.violations})
	if err != nil {
		return status.Error(codes.InvalidArgument, msg)
	}
	return st.Err()
}

func (v *validator) sessionID(field, id string) {
	if id == "" {
		v.add(field, "required")
		return
	}
	v.label(field, id, true)
}

// label checks an identifier-like string: valid UTF-8, no control
// characters, bounded length. It reports whether s passed.
func (v *validator) label(field, s string, required bool) bool {
	switch {
	case s == "" && !required:
	case len(s) > MaxLabelLen:
		v.add(field, fmt.Sprintf("must be at most %d bytes, got %d", MaxLabelLen, len(s)))
		return false
	case !utf8.ValidString(s):
		v.add(field, "must be valid UTF-8")
		return false
	case hasControl(s):
		v.add(field, "must not contain control characters")
		return false
	}
	return true
}

func (v *validator) retryID(field, id string) {
	switch {
	case id == "":
		v.add(field, "required")
	case len(id) > MaxRetryIDLen:
		v.add(field, fmt.Sprintf("must be at most %d bytes, got %d", MaxRetryIDLen, len(id)))
	case !isToken(id):
		v.add(field, "must be a retry id returned by FailedStep")
	}
}

func (v *validator) failure(field string, f *retrydv1.Failure) {
	if f == nil {
		v.add(field, "required")
		return
	}
	if msg := policy.ValidateCode(f.GetCode()); msg != "" {
		v.add(field+".code", msg)
	}
	switch m := f.GetMessage(); {
	case len(m) > MaxMessageLen:
		v.add(field+".message", fmt.Sprintf("must be at most %d bytes, got %d", MaxMessageLen, len(m)))
	case !utf8.ValidString(m):
		v.add(field+".message", "must be valid UTF-8")
	}
	if f.GetHttpStatus() > 999 {
		v.add(field+".http_status", "must be an HTTP status code (0 for none), got "+strconv.FormatUint(uint64(f.GetHttpStatus()), 10))
	}
	if f.RetryAfter != nil && len(f.GetRetryAfter()) > MaxRetryAfterLen {
		v.add(field+".retry_after", fmt.Sprintf("must be at most %d bytes", MaxRetryAfterLen))
	}
}

func (v *validator) enum(field string, value int32, names map[int32]string) {
	if _, ok := names[value]; !ok {
		v.add(field, fmt.Sprintf("unknown value %d", value))
	}
}

func (v *validator) policy(field string, err error) {
	var ve *policy.ValidationError
	if !errors.As(err, &ve) {
		v.add(field, err.Error())
		return
	}
	for _, fv := range ve.Violations {
		v.add(field+"."+fv.Field, fv.Description)
	}
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
