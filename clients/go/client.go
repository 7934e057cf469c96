package retryd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"iter"
	"math/rand/v2"
	"sync"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Client calls one retryd server. It is safe for concurrent use by many
// agent loops; create one per process and share it.
type Client struct {
	rpc  retrydv1.RetryServiceClient
	opts options

	// Degraded mode: local chains, the decision counter and the tracer of
	// local decisions.
	local     *localState
	decisions metric.Int64Counter
	tracer    trace.Tracer

	// conn is the connection New created (nil for NewFromConn): Close
	// closes only that one.
	conn      *grpc.ClientConn
	closeOnce sync.Once
	closeErr  error
}

// The client's default keepalive: a ping after KeepaliveTime without
// traffic, the connection closed when no answer comes within
// KeepaliveTimeout. grpc.WithKeepaliveParams in WithDialOptions replaces
// it (a server started with a --keepalive-min-time above KeepaliveTime
// disconnects a client that pings this often).
const (
	KeepaliveTime    = 20 * time.Second
	KeepaliveTimeout = 10 * time.Second
)

// New creates a client for the retryd server at target (a gRPC target
// such as "127.0.0.1:7700" or "dns:///retryd.internal:7700") with
// grpc.NewClient, which connects lazily on the first call.
//
// The transport is TLS with the system's roots unless an option says
// otherwise: WithTLS for a configuration of your own, WithInsecure for
// plaintext (loopback, a sidecar, a mesh that encrypts the hop). New never
// chooses plaintext by itself.
//
// The connection uses ServiceConfig: round_robin over every address the
// target resolves to (each replica of a headless service), and gRPC's own
// retries of FailedStep, GetChains, CancelRetries and StepSucceeded on
// UNAVAILABLE, which are idempotent. A refusal with RESOURCE_EXHAUSTED and
// a RetryInfo is sent again after the delay the server asked for
// (WithExhaustedRetries).
//
// With WithBearerToken or WithInsecureBearerToken every call carries the
// token (a per-RPC credential of the connection). Close releases the
// connection.
func New(target string, opts ...Option) (*Client, error) {
	o := newOptions(opts)
	creds := o.transport
	if creds == nil {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(ServiceConfig),
		// Reconnect within a couple of seconds of a replica's return, so
		// that the first call after an outage reaches it.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second,
		}, MinConnectTimeout: 5 * time.Second}),
		// A replica whose path went silent (a partition, a dead NAT
		// entry) answers no ping within KeepaliveTimeout: the connection
		// closes, its calls and AwaitRetry streams end UNAVAILABLE and
		// re-attach through another replica, instead of waiting for the
		// caller's deadline. KeepaliveTime stays above the server's
		// default --keepalive-min-time (10s), which disconnects clients
		// that ping faster.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: KeepaliveTime, Timeout: KeepaliveTimeout, PermitWithoutStream: true,
		}),
	}, o.dialOptions...)
	if o.token != nil {
		if err := o.token.check(); err != nil {
			return nil, err
		}
		dial = append(dial, grpc.WithPerRPCCredentials(o.token))
	}
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("retryd: grpc.NewClient %q: %w", target, err)
	}
	c := newClient(retrydv1.NewRetryServiceClient(conn), o)
	c.conn = conn
	return c, nil
}

func newClient(rpc retrydv1.RetryServiceClient, o options) *Client {
	mp := o.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	// The counter of a valid name cannot fail to be created; a broken
	// provider's error leaves a no-op counter.
	decisions, err := mp.Meter(instrumentationName).Int64Counter("retryd.client.decisions",
		metric.WithDescription("Decisions the client returned for failed steps, by whether they were local (degraded mode)."))
	if err != nil {
		decisions = noop.Int64Counter{}
	}
	return &Client{rpc: rpc, opts: o, local: newLocalState(o.localChains),
		decisions: decisions, tracer: tp.Tracer(instrumentationName)}
}

// instrumentationName names the client's tracer and meter.
const instrumentationName = "github.com/retryd/retryd/clients/go"

// NewFromConn creates a client over a connection the caller owns and
// closes; the client's Close leaves it open. WithDialOptions has no effect
// here. WithBearerToken and WithInsecureBearerToken do: the client adds
// the token to each of its calls (grpc.PerRPCCredentials), including those
// made through Service.
func NewFromConn(conn grpc.ClientConnInterface, opts ...Option) *Client {
	o := newOptions(opts)
	if o.token != nil {
		conn = tokenConn{ClientConnInterface: conn, token: o.token}
	}
	return newClient(retrydv1.NewRetryServiceClient(conn), o)
}

