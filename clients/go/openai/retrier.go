// Package retrydopenai lets retryd decide the retries of the model calls an
// agent makes through an HTTP SDK: a middleware for
// github.com/openai/openai-go/v3 (option.WithMiddleware) and an
// http.RoundTripper for any other SDK that takes an *http.Client.
//
// Every attempt's failure (an HTTP error status, an error inside a 200
// stream, an empty completion, a transport error) is classified with
// retryd.Classify and reported with Client.Recover. On "retry" the request
// is sent again once retryd confirms the start (the attempt's span, with a
// tracer, links to retryd's backoff span); on "delegate" the provider's
// answer is returned to the SDK with the delegate reason attached (see
// DelegateReason). A success reports StepSucceeded. The SDK's own retries
// must be off: RequestOptions does that for openai-go.
//
// It is a module of its own so that the retryd client never pulls in an
// SDK.
package retrydopenai

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"

	"github.com/openai/openai-go/v3"
	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Headers the middleware adds to a provider response it hands back to the
// SDK after retryd delegated (or the report failed).
const (
	// HeaderDelegateReason is the retryd.v1.DelegateReason name, e.g.
	// DELEGATE_REASON_CODE_NOT_RETRYABLE.
	HeaderDelegateReason = "Retryd-Delegate-Reason"
	// HeaderDelegateDetail is retryd's explanation.
	HeaderDelegateDetail = "Retryd-Delegate-Detail"
	// HeaderLocal is "true" when the client decided locally (degraded
	// mode).
	HeaderLocal = "Retryd-Local"
)

// maxErrorBody bounds how much of an error body or a non-streamed
// completion the middleware reads to classify it.
const maxErrorBody = 4 << 20

// Turn names where a model call sits in the agent's history: its
// session, the turn it belongs to, and the step number of its first
// attempt (each retry is the next step).
type Turn struct {
	SessionID     string
	Turn          uint64
	FirstStep     uint64
	LogicalTurnID string
}

// TurnFunc supplies the harness's own numbering for a model call.
type TurnFunc func(ctx context.Context) Turn

type sessionKey struct{}

// ContextWithSession names the agent session of the model calls made with
// ctx, for the default numbering.
func ContextWithSession(ctx context.Context, sessionID string) context.Context {
	return context.WithValue(ctx, sessionKey{}, sessionID)
}

// Option configures a Retrier.
type Option interface{ apply(*Retrier) }

type optionFunc func(*Retrier)

func (f optionFunc) apply(r *Retrier) { f(r) }

// WithProvider names the provider in reports (default "openai").
func WithProvider(name string) Option { return optionFunc(func(r *Retrier) { r.provider = name }) }

// WithPolicy sends p inline with every report.
func WithPolicy(p *retrydv1.RetryPolicy) Option {
	return optionFunc(func(r *Retrier) { r.policy, r.policyName = p, "" })
}

// WithPolicyName selects a policy configured on the server by name.
func WithPolicyName(name string) Option {
	return optionFunc(func(r *Retrier) { r.policy, r.policyName = nil, name })
}

// WithTurns replaces the default numbering with the harness's own.
func WithTurns(f TurnFunc) Option { return optionFunc(func(r *Retrier) { r.turns = f }) }

// WithTracer opens a span per provider attempt; an attempt after a retry
// links to retryd's backoff span (retryd.AttemptOptions).
func WithTracer(t trace.Tracer) Option { return optionFunc(func(r *Retrier) { r.tracer = t }) }

// Retrier drives the model calls of an SDK through retryd. It is safe for
// concurrent use; the calls of one session must be sequential (one agent
// loop), as retryd's turn and step numbering requires.
type Retrier struct {
	client     *retryd.Client
	provider   string
	policy     *retrydv1.RetryPolicy
	policyName string
	turns      TurnFunc
	tracer     trace.Tracer

	// session is the default session; next holds each session's next
	// turn.
	session string
	mu      sync.Mutex
	next    map[string]uint64
}

// New returns a Retrier reporting to client.
//
// The default numbering: the session is the one ContextWithSession put
// in the call's context, else one the Retrier made up for itself; each
// model call (one SDK call) is the session's next turn, counted from 1 in
// this process; its first attempt is step 1 and each retry the next step.
// WithTurns replaces it.
func New(client *retryd.Client, opts ...Option) *Retrier {
	r := &Retrier{client: client, provider: "openai", session: "retrydopenai-" + rand.Text(), next: make(map[string]uint64)}
	for _, o := range opts {
		o.apply(r)
	}
	return r
}

