package service_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/admission"
	"github.com/retryd/retryd/config"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/file"
	"github.com/retryd/retryd/store/memory"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
	"github.com/retryd/retryd/telemetry"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// backends lists the stores the whole suite runs against. Every test
// iterates it, so semantics cannot drift between stores.
//
// Two properties differ by design, and are flagged: partitioned stores
// number events per partition (sequences increase per session and in the
// unfiltered log, but are not 1, 2, …), and keep fleet state per
// partition, so the service refuses fleet protection on them.
var backends = []struct {
	name        string
	open        func(t *testing.T, cfg memory.Config) store.Backend
	partitioned bool
}{
	{"memory", func(t *testing.T, cfg memory.Config) store.Backend {
		s := memory.New(cfg)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}, false},
	{"file", func(t *testing.T, cfg memory.Config) store.Backend {
		s, err := file.Open(t.TempDir(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("closing the file store: %v", err)
			}
		})
		return s
	}, false},
	{"redis", func(t *testing.T, cfg memory.Config) store.Backend {
		return openRedis(t, redistest.Shared(t).URL(0), cfg)
	}, false},
	// The partitioned key layout on one Redis, and on a Redis Cluster of
	// three masters (16 partitions).
	{"redis-partitioned", func(t *testing.T, cfg memory.Config) store.Backend {
		return openRedis(t, redistest.Shared(t).URL(0)+"?partitions=4", cfg)
	}, true},
	{"redis-cluster", func(t *testing.T, cfg memory.Config) store.Backend {
		return openRedis(t, redistest.SharedCluster(t).URL(), cfg)
	}, true},
}

// suiteURL gives a Redis URL of the service suite a generous
// unavailable_after. The suite tests decisions, not how fast a call gives up
// on an unreachable Redis (store/redis's outage and network fault tests
// do); with the 1 s default, a call that queues behind busy group commits
// on a loaded 2-core machine under -race could end UNAVAILABLE and fail a
// test about something else.
func suiteURL(url string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "unavailable_after=10s"
}

func openRedis(t *testing.T, url string, cfg memory.Config) store.Backend {
	s, err := redis.Open(context.Background(), redis.Config{URL: suiteURL(url), KeyPrefix: redistest.Prefix(), Options: cfg.Options})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the redis store: %v", err)
		}
	})
	return s
}

type harness struct {
	t      *testing.T
	client retrydv1.RetryServiceClient
	// gapless: the store numbers the whole log 1, 2, … (not partitioned).
	gapless bool
	conn    *grpc.ClientConn
	store   store.Backend

	// With harnessOpts.telemetry: this backend's own tracer provider (the
	// server's and the agent's), the spans it ended, and its metrics.
	tracer  *sdktrace.TracerProvider
	spans   *tracetest.SpanRecorder
	metrics *sdkmetric.ManualReader
}

type harnessOpts struct {
	abandonGrace time.Duration
	policies     string // YAML policy file content
	// telemetry gives each backend's server a recording tracer of its
	// own, so that backends running in parallel never see each other's
	// spans (metrics are recorded per server always).
	telemetry bool
	// limits, when set, are the server's admission limits.
	limits *admission.Limits
}

// eachBackend runs fn once per store, each with its own server over real
// gRPC on a loopback TCP port, and runs the invariant checker over the
// event log when fn returns.
func eachBackend(t *testing.T, o harnessOpts, fn func(t *testing.T, h *harness)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			if b.partitioned && hasFleet(t, o.policies) {
				t.Skip("a partitioned store keeps fleet state per partition: the service refuses fleet protection " +
					"on it (TestFleetRefusedOnPartitions)")
			}
			h, _ := startHarness(t, b.open, o)
			h.gapless = !b.partitioned
			fn(t, h)
			h.verify()
		})
	}
}

// hasFleet reports whether a policy file configures fleet protection.
func hasFleet(t *testing.T, policies string) bool {
	if policies == "" {
		return false
	}
	ps, err := config.Parse([]byte(policies))
	if err != nil {
		t.Fatal(err)
	}
	return ps.HasFleet()
}

