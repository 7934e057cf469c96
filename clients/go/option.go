package retryd

import (
	"crypto/tls"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Defaults of the options.
const (
	// DefaultReattachInitial is the first wait before AwaitRetry re-attaches
	// to a broken stream.
	DefaultReattachInitial = 50 * time.Millisecond
	// DefaultReattachMax caps the wait between re-attach attempts.
	DefaultReattachMax = 2 * time.Second
	// DefaultCancelTimeout bounds the CancelRetries call Recover makes when
	// the caller's context ends while it waits.
	DefaultCancelTimeout = 5 * time.Second
	// DefaultExhaustedRetries is how often a call refused with
	// RESOURCE_EXHAUSTED and a RetryInfo is sent again after the delay the
	// server asked for.
	DefaultExhaustedRetries = 2
)

// Option configures a Client. Options are values built by the With…
// functions of this package; they are applied in order, so a later option
// wins over an earlier one.
type Option interface {
	apply(*options)
}

type options struct {
	// transport is the connection's transport credentials (New); nil
	// means TLS with the system's roots.
	transport        credentials.TransportCredentials
	dialOptions      []grpc.DialOption
	exhaustedRetries int
	reattachInitial  time.Duration
	reattachMax      time.Duration
	cancelTimeout    time.Duration
	// token is the bearer token sent with every call; nil: none.
	token *bearerToken

	// Degraded mode.
	decisionTimeout time.Duration
	failClosed      bool
	localBudget     uint32
	localBudgetSet  bool
	localChains     int
	localPolicies   map[string]*retrydv1.RetryPolicy
	tracerProvider  trace.TracerProvider
	meterProvider   metric.MeterProvider
}

func newOptions(opts []Option) options {
	o := options{
		reattachInitial:  DefaultReattachInitial,
		reattachMax:      DefaultReattachMax,
		cancelTimeout:    DefaultCancelTimeout,
		exhaustedRetries: DefaultExhaustedRetries,
		decisionTimeout:  DefaultDecisionTimeout,
		localBudget:      DefaultLocalRetryBudget,
		localChains:      DefaultLocalChains,
	}
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&o)
		}
	}
	return o
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithTLS makes New connect over TLS with cfg (nil: the system's roots and
// the target's host name), which is also what New does without a
// transport option.
func WithTLS(cfg *tls.Config) Option {
	return optionFunc(func(o *options) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.transport = credentials.NewTLS(cfg)
	})
}

// WithInsecure makes New connect in plaintext, without transport
// security: for a retryd on loopback, a sidecar, or a mesh that encrypts
// the hop. New never falls back to plaintext by itself; this option is
// the only way to ask for it. A later WithTLS replaces it.
func WithInsecure() Option {
	return optionFunc(func(o *options) { o.transport = insecure.NewCredentials() })
}

// WithExhaustedRetries sets how often a FailedStep, StepSucceeded,
// GetChains or CancelRetries call that retryd refused with
// RESOURCE_EXHAUSTED and a google.rpc.RetryInfo (admission control) is
// sent again after the delay the server asked for, while ctx allows; 0
// returns the first refusal. A negative n keeps the default
// (DefaultExhaustedRetries).
func WithExhaustedRetries(n int) Option {
	return optionFunc(func(o *options) {
		if n >= 0 {
			o.exhaustedRetries = n
		}
	})
}

// WithDialOptions adds gRPC dial options to the connection New creates.
// They are applied after the client's own (transport credentials, the
// service config of ServiceConfig), so grpc.WithTransportCredentials or
// grpc.WithDefaultServiceConfig here replaces those. NewFromConn ignores
// this option: the caller dialled.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return optionFunc(func(o *options) { o.dialOptions = append(o.dialOptions, opts...) })
}

// WithReattachBackoff sets how AwaitRetry (and so Recover) re-attaches
// after a stream breaks: it waits a jittered delay that starts at initial
// and doubles up to maximum, and starts again at initial once a
// re-attached stream delivers the retry's state. A non-positive initial
// keeps the default (DefaultReattachInitial); a maximum below initial is
// raised to initial.
func WithReattachBackoff(initial, maximum time.Duration) Option {
	return optionFunc(func(o *options) {
		if initial <= 0 {
			initial = DefaultReattachInitial
		}
		o.reattachInitial, o.reattachMax = initial, max(initial, maximum)
	})
}

