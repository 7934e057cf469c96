// Package telemetry sets up retryd's OpenTelemetry tracing and its
// Prometheus metrics from the standard OTEL_* environment variables only.
//
// Tracing is off, at no cost (a no-op tracer provider), unless an exporter
// is configured: OTEL_TRACES_EXPORTER set to something other than "none", or
// an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). The exporter itself is chosen by the
// contrib autoexport package (otlp over grpc or http/protobuf per
// OTEL_EXPORTER_OTLP_PROTOCOL, console, none), the sampler by
// OTEL_TRACES_SAMPLER, and the resource by OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. Spans leave through a batch processor with a
// bounded queue (OTEL_BSP_*), so exporting never blocks a decision; spans
// dropped on a full queue are counted by the SDK's own metric
// otel_sdk_processor_span_processed_total{error_type="queue_full"}.
//
// Metrics always exist: the OpenTelemetry metrics API with the Prometheus
// exporter, served by Handler. Its series carry no otel_scope_* labels
// unless RETRYD_PROMETHEUS_SCOPE_LABELS=true: every metric of retryd has
// one instrumentation scope, so the labels only multiply the series'
// width. OTEL_METRICS_EXPORTER set to otlp (or console) also pushes every
// metric through the exporter contrib autoexport builds for it (protocol,
// endpoint and headers from the OTEL_EXPORTER_OTLP_* variables, interval
// from OTEL_METRIC_EXPORT_INTERVAL), beside the Prometheus endpoint;
// "none", "prometheus" (the endpoint retryd serves itself) or unset push
// nothing.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Telemetry holds the providers; Shutdown flushes them.
type Telemetry struct {
	Tracer trace.TracerProvider
	Meter  metric.MeterProvider
	// Handler serves the Prometheus metrics.
	Handler http.Handler
	// TracingEnabled reports whether spans are exported.
	TracingEnabled bool
	// MetricsPushed reports whether metrics are pushed (OTEL_METRICS_EXPORTER).
	MetricsPushed bool

	shutdown []func(context.Context) error
}

// TracingConfigured reports whether the environment configures a trace
// exporter.
func TracingConfigured(getenv func(string) string) bool {
	if v := getenv("OTEL_TRACES_EXPORTER"); v != "" {
		return v != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// MetricsPushConfigured reports whether the environment asks for metrics
// to be pushed: OTEL_METRICS_EXPORTER set to an exporter other than none
// and prometheus (retryd serves its own Prometheus endpoint).
func MetricsPushConfigured(getenv func(string) string) bool {
	switch getenv("OTEL_METRICS_EXPORTER") {
	case "", "none", "prometheus":
		return false
	}
	return true
}

// Setup builds the providers and installs them (and the W3C trace-context
// propagator) as the process's globals. version is the service version.
func Setup(ctx context.Context, version string, getenv func(string) string) (*Telemetry, error) {
	t := &Telemetry{Tracer: noop.NewTracerProvider()}

	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("retryd"), semconv.ServiceVersion(version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	promOpts := []promexporter.Option{promexporter.WithRegisterer(registry)}
	if getenv("RETRYD_PROMETHEUS_SCOPE_LABELS") != "true" {
		promOpts = append(promOpts, promexporter.WithoutScopeInfo())
	}
	exporter, err := promexporter.New(promOpts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	readers := []sdkmetric.Option{sdkmetric.WithReader(exporter), sdkmetric.WithResource(res)}
	if MetricsPushConfigured(getenv) {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: metric exporter: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(r))
		t.MetricsPushed = true
	}
	mp := sdkmetric.NewMeterProvider(readers...)
	t.Meter = mp
	t.Handler = promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry})
	t.shutdown = append(t.shutdown, mp.Shutdown)
	otel.SetMeterProvider(mp)

	if TracingConfigured(getenv) {
		// The SDK counts the spans its batch processor drops only with its
		// (experimental) self-observability on; retryd wants that count.
		if getenv("OTEL_GO_X_OBSERVABILITY") == "" {
			os.Setenv("OTEL_GO_X_OBSERVABILITY", "true")
		}
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("telemetry: span exporter: %w", err), mp.Shutdown(ctx))
		}
		tp := sdktrace.NewTracerProvider(
			sdktrace.WithSpanProcessor(NewDiscardFilter(sdktrace.NewBatchSpanProcessor(exp))),
			sdktrace.WithResource(res))
		t.Tracer, t.TracingEnabled = tp, true
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}
	otel.SetTracerProvider(t.Tracer)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return t, nil
}

// Shutdown flushes pending spans and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	return errors.Join(errs...)
}