// Close closes the connection New created; for a client from NewFromConn
// it does nothing. Calling Close again returns the first call's result.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if c.conn != nil {
			c.closeErr = c.conn.Close()
		}
	})
	return c.closeErr
}

// Service returns the generated RetryService client the wrappers use, for
// calls that need per-call gRPC options. Its calls carry the client's
// bearer token like the wrappers' do.
func (c *Client) Service() retrydv1.RetryServiceClient { return c.rpc }

// FailedStep reports one failed model request and returns retryd's
// decision (schedule or delegate) with the event record of it. The call is
// idempotent per (session, turn, step, downstream phase), so it is safe to
// repeat after a transport error. Errors are gRPC status errors as the
// server sent them; see IsRetryPending, ErrorReason and FieldViolations.
func (c *Client) FailedStep(ctx context.Context, req *retrydv1.FailedStepRequest) (*retrydv1.FailedStepResponse, error) {
	return honorRetryInfo(ctx, c.opts.exhaustedRetries, func() (*retrydv1.FailedStepResponse, error) {
		return c.rpc.FailedStep(ctx, req)
	})
}

// AwaitRetry waits until the retry retryID starts or is cancelled and
// returns that terminal message: GetStarted() is set when the agent may
// start the retry attempt now, GetCancelled() when the retry will not
// start (requested, abandoned, shutdown, expired).
//
// While it waits the server counts it as an awaiter, which is what lets a
// due retry start. If the stream breaks (codes.Unavailable, codes.Internal,
// or a stream that ends without a terminal message) AwaitRetry re-attaches
// after the WithReattachBackoff delay, for as long as ctx allows; the
// retry starts at most once however often it re-attaches, and a retry that
// became due while no stream was attached starts when one re-attaches
// (within the server's abandon grace). A RESOURCE_EXHAUSTED refusal with
// a RetryInfo (the server's awaiter bounds are full) is tried again after
// the delay it asks for. Any other error, such as
// codes.NotFound for an unknown or forgotten retry or
// codes.InvalidArgument, is returned as is. When ctx ends, AwaitRetry
// returns ctx.Err() (context.DeadlineExceeded also when the server's copy
// of ctx's deadline passes a moment before ctx's own timer fires); it does
// not cancel the retry (Recover does).
func (c *Client) AwaitRetry(ctx context.Context, retryID string) (*retrydv1.AwaitRetryResponse, error) {
	return c.awaitRetry(ctx, retryID, time.Time{})
}

// awaitUnreachableError is awaitRetry's answer when it stopped
// re-attaching at its give-up time.
type awaitUnreachableError struct{ err error }

func (e *awaitUnreachableError) Error() string {
	return "retryd: AwaitRetry could not re-attach: " + e.err.Error()
}

func (e *awaitUnreachableError) Unwrap() error { return e.err }

// awaitRetry is AwaitRetry that, when giveUp is not zero, stops
// re-attaching once giveUp has passed and returns an
// *awaitUnreachableError.
func (c *Client) awaitRetry(ctx context.Context, retryID string, giveUp time.Time) (*retrydv1.AwaitRetryResponse, error) {
	wait := c.opts.reattachInitial
	for {
		term, attached, err := c.awaitOnce(ctx, retryID)
		if err == nil {
			return term, nil
		}
		if cerr := contextEnded(ctx, err); cerr != nil {
			return nil, cerr
		}
		if delay, ok := RetryDelay(err); ok && status.Code(err) == codes.ResourceExhausted {
			// The awaiter bounds are full: wait as long as the server asks.
			if err := sleep(ctx, delay); err != nil {
				return nil, err
			}
			continue
		}
		if !reattachable(err) {
			return nil, err
		}
		if !giveUp.IsZero() && time.Now().After(giveUp) {
			return nil, &awaitUnreachableError{err: err}
		}
		if attached {
			wait = c.opts.reattachInitial
		}
		if err := sleep(ctx, jittered(wait)); err != nil {
			return nil, err
		}
		wait = min(2*wait, c.opts.reattachMax)
	}
}

// awaitOnce runs one AwaitRetry stream to its terminal message. attached
// reports whether the stream delivered the retry's state first.
func (c *Client) awaitOnce(ctx context.Context, retryID string) (term *retrydv1.AwaitRetryResponse, attached bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: retryID})
	if err != nil {
		return nil, false, err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, attached, fmt.Errorf("retryd: AwaitRetry %s ended without started or cancelled: %w", retryID, io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, attached, err
		}
		switch msg.GetMessage().(type) {
		case *retrydv1.AwaitRetryResponse_State:
			attached = true
		case *retrydv1.AwaitRetryResponse_Started, *retrydv1.AwaitRetryResponse_Cancelled:
			return msg, true, nil
		}
	}
}