// WithCancelTimeout bounds the CancelRetries call Recover makes, with a
// fresh context, when the caller's context ends while Recover waits for a
// retry to start. A non-positive d keeps the default
// (DefaultCancelTimeout).
func WithCancelTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) {
		if d > 0 {
			o.cancelTimeout = d
		}
	})
}

// WithBearerToken sends token with every call as the gRPC metadata
// "authorization: Bearer <token>", which a retryd started with
// --auth-credentials maps to the caller's tenant. The token is sent only
// over a connection with transport security (grpc's
// RequireTransportSecurity): give New TLS credentials, e.g.
//
//	retryd.New("dns:///retryd.agents.svc:7700",
//		retryd.WithBearerToken(token),
//		retryd.WithTLS(cfg))
//
// With WithInsecure New fails ("the credentials require transport level
// security"); on a plaintext connection passed to
// NewFromConn every call fails with codes.Unauthenticated, before anything
// is sent. Use WithInsecureBearerToken where plaintext is safe.
//
// A token is one line of visible ASCII (what `retryd hash-token` hashes):
// an empty token, or one with a space, a control character (such as the
// trailing newline of a file read as is) or a non-ASCII byte, makes New
// fail, and every call of a NewFromConn client. A later WithBearerToken or
// WithInsecureBearerToken replaces the token. Do not combine it with
// per-RPC credentials of your own that send "authorization" too: retryd
// refuses a call that carries two.
func WithBearerToken(token string) Option {
	return optionFunc(func(o *options) { o.token = &bearerToken{token: token} })
}

// WithInsecureBearerToken is WithBearerToken without the need for
// transport security: the token is sent over plaintext connections too,
// where anyone on the path can read it. Use it only where the connection
// does not leave a trusted host or network: a retryd on loopback, a
// sidecar or service mesh that encrypts the hop (mTLS), or tests.
func WithInsecureBearerToken(token string) Option {
	return optionFunc(func(o *options) { o.token = &bearerToken{token: token, insecure: true} })
}

// WithDecisionTimeout bounds how long Recover waits for retryd's answer to
// a FailedStep (gRPC's own retries on UNAVAILABLE included) before it
// decides locally (degraded mode) or, with WithFailClosed, returns the
// error. A non-positive d keeps the default (DefaultDecisionTimeout).
// Recover also starts a retry of the server's by itself when its
// AwaitRetry cannot re-attach for this long after the retry's due time.
func WithDecisionTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) {
		if d > 0 {
			o.decisionTimeout = d
		}
	})
}

// WithFailClosed turns degraded mode off: when no replica answers,
// Recover returns the gRPC error instead of deciding locally, and waits
// for an AwaitRetry to re-attach for as long as ctx allows.
func WithFailClosed() Option {
	return optionFunc(func(o *options) { o.failClosed = true })
}

// WithLocalRetryBudget caps the retries one chain schedules by local
// decision: at most n under a policy without a finite budget (default
// DefaultLocalRetryBudget), and at most min(n, maxRetries) under one with
// a finite budget (default: its own budget).
func WithLocalRetryBudget(n uint32) Option {
	return optionFunc(func(o *options) { o.localBudget, o.localBudgetSet = n, true })
}

// WithLocalChains bounds how many (session, provider, policy key) chains
// degraded mode keeps in the process (default DefaultLocalChains); the
// least recently used is forgotten first, and its next failure starts
// again at retry 1. A non-positive n keeps the default.
func WithLocalChains(n int) Option {
	return optionFunc(func(o *options) {
		if n > 0 {
			o.localChains = n
		}
	})
}

// WithLocalPolicies gives local decisions the policies the server would
// have used for requests that carry no inline policy: by policy_name for
// a request that names one, else by provider (the server's per-provider
// policy). A request found in neither is decided by retryd's built-in
// default (normal mode). Later calls add to and replace earlier entries.
func WithLocalPolicies(policies map[string]*retrydv1.RetryPolicy) Option {
	return optionFunc(func(o *options) {
		if o.localPolicies == nil {
			o.localPolicies = make(map[string]*retrydv1.RetryPolicy, len(policies))
		}
		for k, p := range policies {
			o.localPolicies[k] = p
		}
	})
}

// WithMeterProvider records the client's decisions in the counter
// retryd.client.decisions (attributes retryd.decision: schedule or
// delegate, retryd.decision.local: true for degraded mode). Without it the
// global MeterProvider of go.opentelemetry.io/otel is used.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(o *options) { o.meterProvider = mp })
}
