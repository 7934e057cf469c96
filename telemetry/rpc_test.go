package telemetry_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/retryd/retryd/telemetry"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// recorded is one histogram data point as it reaches an exporter.
type recorded struct {
	scope, version, schema, name, unit, description string
	bounds                                          []float64
	attrs                                           string
	count                                           uint64
}

// callAll makes the same calls on a health server built with opts and
// returns what the meter recorded.
func callAll(t *testing.T, opts func(*sdkmetric.MeterProvider) []grpc.ServerOption) []recorded {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts(mp)...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("Check(nope) = %v, want NOT_FOUND", err)
	}
	// A stream the caller ends: the server sees it cancelled.
	wctx, wcancel := context.WithCancel(ctx)
	w, err := client.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	wcancel()
	_, _ = w.Recv()

	var got []recorded
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		var calls uint64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				h, ok := m.Data.(metricdata.Histogram[float64])
				if !ok {
					t.Fatalf("%s is a %T", m.Name, m.Data)
				}
				for _, dp := range h.DataPoints {
					got = append(got, recorded{
						scope: sm.Scope.Name, version: sm.Scope.Version, schema: sm.Scope.SchemaURL,
						name: m.Name, unit: m.Unit, description: m.Description, bounds: dp.Bounds,
						attrs: dp.Attributes.Encoded(attribute.DefaultEncoder()), count: dp.Count,
					})
					calls += dp.Count
				}
			}
		}
		if calls == 5 || time.Now().After(deadline) { // the stream's end is recorded after the client saw it
			break
		}
	}
	slices.SortFunc(got, func(a, b recorded) int {
		if a.attrs < b.attrs {
			return -1
		}
		if a.attrs > b.attrs {
			return 1
		}
		return 0
	})
	return got
}

// TestRPCMetricsRecordAsOtelgrpc checks that the interceptors record
// exactly what otelgrpc's server stats handler records, but the durations.
func TestRPCMetricsRecordAsOtelgrpc(t *testing.T) {
	t.Parallel()
	want := callAll(t, func(mp *sdkmetric.MeterProvider) []grpc.ServerOption {
		return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithMeterProvider(mp)))}
	})
	got := callAll(t, func(mp *sdkmetric.MeterProvider) []grpc.ServerOption {
		m, err := telemetry.NewRPCMetrics(mp)
		if err != nil {
			t.Fatal(err)
		}
		return []grpc.ServerOption{
			grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor()),
			grpc.ChainStreamInterceptor(m.StreamServerInterceptor()),
		}
	})
	if len(want) != 3 {
		t.Fatalf("otelgrpc recorded %d attribute sets, want 3 (OK, NOT_FOUND, CANCELLED): %+v", len(want), want)
	}
	if len(got) != len(want) {
		t.Fatalf("RPCMetrics recorded\n%+v\notelgrpc\n%+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.scope != w.scope || g.version != w.version || g.schema != w.schema || g.name != w.name ||
			g.unit != w.unit || g.description != w.description || !slices.Equal(g.bounds, w.bounds) ||
			g.attrs != w.attrs || g.count != w.count {
			t.Errorf("RPCMetrics recorded\n%+v\notelgrpc\n%+v", g, w)
		}
	}
}

func TestRPCMetricsReplaceOtelgrpc(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		"": true, "http": true, "rpc": true, "http, rpc/dup": false, "rpc/old": false,
	} {
		getenv := func(k string) string {
			if k == "OTEL_SEMCONV_STABILITY_OPT_IN" {
				return v
			}
			return ""
		}
		if got := telemetry.RPCMetricsReplaceOtelgrpc(getenv); got != want {
			t.Errorf("OTEL_SEMCONV_STABILITY_OPT_IN=%q: %v, want %v", v, got, want)
		}
	}
}
