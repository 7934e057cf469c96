package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
)

// metricsReceiver is an OTLP/gRPC metrics receiver on loopback, built on
// the official OTLP protos: it keeps the sum of every data point of every
// Sum metric it is sent, by name.
type metricsReceiver struct {
	collectormetrics.UnimplementedMetricsServiceServer
	mu      sync.Mutex
	sums    map[string]float64
	exports int
}

func (r *metricsReceiver) Export(_ context.Context, req *collectormetrics.ExportMetricsServiceRequest) (*collectormetrics.ExportMetricsServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports++
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				var total float64
				for _, dp := range m.GetSum().GetDataPoints() {
					total += float64(dp.GetAsInt()) + dp.GetAsDouble()
				}
				r.sums[m.GetName()] = total // cumulative: the latest export holds the total
			}
		}
	}
	return &collectormetrics.ExportMetricsServiceResponse{}, nil
}

func (r *metricsReceiver) sum(name string) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.sums[name]
	return v, ok
}

func startMetricsReceiver(t *testing.T) (*metricsReceiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &metricsReceiver{sums: map[string]float64{}}
	srv := grpc.NewServer()
	collectormetrics.RegisterMetricsServiceServer(srv, r)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return r, lis.Addr().String()
}

// TestOTLPMetrics: with OTEL_METRICS_EXPORTER=otlp the real binary pushes
// its metrics to an OTLP/gRPC receiver — retryd.decisions counts a
// FailedStep — while its Prometheus endpoint keeps serving them, without
// otel_scope_* labels.
func TestOTLPMetrics(t *testing.T) {
	t.Parallel()
	recv, addr := startMetricsReceiver(t)
	srv := retrydtest.StartWithEnv(t, []string{
		"OTEL_METRICS_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=http://" + addr, "OTEL_METRIC_EXPORT_INTERVAL=200",
	}, "--metrics-listen", "127.0.0.1:0")
	client := retrydv1.NewRetryServiceClient(srv.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, session := range []string{"a", "b"} {
		if _, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 1, Step: 1, Provider: "openai", Failure: &retrydv1.Failure{Code: "SERVER"},
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: policy(60_000)}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 15*time.Second, "retryd.decisions = 2 at the OTLP receiver", func() bool {
		v, _ := recv.sum("retryd.decisions")
		return v == 2
	})

	resp, err := http.Get("http://" + srv.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	resp.Body.Close()
	body := b.String()
	if metricValue(body, "retryd_decisions_total") != 2 {
		t.Errorf("the Prometheus endpoint beside the push: retryd_decisions_total = %v, want 2", metricValue(body, "retryd_decisions_total"))
	}
	if strings.Contains(body, "otel_scope_") {
		t.Errorf("series carry otel_scope_* labels without RETRYD_PROMETHEUS_SCOPE_LABELS:\n%s", grepLines(body, "retryd_decisions"))
	}
}