// contextEnded returns the error to report when err means that ctx ended:
// ctx.Err() once it is set; err itself when it already is a context error
// (from an earlier contextEnded); and context.DeadlineExceeded for a
// DEADLINE_EXCEEDED status while ctx has a deadline (the server's deadline
// is ctx's, propagated, and it can pass a moment before ctx's own timer
// fires). Otherwise it returns nil.
func contextEnded(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	if _, ok := ctx.Deadline(); ok && status.Code(err) == codes.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return nil
}

// reattachable reports whether an AwaitRetry error means the stream broke
// (try again) rather than that the server refused the request.
func reattachable(err error) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Internal:
		return true
	}
	return false
}

// jittered spreads re-attach attempts of many agents over [d/2, d].
func jittered(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CancelRetry cancels one pending retry. It is idempotent: a retry that
// already started or was cancelled is reported in its terminal state and
// nothing changes. Cancelling a retry also closes its chain, so the next
// failure starts again at retry 1.
func (c *Client) CancelRetry(ctx context.Context, retryID string) (*retrydv1.CancelRetriesResponse, error) {
	return honorRetryInfo(ctx, c.opts.exhaustedRetries, func() (*retrydv1.CancelRetriesResponse, error) {
		return c.rpc.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: retryID},
		})
	})
}

// CancelSession cancels the session's pending retry and open always-mode
// delegation, and closes its open chains (for an agent whose session
// ends). It returns codes.NotFound for a session retryd does not know.
func (c *Client) CancelSession(ctx context.Context, sessionID string) (*retrydv1.CancelRetriesResponse, error) {
	c.local.closeSession(sessionID)
	return honorRetryInfo(ctx, c.opts.exhaustedRetries, func() (*retrydv1.CancelRetriesResponse, error) {
		return c.rpc.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: sessionID},
		})
	})
}

// StepSucceeded reports a successful model request: the session's open
// chains close, so its next failure starts again at retry 1. The
// session's local chains (degraded mode) close too, whether or not the
// call reaches retryd.
func (c *Client) StepSucceeded(ctx context.Context, req *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	c.local.closeSession(req.GetSessionId())
	return honorRetryInfo(ctx, c.opts.exhaustedRetries, func() (*retrydv1.StepSucceededResponse, error) {
		return c.rpc.StepSucceeded(ctx, req)
	})
}

// GetChains reads a session's retry chains and its latest turn and step.
func (c *Client) GetChains(ctx context.Context, sessionID string) (*retrydv1.GetChainsResponse, error) {
	return honorRetryInfo(ctx, c.opts.exhaustedRetries, func() (*retrydv1.GetChainsResponse, error) {
		return c.rpc.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: sessionID})
	})
}

// ProviderState reads the fleet protection of one provider for the
// caller's tenant (GetProviderState): its retry budget, failure rate,
// circuit and pacing. GetProtected() is false, and every other field zero,
// when the server's policy file gives the provider no fleet protection.
// An empty provider is codes.InvalidArgument; with authentication, a
// provider the tenant may not use is codes.PermissionDenied (see
// IsProviderNotAllowed).
func (c *Client) ProviderState(ctx context.Context, provider string) (*retrydv1.GetProviderStateResponse, error) {
	return c.rpc.GetProviderState(ctx, &retrydv1.GetProviderStateRequest{Provider: provider})
}

// WatchEvents streams the event log as an iterator of (event, nil) pairs:
//
//	for ev, err := range client.WatchEvents(ctx, req) {
//		if err != nil {
//			return err // the last pair
//		}
//		…
//	}
//
// The stream opens when the iteration starts and closes when it ends,
// including when the loop breaks. With req.StopAtEnd the iteration ends
// without an error once every event recorded so far was yielded;
// otherwise it follows new events until ctx ends or the stream fails. A
// failure is yielded once as (nil, err) and ends the iteration: ctx.Err()
// when ctx ended, else the gRPC error as is (codes.Unavailable when the
// server shuts down). The stream is not resumed: to continue, watch again
// with req.AfterSequence set to the last event's sequence.
func (c *Client) WatchEvents(ctx context.Context, req *retrydv1.WatchEventsRequest) iter.Seq2[*retrydv1.Event, error] {
	return func(yield func(*retrydv1.Event, error) bool) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		fail := func(err error) {
			if cerr := contextEnded(ctx, err); cerr != nil {
				err = cerr
			}
			yield(nil, err)
		}
		stream, err := c.rpc.WatchEvents(sctx, req)
		if err != nil {
			fail(err)
			return
		}
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				fail(err)
				return
			}
			if !yield(resp.GetEvent(), nil) {
				return
			}
		}
	}
}
