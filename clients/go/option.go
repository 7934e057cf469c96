package retryd

import (
	"time"

	"google.golang.org/grpc"
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
)

// Option configures a Client. Options are values built by the With…
// functions of this package; they are applied in order, so a later option
// wins over an earlier one.
type Option interface {
	apply(*options)
}

type options struct {
	dialOptions     []grpc.DialOption
	reattachInitial time.Duration
	reattachMax     time.Duration
	cancelTimeout   time.Duration
}

func newOptions(opts []Option) options {
	o := options{
		reattachInitial: DefaultReattachInitial,
		reattachMax:     DefaultReattachMax,
		cancelTimeout:   DefaultCancelTimeout,
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

// WithDialOptions adds gRPC dial options to the connection New creates.
// They are applied after the client's default of insecure (plaintext)
// transport credentials, so grpc.WithTransportCredentials here replaces
// that default. NewFromConn ignores this option: the caller dialled.
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
