package service

import "context"

// Pinger is implemented by stores that keep their state in a server of
// their own (Redis), which can go away while retryd keeps running. The
// server probes it about once a second and reports NOT_SERVING on gRPC
// health while Ping fails, so that load balancers send agents to replicas
// that can decide. Stores whose state lives in the process or on a local
// disk do not implement it: they are available whenever retryd is.
type Pinger interface {
	// Ping returns nil when the store can reach its state now, and an
	// error (wrapping ErrUnavailable) when it cannot.
	Ping(ctx context.Context) error
}
