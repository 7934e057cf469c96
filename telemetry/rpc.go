package telemetry

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/rpcconv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RPCMetrics records the server's rpc.server.call.duration histogram
// (rpc_server_call_duration_seconds in Prometheus) through a unary and a
// stream interceptor: the same instrument, scope, buckets and attributes
// (rpc.method, rpc.system.name, rpc.response.status_code and, for the
// codes a server counts as its own errors, error.type) as otelgrpc's
// server stats handler records in its default semantic-conventions mode.
//
// It is what retryd installs when metrics are served but tracing is off:
// a gRPC stats handler makes grpc-go copy every call's incoming metadata
// and allocate a stats event per phase of the call, and otelgrpc adds a
// context value, a propagation extract and two attribute sets per call.
// Here a call costs two clock reads and one histogram record with an
// attribute set built once per (method, status code). The duration runs
// from the interceptor's start to the handler's return: it leaves
// out grpc-go's own header parsing and the write of the response, a few
// microseconds against the histogram's smallest bucket of 5 ms.
type RPCMetrics struct {
	duration metric.Float64Histogram
	sets     sync.Map // rpcKey → []metric.RecordOption
}

type rpcKey struct {
	method string
	code   codes.Code
}

// NewRPCMetrics creates the instrument on mp.
func NewRPCMetrics(mp metric.MeterProvider) (*RPCMetrics, error) {
	meter := mp.Meter(otelgrpc.ScopeName,
		metric.WithInstrumentationVersion(otelgrpc.Version),
		metric.WithSchemaURL(semconv.SchemaURL))
	d, err := rpcconv.NewServerCallDuration(meter, metric.WithExplicitBucketBoundaries(
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	if err != nil {
		return nil, err
	}
	return &RPCMetrics{duration: d.Inst()}, nil
}

// RPCMetricsReplaceOtelgrpc reports whether RPCMetrics records what
// otelgrpc's server handler would: in otelgrpc's default semantic
// conventions, not when OTEL_SEMCONV_STABILITY_OPT_IN asks for the old
// rpc.server.duration (rpc/old, rpc/dup).
func RPCMetricsReplaceOtelgrpc(getenv func(string) string) bool {
	for v := range strings.SplitSeq(getenv("OTEL_SEMCONV_STABILITY_OPT_IN"), ",") {
		if v = strings.TrimSpace(v); v == "rpc/old" || v == "rpc/dup" {
			return false
		}
	}
	return true
}

// UnaryServerInterceptor records every unary call.
func (m *RPCMetrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		began := time.Now()
		resp, err := handler(ctx, req)
		m.Record(ctx, info.FullMethod, began, err)
		return resp, err
	}
}

// StreamServerInterceptor records every streaming call.
func (m *RPCMetrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		began := time.Now()
		err := handler(srv, ss)
		m.Record(ss.Context(), info.FullMethod, began, err)
		return err
	}
}

// Record records one call of fullMethod that began then and returned err
// (nil: OK), for a server that records through an interceptor of its own.
func (m *RPCMetrics) Record(ctx context.Context, fullMethod string, began time.Time, err error) {
	elapsed := float64(time.Since(began)) / float64(time.Second)
	code := codes.OK
	if err != nil {
		// As grpc-go answers it: a non-status error is UNKNOWN, a bare
		// context error its own code.
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err)
		}
		code = st.Code()
	}
	m.duration.Record(ctx, elapsed, m.options(fullMethod, code)...)
}

// maxCachedCode bounds the cached attribute sets to the defined codes; a
// handler's made-up code gets its set built per call.
const maxCachedCode = codes.Unauthenticated

func (m *RPCMetrics) options(method string, code codes.Code) []metric.RecordOption {
	k := rpcKey{method, code}
	if opts, ok := m.sets.Load(k); ok {
		return opts.([]metric.RecordOption)
	}
	kvs := make([]attribute.KeyValue, 0, 4)
	if strings.HasPrefix(method, "/") {
		kvs = append(kvs, semconv.RPCMethod(method[1:]))
	}
	kvs = append(kvs, semconv.RPCSystemNameGRPC, semconv.RPCResponseStatusCode(canonicalString(code)))
	if serverError(code) {
		kvs = append(kvs, semconv.ErrorTypeKey.String(canonicalString(code)))
	}
	opts := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
	if code <= maxCachedCode {
		// Methods are the registered ones only: grpc-go answers an
		// unknown method before any interceptor runs.
		m.sets.Store(k, opts)
	}
	return opts
}

// serverError reports the codes a server records as its own errors
// (error.type), as otelgrpc does.
func serverError(c codes.Code) bool {
	switch c {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// canonicalString is a code's name in the semantic conventions.
func canonicalString(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	case codes.Unknown:
		return "UNKNOWN"
	case codes.InvalidArgument:
		return "INVALID_ARGUMENT"
	case codes.DeadlineExceeded:
		return "DEADLINE_EXCEEDED"
	case codes.NotFound:
		return "NOT_FOUND"
	case codes.AlreadyExists:
		return "ALREADY_EXISTS"
	case codes.PermissionDenied:
		return "PERMISSION_DENIED"
	case codes.ResourceExhausted:
		return "RESOURCE_EXHAUSTED"
	case codes.FailedPrecondition:
		return "FAILED_PRECONDITION"
	case codes.Aborted:
		return "ABORTED"
	case codes.OutOfRange:
		return "OUT_OF_RANGE"
	case codes.Unimplemented:
		return "UNIMPLEMENTED"
	case codes.Internal:
		return "INTERNAL"
	case codes.Unavailable:
		return "UNAVAILABLE"
	case codes.DataLoss:
		return "DATA_LOSS"
	case codes.Unauthenticated:
		return "UNAUTHENTICATED"
	}
	return "CODE(" + strconv.FormatInt(int64(c), 10) + ")"
}
