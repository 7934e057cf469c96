package retryd

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of retryd's errors.
const ErrorDomain = "retryd.dev"

// The google.rpc.ErrorInfo reasons of retryd's codes.FailedPrecondition
// errors (see ErrorReason).
const (
	// ReasonRetryPending: the session has a scheduled retry that has not
	// started; await or cancel it first. Metadata "retry_id" names it.
	ReasonRetryPending = "RETRY_PENDING"
	// ReasonStaleStep: the report names a turn and step older than the
	// session's latest.
	ReasonStaleStep = "STALE_STEP"
	// ReasonStepRecordConflict: the same step was already reported with
	// different content.
	ReasonStepRecordConflict = "STEP_RECORD_CONFLICT"
	// ReasonDelegationCancelled: the step's open always-mode delegation
	// was cancelled.
	ReasonDelegationCancelled = "DELEGATION_CANCELLED"
)

// errorInfo returns the retryd ErrorInfo detail of err, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info
		}
	}
	return nil
}

// ErrorReason returns the google.rpc.ErrorInfo reason of a retryd error
// (one of the Reason constants), or "" when err carries none.
func ErrorReason(err error) string {
	return errorInfo(err).GetReason()
}

// IsRetryPending reports whether err is retryd's refusal of a report
// because the session already has a pending retry
// (codes.FailedPrecondition, reason RETRY_PENDING), and returns that
// retry's id, which the agent can await (AwaitRetry) or cancel
// (CancelRetry). It sees through wrapping.
func IsRetryPending(err error) (retryID string, ok bool) {
	if status.Code(err) != codes.FailedPrecondition {
		return "", false
	}
	info := errorInfo(err)
	if info.GetReason() != ReasonRetryPending {
		return "", false
	}
	return info.GetMetadata()["retry_id"], true
}

// FieldViolations returns the google.rpc.BadRequest details of a retryd
// error (codes.InvalidArgument) as a map from field path (for example
// "failure.code" or "policy.backoff.initial_delay_ms") to its description,
// or nil when err carries none. Two violations of one field are joined
// with "; ".
func FieldViolations(err error) map[string]string {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	var out map[string]string
	for _, d := range st.Details() {
		br, ok := d.(*errdetails.BadRequest)
		if !ok {
			continue
		}
		for _, fv := range br.GetFieldViolations() {
			if out == nil {
				out = make(map[string]string)
			}
			if prev, dup := out[fv.GetField()]; dup {
				out[fv.GetField()] = prev + "; " + fv.GetDescription()
			} else {
				out[fv.GetField()] = fv.GetDescription()
			}
		}
	}
	return out
}
