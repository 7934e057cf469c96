package retryd

import (
	"context"
	"errors"
	"fmt"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Outcome is what Recover decided for one failed model request.
type Outcome struct {
	// Retry is true when the agent should start the retry attempt now.
	// It is false whenever Recover returns an error.
	Retry bool
	// Schedule is retryd's schedule decision, when it made one.
	Schedule *retrydv1.Schedule
	// Started is the retry's start confirmation; set when Retry is true
	// (and, with an error, when the retry started before Recover could
	// cancel it).
	Started *retrydv1.RetryStarted
	// Delegate is set when retryd delegated: hand the failure to the next
	// recovery policy.
	Delegate *retrydv1.Delegate
	// Cancelled is set when the scheduled retry was cancelled instead of
	// started: by a CancelRetries call, as abandoned, at server shutdown,
	// on expiry, or by Recover itself when ctx ended.
	Cancelled *retrydv1.RetryCancelled
	// Event is the event record of the decision (scheduled or delegated),
	// for the agent to append to its own history.
	Event *retrydv1.Event
}

// Recover is the agent loop's one call for a failed model request. It
// reports the failure with FailedStep, and then:
//
//   - on a delegate decision, returns it (Delegate set, Retry false);
//   - on a schedule decision, waits with AwaitRetry (re-attaching if the
//     stream breaks) for the retry's terminal message, and returns Retry
//     true with Started, or Retry false with Cancelled and no error when
//     the retry was cancelled instead.
//
// If ctx ends while Recover waits, it cancels the retry on the server
// (CancelRetries by retry id, with a fresh context bounded by
// WithCancelTimeout and carrying ctx's values) and returns ctx.Err(), with
// Cancelled (or Started, if the retry won the race) set from the server's
// answer. If that cancel call fails too, the error joins ctx.Err() and the
// cancel error; the server then cancels the retry as abandoned after its
// grace. If ctx ends during the report itself, its gRPC error
// (codes.Canceled or codes.DeadlineExceeded) is returned as is: the server
// may have scheduled a retry Recover never learned of, which the session's
// next report names (IsRetryPending) and which is otherwise cancelled as
// abandoned.
//
// Errors of FailedStep and AwaitRetry are gRPC status errors returned as
// is (use status.Code, IsRetryPending, ErrorReason, FieldViolations). In
// particular a report for a session that still has a pending retry fails
// with codes.FailedPrecondition, and IsRetryPending names that retry. The
// returned Outcome keeps what was decided before the error (Schedule and
// Event).
func (c *Client) Recover(ctx context.Context, req *retrydv1.FailedStepRequest) (Outcome, error) {
	resp, err := c.FailedStep(ctx, req)
	if err != nil {
		return Outcome{}, err
	}
	out := Outcome{Event: resp.GetEvent()}
	switch d := resp.GetDecision().GetOutcome().(type) {
	case *retrydv1.Decision_Delegate:
		out.Delegate = d.Delegate
		return out, nil
	case *retrydv1.Decision_Schedule:
		out.Schedule = d.Schedule
	default:
		return out, errNoDecision
	}
	term, err := c.AwaitRetry(ctx, out.Schedule.GetRetryId())
	if err != nil {
		if cerr := contextEnded(ctx, err); cerr != nil {
			return c.cancelWaiting(ctx, out, cerr)
		}
		return out, err
	}
	switch m := term.GetMessage().(type) {
	case *retrydv1.AwaitRetryResponse_Started:
		out.Retry, out.Started = true, m.Started
	case *retrydv1.AwaitRetryResponse_Cancelled:
		out.Cancelled = m.Cancelled
	}
	return out, nil
}

// errNoDecision is returned when a FailedStep response carries neither a
// schedule nor a delegate decision (a server speaking a newer API).
var errNoDecision = errors.New("retryd: FailedStep answered neither schedule nor delegate")

// cancelWaiting cancels the retry Recover was waiting for after ctx ended
// (cause is ctx's error).
func (c *Client) cancelWaiting(ctx context.Context, out Outcome, cause error) (Outcome, error) {
	id := out.Schedule.GetRetryId()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.cancelTimeout)
	defer cancel()
	resp, err := c.CancelRetry(cctx, id)
	if err != nil {
		return out, errors.Join(cause, fmt.Errorf("retryd: cancelling retry %s: %w", id, err))
	}
	for _, st := range resp.GetRetries() {
		if st.GetRetryId() == id {
			out.Started, out.Cancelled = st.GetStarted(), st.GetCancelled()
		}
	}
	return out, cause
}