func (r *Retrier) turn(ctx context.Context) Turn {
	if r.turns != nil {
		t := r.turns(ctx)
		if t.FirstStep == 0 {
			t.FirstStep = 1
		}
		return t
	}
	session, _ := ctx.Value(sessionKey{}).(string)
	if session == "" {
		session = r.session
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next[session]++
	return Turn{SessionID: session, Turn: r.next[session], FirstStep: 1}
}

// RoundTripper returns an http.RoundTripper that sends each request
// through base (http.DefaultTransport when nil) under retryd's decisions.
func (r *Retrier) RoundTripper(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripper{r: r, base: base}
}

type roundTripper struct {
	r    *Retrier
	base http.RoundTripper
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.r.Do(req, t.base.RoundTrip)
}

// Do sends req with next, reporting each failed attempt to retryd and
// sending it again while retryd says retry. It is the middleware's body:
// next is the SDK's MiddlewareNext or a RoundTripper.
func (r *Retrier) Do(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	body, err := replayable(req)
	if err != nil {
		return nil, err
	}
	c := &call{r: r, ctx: req.Context(), req: req, body: body, next: next, turn: r.turn(req.Context())}
	return c.attempts(c.turn.FirstStep, nil)
}

// replayable returns a function that yields a fresh copy of req's body.
func replayable(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return func() (io.ReadCloser, error) { return http.NoBody, nil }, nil
	}
	if req.GetBody != nil {
		return req.GetBody, nil
	}
	b, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("retrydopenai: reading the request body: %w", err)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, nil
}

// call is one model call: its attempts share the turn.
type call struct {
	r    *Retrier
	ctx  context.Context
	req  *http.Request
	body func() (io.ReadCloser, error)
	next func(*http.Request) (*http.Response, error)
	turn Turn
}

// attempts sends the request from step on until an attempt succeeds or
// retryd does not retry; started is the Started confirmation of the retry
// the first of them is.
func (c *call) attempts(step uint64, started *retrydv1.RetryStarted) (*http.Response, error) {
	for ; ; step++ {
		resp, err, failure := c.attempt(step, started)
		if failure == nil {
			return resp, err
		}
		out, rerr := c.report(step, *failure)
		if rerr != nil {
			// No decision: hand back what the provider answered (a
			// RoundTripper returns a response or an error, never both).
			if resp != nil && err == nil {
				return withHeader(resp, HeaderDelegateDetail, "retryd: "+rerr.Error()), nil
			}
			closeBody(resp)
			return nil, errors.Join(err, rerr)
		}
		if out.Retry {
			closeBody(resp)
			started = out.Started
			continue
		}
		return delegated(resp, err, out)
	}
}

// attempt sends one attempt. failure is nil when it succeeded (a stream
// reports its own outcome as it is read).
func (c *call) attempt(step uint64, started *retrydv1.RetryStarted) (*http.Response, error, *retryd.ProviderFailure) {
	ctx := c.ctx
	if c.r.tracer != nil {
		var span trace.Span
		ctx, span = c.r.tracer.Start(ctx, "provider attempt", retryd.AttemptOptions(started)...)
		defer span.End()
	}
	req := c.req.Clone(ctx)
	b, err := c.body()
	if err != nil {
		return nil, err, nil
	}
	req.Body = b
	resp, err := c.next(req)
	if err != nil {
		return resp, err, &retryd.ProviderFailure{Err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(data))
		return resp, nil, &retryd.ProviderFailure{Status: resp.StatusCode, Header: resp.Header, Body: data}
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		resp.Body = newStreamBody(c, step, resp)
		return resp, nil, nil
	}
	data, rerr := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(data))
	if rerr != nil {
		return resp, nil, &retryd.ProviderFailure{Status: resp.StatusCode, Header: resp.Header, Err: rerr}
	}
	if emptyCompletion(data) {
		return resp, nil, &retryd.ProviderFailure{Status: resp.StatusCode, Header: resp.Header, EmptyCompletion: true}
	}
	c.succeeded(step)
	return resp, nil, nil
}