// startHarness starts one server over a store opened by open, with real
// gRPC on a loopback TCP port, the test-tenant interceptors and Observe
// running, and returns its harness and service.
func startHarness(t *testing.T, open func(*testing.T, memory.Config) store.Backend, o harnessOpts) (*harness, *service.Service) {
	t.Helper()
	grace := o.abandonGrace
	if grace == 0 {
		grace = time.Minute
	}
	store := open(t, memory.Config{Options: store.Options{AbandonGrace: grace}})
	var opts []service.Option
	if o.limits != nil {
		opts = append(opts, service.WithLimits(*o.limits))
	}
	if o.policies != "" {
		ps, err := config.Parse([]byte(o.policies))
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, service.WithPolicies(ps))
	}
	// Every server records its metrics, in a reader of its own.
	h := &harness{t: t, store: store, metrics: sdkmetric.NewManualReader()}
	opts = append(opts, service.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.metrics))))
	srvOpts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(testTenantUnary), grpc.ChainStreamInterceptor(testTenantStream),
	}
	if o.telemetry {
		h.spans = tracetest.NewSpanRecorder()
		// The server's own filter: speculative backoff spans of
		// delegated failures are dropped, not recorded.
		h.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(telemetry.NewDiscardFilter(h.spans)))
		srvOpts = append(srvOpts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(h.tracer), otelgrpc.WithPropagators(propagation.TraceContext{}))))
		opts = append(opts, service.WithTracerProvider(h.tracer))
	}
	srv := grpc.NewServer(srvOpts...)
	svc, err := service.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	retrydv1.RegisterRetryServiceServer(srv, svc)
	observeCtx, stopObserving := context.WithCancel(context.Background())
	observed := make(chan error, 1)
	go func() { observed <- svc.Observe(observeCtx) }()
	t.Cleanup(func() {
		stopObserving()
		if err := <-observed; err != nil {
			t.Errorf("Observe: %v", err)
		}
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if o.telemetry {
		// The agent side propagates its attempt span as W3C trace context.
		dialOpts = append(dialOpts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(h.tracer), otelgrpc.WithPropagators(propagation.TraceContext{}))))
	}
	conn, err := grpc.NewClient(lis.Addr().String(), dialOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h.client, h.conn = retrydv1.NewRetryServiceClient(conn), conn
	return h, svc
}

func (h *harness) verify() {
	h.t.Helper()
	for _, v := range invariant.Check(h.events("")) {
		h.t.Errorf("invariant violation: %s", v)
	}
}

func (h *harness) events(session string) []*retrydv1.Event {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs, err := retrydtest.Events(ctx, h.conn, session)
	if err != nil {
		h.t.Fatalf("WatchEvents: %v", err)
	}
	return evs
}

func (h *harness) fail(req *retrydv1.FailedStepRequest) *retrydv1.FailedStepResponse {
	h.t.Helper()
	resp, err := h.client.FailedStep(context.Background(), req)
	if err != nil {
		h.t.Fatalf("FailedStep(%v): %v", req, err)
	}
	return resp
}

func (h *harness) schedule(req *retrydv1.FailedStepRequest) *retrydv1.Schedule {
	h.t.Helper()
	resp := h.fail(req)
	s := resp.GetDecision().GetSchedule()
	if s == nil {
		h.t.Fatalf("FailedStep: want schedule, got %v", resp.GetDecision())
	}
	return s
}

// await reads a whole AwaitRetry stream: the state message, then the
// terminal one, then the end of the stream.
func (h *harness) await(ctx context.Context, retryID string) (*retrydv1.RetryState, *retrydv1.AwaitRetryResponse) {
	h.t.Helper()
	stream, err := h.client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: retryID})
	if err != nil {
		h.t.Fatalf("AwaitRetry: %v", err)
	}
	first, err := stream.Recv()
	if err != nil {
		h.t.Fatalf("AwaitRetry first message: %v", err)
	}
	if first.GetState() == nil {
		h.t.Fatalf("AwaitRetry: first message is not the state: %v", first)
	}
	term, err := stream.Recv()
	if err != nil {
		h.t.Fatalf("AwaitRetry terminal message: %v", err)
	}
	if term.GetStarted() == nil && term.GetCancelled() == nil {
		h.t.Fatalf("AwaitRetry: second message is not terminal: %v", term)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		h.t.Fatalf("AwaitRetry: want end of stream after the terminal message, got %v", err)
	}
	return first.GetState(), term
}

// start waits for the retry's Started confirmation.
func (h *harness) start(retryID string) *retrydv1.RetryStarted {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, term := h.await(ctx, retryID)
	if term.GetStarted() == nil {
		h.t.Fatalf("retry %s: want started, got %v", retryID, term)
	}
	return term.GetStarted()
}

// fast is a normal-mode policy with exact delays: initial ms, doubling, no
// jitter.
func fast(initialMs uint64) *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(initialMs),
		MaxDelayMs:     proto.Uint64(10_000),
		JitterRatio:    proto.Float64(0),
	}}
}

func failure(session string, turn, step uint64, provider, code string, p *retrydv1.RetryPolicy) *retrydv1.FailedStepRequest {
	req := &retrydv1.FailedStepRequest{
		SessionId: session, Turn: turn, Step: step, Provider: provider,
		Failure: &retrydv1.Failure{Code: code, Message: "provider said no"},
	}
	if p != nil {
		req.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: p}
	}
	return req
}

// errorInfo returns the status code and ErrorInfo of err.
func errorInfo(t *testing.T, err error) (codes.Code, *errdetails.ErrorInfo) {
	t.Helper()
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), info
		}
	}
	return st.Code(), nil
}

func badFields(err error) map[string]string {
	out := map[string]string{}
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out[v.GetField()] = v.GetDescription()
			}
		}
	}
	return out
}
