package retryd

import (
	"time"

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

// The google.rpc.ErrorInfo reasons of retryd's refusals that record
// nothing: the allow-lists of an authenticated tenant
// (codes.PermissionDenied) and admission control
// (codes.ResourceExhausted).
const (
	// ReasonProviderNotAllowed: the caller's tenant may not use the
	// request's provider. Metadata "tenant" and "provider" name them; see
	// IsProviderNotAllowed.
	ReasonProviderNotAllowed = "PROVIDER_NOT_ALLOWED"
	// ReasonPolicyNotAllowed: the caller's tenant may not select the
	// request's policy_name. Metadata "tenant" and "policy_name" name
	// them; see IsPolicyNotAllowed.
	ReasonPolicyNotAllowed = "POLICY_NOT_ALLOWED"
	// ReasonLimitReached: the request would pass one of the server's
	// admission bounds. Metadata "bound" names it and "limit" gives its
	// value; the error's RetryDelay says when to try again. See
	// IsLimitReached.
	ReasonLimitReached = "LIMIT_REACHED"
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
// (one of the Reason constants), or "" when err carries none. It sees
// through wrapping.
func ErrorReason(err error) string {
	return errorInfo(err).GetReason()
}

// errorWith returns the retryd ErrorInfo of err when err has code and
// reason, else nil.
func errorWith(err error, code codes.Code, reason string) *errdetails.ErrorInfo {
	if status.Code(err) != code {
		return nil
	}
	if info := errorInfo(err); info.GetReason() == reason {
		return info
	}
	return nil
}

// IsProviderNotAllowed reports whether err is retryd's refusal of a
// request whose provider the caller's tenant may not use
// (codes.PermissionDenied, reason PROVIDER_NOT_ALLOWED), and returns that
// provider. Nothing was recorded, and the same request fails the same way
// until the server's credentials file allows the provider: hand the
// failure to the next recovery policy. It sees through wrapping.
func IsProviderNotAllowed(err error) (provider string, ok bool) {
	info := errorWith(err, codes.PermissionDenied, ReasonProviderNotAllowed)
	if info == nil {
		return "", false
	}
	return info.GetMetadata()["provider"], true
}

// IsPolicyNotAllowed reports whether err is retryd's refusal of a
// FailedStep whose policy_name the caller's tenant may not select
// (codes.PermissionDenied, reason POLICY_NOT_ALLOWED), and returns that
// name. Nothing was recorded. It sees through wrapping.
func IsPolicyNotAllowed(err error) (policyName string, ok bool) {
	info := errorWith(err, codes.PermissionDenied, ReasonPolicyNotAllowed)
	if info == nil {
		return "", false
	}
	return info.GetMetadata()["policy_name"], true
}

// IsLimitReached reports whether err is retryd's admission control
// refusing work it cannot hold (codes.ResourceExhausted, reason
// LIMIT_REACHED), and returns the bound that is full:
// "pending_retries_per_tenant", "pending_retries",
// "open_chains_per_tenant", "open_chains", "active_sessions_per_tenant"
// (a FailedStep that may schedule a retry), "awaiters_per_retry" or
// "awaiters" (an AwaitRetry). Nothing was recorded, so the same report may
// be sent again after RetryDelay(err), or the failure handed to the next
// recovery policy. A RESOURCE_EXHAUSTED without the reason (a message over
// the server's size limit) is not this. It sees through wrapping.
func IsLimitReached(err error) (bound string, ok bool) {
	info := errorWith(err, codes.ResourceExhausted, ReasonLimitReached)
	if info == nil {
		return "", false
	}
	return info.GetMetadata()["bound"], true
}

// RetryDelay returns the google.rpc.RetryInfo of a gRPC error: how long
// the server asks the caller to wait before it sends the request again
// (retryd's admission control asks for 1 s). ok is false when err carries
// no valid RetryInfo. It sees through wrapping.
func RetryDelay(err error) (delay time.Duration, ok bool) {
	if err == nil {
		return 0, false
	}
	st, isStatus := status.FromError(err)
	if !isStatus {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, isRetryInfo := d.(*errdetails.RetryInfo); isRetryInfo && ri.GetRetryDelay().CheckValid() == nil {
			if delay = ri.GetRetryDelay().AsDuration(); delay >= 0 {
				return delay, true
			}
		}
	}
	return 0, false
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