// report classifies a failed attempt and asks retryd what to do.
func (c *call) report(step uint64, f retryd.ProviderFailure) (retryd.Outcome, error) {
	req := retryd.Classify(f).Apply(&retrydv1.FailedStepRequest{
		SessionId: c.turn.SessionID, Turn: c.turn.Turn, Step: step, LogicalTurnId: c.turn.LogicalTurnID,
		Provider: c.r.provider,
	})
	switch {
	case c.r.policy != nil:
		req.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: c.r.policy}
	case c.r.policyName != "":
		req.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: c.r.policyName}
	}
	if dl, ok := c.ctx.Deadline(); ok {
		req.Deadline = timestamppb.New(dl)
	}
	return c.r.client.Recover(c.ctx, req)
}

func (c *call) succeeded(step uint64) {
	// The success is the agent's; a report that cannot reach retryd only
	// leaves retryd's chain open until the next failure of the session.
	_, _ = c.r.client.StepSucceeded(c.ctx, &retrydv1.StepSucceededRequest{
		SessionId: c.turn.SessionID, Turn: c.turn.Turn, Step: step, Provider: c.r.provider,
	})
}

// DelegatedError is the error of an attempt that raised one (no
// response) when retryd did not retry it.
type DelegatedError struct {
	// Err is the attempt's error.
	Err error
	// Outcome is retryd's answer (Delegate, or Cancelled).
	Outcome retryd.Outcome
}

func (e *DelegatedError) Error() string {
	return fmt.Sprintf("%v (retryd: %v)", e.Err, reasonOf(e.Outcome))
}

func (e *DelegatedError) Unwrap() error { return e.Err }

func reasonOf(out retryd.Outcome) string {
	switch {
	case out.Delegate != nil:
		return out.Delegate.GetReason().String()
	case out.Cancelled != nil:
		return "retry " + out.Cancelled.GetReason().String()
	}
	return "no retry"
}

// delegated hands the provider's answer back to the SDK with retryd's
// reason attached.
func delegated(resp *http.Response, err error, out retryd.Outcome) (*http.Response, error) {
	if err != nil || resp == nil {
		closeBody(resp)
		return nil, &DelegatedError{Err: err, Outcome: out}
	}
	resp = withHeader(resp, HeaderDelegateReason, reasonOf(out))
	resp = withHeader(resp, HeaderDelegateDetail, out.Delegate.GetDetail())
	if out.Local {
		resp = withHeader(resp, HeaderLocal, "true")
	}
	return resp, nil
}

func withHeader(resp *http.Response, k, v string) *http.Response {
	if resp != nil && v != "" {
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
		resp.Header.Set(k, v)
	}
	return resp
}

func closeBody(resp *http.Response) {
	if resp != nil && resp.Body != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		_ = resp.Body.Close()
	}
}

// DelegateReason returns the reason retryd gave for not retrying the
// model call that failed with err: from a *DelegatedError, or from the
// HeaderDelegateReason of the response an SDK error carries (openai-go's
// *openai.Error has it in Response). ok is false when retryd was not
// asked or retried.
func DelegateReason(err error) (reason string, ok bool) {
	var de *DelegatedError
	if errors.As(err, &de) {
		return reasonOf(de.Outcome), true
	}
	var apiErr *openai.Error
	if errors.As(err, &apiErr) && apiErr.Response != nil {
		if v := apiErr.Response.Header.Get(HeaderDelegateReason); v != "" {
			return v, true
		}
	}
	return "", false
}

// emptyCompletion reports whether a non-streamed completion has nothing
// in it: every OpenAI-compatible choice stopped with no content, refusal
// or tool call, or an Anthropic message ended its turn with no content.
func emptyCompletion(data []byte) bool {
	var doc struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Content   *string           `json:"content"`
				Refusal   *string           `json:"refusal"`
				ToolCalls []json.RawMessage `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Type       string            `json:"type"`
		StopReason string            `json:"stop_reason"`
		Content    []json.RawMessage `json:"content"`
	}
	if json.Unmarshal(data, &doc) != nil {
		return false
	}
	if doc.Type == "message" {
		return doc.StopReason == "end_turn" && len(doc.Content) == 0
	}
	if len(doc.Choices) == 0 {
		return false
	}
	for _, ch := range doc.Choices {
		m := ch.Message
		if ch.FinishReason != "stop" || (m.Content != nil && *m.Content != "") ||
			(m.Refusal != nil && *m.Refusal != "") || len(m.ToolCalls) > 0 {
			return false
		}
	}
	return true
}
