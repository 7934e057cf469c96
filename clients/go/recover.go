package retryd

import (
	"context"
	"errors"
	"fmt"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
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
	// for the agent to append to its own history. A local decision's
	// record has the server's shape, with sequence 0, a retry id that
	// starts with LocalRetryPrefix and a detail that starts with
	// LocalDetailPrefix.
	Event *retrydv1.Event
	// Local is true when the client, not retryd, decided (degraded mode:
	// no replica answered within WithDecisionTimeout), or started a
	// retry retryd had scheduled because its AwaitRetry could not
	// re-attach. Started then records the local start.
	Local bool
	// Unreachable is the error that made the client act locally, when
	// Local is true.
	Unreachable error
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
// Degraded mode: when no replica answers the report within
// WithDecisionTimeout (UNAVAILABLE after gRPC's own retries, or no answer
// before the timeout), Recover decides locally with retryd's policy
// semantics (package policy) and the request's policy, within a local
// cap (WithLocalRetryBudget), on a chain it keeps per (session,
// provider, policy key); it waits the delay itself and returns the
// outcome with Local set. When a scheduled retry's AwaitRetry cannot
// re-attach until WithDecisionTimeout after its due time, Recover starts
// it itself (Local set, Started local), and so it does, at the due time,
// when AwaitRetry answers NOT_FOUND (a retryd restarted without its
// state). Every call asks retryd first, so
// the first answered call resumes server decisions. A later report that
// retryd refuses with RETRY_PENDING for a retry the client started by
// itself, or for a session it decided locally since retryd's last answer
// (retryd scheduled a report whose answer was lost), awaits that retry,
// which records its start, and reports again. WithFailClosed turns
// degraded mode off.
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
	resp, err := c.report(ctx, req)
	if err != nil {
		if c.opts.failClosed || !unreachable(ctx, err) {
			return Outcome{}, err
		}
		out, lerr := c.decideLocally(req, time.Now(), err)
		if lerr != nil {
			return Outcome{}, errors.Join(err, lerr)
		}
		c.recordLocal(ctx, out, decisionName(out))
		if out.Schedule == nil {
			return out, nil
		}
		return waitLocally(ctx, out)
	}
	c.local.observe(req, resp)
	out := Outcome{Event: resp.GetEvent()}
	switch d := resp.GetDecision().GetOutcome().(type) {
	case *retrydv1.Decision_Delegate:
		out.Delegate = d.Delegate
		c.count(ctx, false, "delegate")
		return out, nil
	case *retrydv1.Decision_Schedule:
		out.Schedule = d.Schedule
		c.count(ctx, false, "schedule")
	default:
		return out, errNoDecision
	}
	term, err := c.awaitRetry(ctx, out.Schedule.GetRetryId(), c.giveUpAfter(out.Schedule))
	var lost *awaitUnreachableError
	switch {
	case errors.As(err, &lost):
		return c.startLocally(ctx, req, out, lost.err), nil
	case status.Code(err) == codes.NotFound && !c.opts.failClosed && ctx.Err() == nil:
		// A retryd restarted without its state no longer knows the retry
		// it scheduled; its backoff is the agent's to finish.
		if err := sleep(ctx, time.Until(out.Schedule.GetDueAt().AsTime())); err != nil {
			return out, err
		}
		return c.startLocally(ctx, req, out, err), nil
	case err != nil:
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

// report sends the FailedStep of Recover within the decision timeout. A
// RETRY_PENDING refusal for a retry the client has already dealt with
// without retryd (see localState.ownsPending) is resolved by awaiting
// that retry, which records its start, and reporting again once.
func (c *Client) report(ctx context.Context, req *retrydv1.FailedStepRequest) (*retrydv1.FailedStepResponse, error) {
	send := func() (*retrydv1.FailedStepResponse, error) {
		fctx, cancel := context.WithTimeout(ctx, c.opts.decisionTimeout)
		defer cancel()
		return c.FailedStep(fctx, req)
	}
	resp, err := send()
	id, pending := IsRetryPending(err)
	if !pending || !c.local.ownsPending(req.GetSessionId(), id) {
		return resp, err
	}
	if _, aerr := c.AwaitRetry(ctx, id); aerr != nil {
		return nil, errors.Join(err, fmt.Errorf("retryd: awaiting retry %s that was started without retryd: %w", id, aerr))
	}
	c.local.resolved(id)
	return send()
}

// giveUpAfter returns when Recover stops re-attaching to the scheduled
// retry and starts it by itself: WithDecisionTimeout after its due time.
// With WithFailClosed it never does.
func (c *Client) giveUpAfter(s *retrydv1.Schedule) time.Time {
	if c.opts.failClosed {
		return time.Time{}
	}
	return s.GetDueAt().AsTime().Add(c.opts.decisionTimeout)
}

// startLocally starts a retry of the server's whose AwaitRetry could not
// re-attach: its due time has passed, so the agent may start it.
func (c *Client) startLocally(ctx context.Context, req *retrydv1.FailedStepRequest, out Outcome, cause error) Outcome {
	s := out.Event.GetScheduled()
	out.Local, out.Unreachable, out.Retry = true, cause, true
	out.Started = &retrydv1.RetryStarted{RetryId: out.Schedule.GetRetryId(), Turn: s.GetTurn(), Step: s.GetStep(),
		RetryNumber: out.Schedule.GetRetryNumber(), StartedAt: timestamppb.Now()}
	c.local.startedLocally(req.GetSessionId(), out.Schedule.GetRetryId())
	c.recordLocal(ctx, out, "start")
	return out
}

func decisionName(out Outcome) string {
	if out.Schedule != nil {
		return "schedule"
	}
	return "delegate"
}

// Attributes of the decision counter and of local decision spans: the
// names retryd's own decision spans use for the same things.
const (
	decisionAttribute = attribute.Key("retryd.decision")
	localAttribute    = attribute.Key("retryd.decision.local")
)

func (c *Client) count(ctx context.Context, local bool, decision string) {
	c.decisions.Add(ctx, 1, metric.WithAttributes(decisionAttribute.String(decision), localAttribute.Bool(local)))
}

// recordLocal counts a local decision and records its span.
func (c *Client) recordLocal(ctx context.Context, out Outcome, decision string) {
	c.count(ctx, true, decision)
	attrs := []attribute.KeyValue{decisionAttribute.String(decision), localAttribute.Bool(true)}
	if out.Schedule != nil {
		attrs = append(attrs, attribute.String("retryd.retry.id", out.Schedule.GetRetryId()),
			attribute.Int64("retryd.retry.number", int64(out.Schedule.GetRetryNumber())),
			attribute.Int64("retryd.delay_ms", int64(out.Schedule.GetDelayMs())))
	}
	if out.Delegate != nil {
		attrs = append(attrs, attribute.String("retryd.delegate.reason", out.Delegate.GetReason().String()))
	}
	_, span := c.tracer.Start(ctx, "retryd.local_decision", trace.WithAttributes(attrs...))
	if out.Unreachable != nil {
		span.RecordError(out.Unreachable)
	}
	span.End()
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
