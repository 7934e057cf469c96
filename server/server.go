package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"

	"github.com/retryd/retryd"
	"github.com/retryd/retryd/config"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/file"
	"github.com/retryd/retryd/store/memory"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/telemetry"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// Version is the server's version, reported in traces and by `retryd
// version`: the repository's VERSION file (package retryd).
var Version = retryd.Version

// NewLogger builds the logger the configuration asks for.
func NewLogger(c Config, w io.Writer) *slog.Logger {
	level, _ := c.level()
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Run serves until ctx is done, then shuts down: health reports NOT_SERVING
// (on the main port and the --health-listen port),
// every awaiter receives Cancelled (reason shutdown), in-flight calls drain,
// and the gRPC server stops within ShutdownTimeout. The listeners are bound
// before Run logs "serving" with their addresses. Tracing and metrics are
// configured from the OTEL_* variables read through getenv.
func Run(ctx context.Context, c Config, log *slog.Logger, getenv func(string) string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	setMemoryLimit(ctx, c.MemoryLimitRatio, log)
	currentPolicies := config.Default
	var policySrc *policySource
	if c.ConfigFile != "" {
		var err error
		if policySrc, err = newPolicySource(c.ConfigFile, log); err != nil {
			return err
		}
		currentPolicies = policySrc.Current
	}
	policies := currentPolicies()
	tel, err := telemetry.Setup(ctx, Version, getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("flushing telemetry", "err", err)
		}
	}()

	// The TLS files load before anything opens: a missing or invalid file
	// refuses the start, naming its flag.
	var certs *certSource
	if c.TLSEnabled() {
		if certs, err = newCertSource(c, log); err != nil {
			return err
		}
	}
	// So does the credentials file (authentication on); without one,
	// setupAuth warns that every caller is the default tenant.
	creds, authOpts, err := setupAuth(c, log)
	if err != nil {
		return err
	}

	// The store opens before the listeners: a store that cannot be opened
	// (unreachable, locked, another schema version) refuses the start.
	redis.SetLogger(log) // before the store dials: go-redis' own lines go through log
	store, err := openStore(c, log)
	if err != nil {
		return err
	}
	defer store.close(log)
	lis, err := net.Listen("tcp", c.Listen)
	if err != nil {
		store.stop()
		return fmt.Errorf("server: listen: %w", err)
	}
	var metricsLis net.Listener
	if c.MetricsListen != "" {
		if metricsLis, err = net.Listen("tcp", c.MetricsListen); err != nil {
			lis.Close()
			store.stop()
			return fmt.Errorf("server: metrics listen: %w", err)
		}
	}
	var healthLis net.Listener
	if c.HealthListen != "" {
		if healthLis, err = net.Listen("tcp", c.HealthListen); err != nil {
			lis.Close()
			if metricsLis != nil {
				metricsLis.Close()
			}
			store.stop()
			return fmt.Errorf("server: health listen: %w", err)
		}
	}

	// Metrics are read through the /metrics endpoint or pushed
	// (OTEL_METRICS_EXPORTER): with neither the service records into a
	// no-op provider, which costs nothing per call.
	metricsRead := metricsLis != nil || tel.MetricsPushed
	var meter metric.MeterProvider = metricnoop.NewMeterProvider()
	if metricsRead {
		meter = tel.Meter
	}
	if policySrc != nil {
		if err := policySrc.registerMetrics(meter); err != nil {
			store.stop()
			return fmt.Errorf("server: metrics: %w", err)
		}
	}
	svc, err := service.New(store.Store, // the store itself: its gauges come from its Stats
		service.WithPolicySource(currentPolicies), service.WithLogger(log),
		service.WithTracerProvider(tel.Tracer), service.WithMeterProvider(meter),
		service.WithLimits(c.Limits()))
	if err != nil {
		store.stop()
		return err
	}
	opts, observe, err := rpcTelemetryOptions(tel, metricsRead, getenv)
	if err != nil {
		store.stop()
		return err
	}
	opts = append(opts, limitOptions(c, observe)...)
	opts = append(opts, grpc.ForceServerCodecV2(pooledCodec{}), grpc.NumStreamWorkers(streamWorkers()))
	if certs != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(certs.serverConfig())))
	}
	opts = append(opts, authOpts...) // the main port only: the health port needs none
	srv := grpc.NewServer(opts...)
	retrydv1.RegisterRetryServiceServer(srv, svc)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(retrydv1.RetryService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	reportPolicyFile(policySrc, hs)
	healthpb.RegisterHealthServer(srv, hs)
	// A store whose state lives in a server of its own (Redis) is probed:
	// health reports NOT_SERVING while that server does not answer.
	stopProbing := probeStore(store.Store, hs, log)
	reflection.Register(srv)
	// The health port is plaintext and serves only the same health server,
	// so NOT_SERVING at shutdown shows on both ports.
	var healthSrv *grpc.Server
	if healthLis != nil {
		healthSrv = grpc.NewServer(limitOptions(c, nil)...)
		healthpb.RegisterHealthServer(healthSrv, hs)
	}
	watchCtx, stopWatching := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if certs != nil {
			certs.Watch(watchCtx, c.TLSReloadInterval)
		}
	}()
	authWatched := watchAuth(watchCtx, creds, c.AuthReloadInterval)
	policiesWatched := closedChan()
	if policySrc != nil {
		policiesWatched = policySrc.watch(watchCtx, c.ConfigReloadInterval)
	}

	observeCtx, stopObserving := context.WithCancel(context.Background())
	observed := make(chan struct{})
	go func() {
		defer close(observed)
		if err := svc.Observe(observeCtx); err != nil {
			log.Error("observing the event log", "err", err)
		}
	}()

	serveErr := make(chan error, 3)
	go func() { serveErr <- srv.Serve(lis) }()
	if healthSrv != nil {
		go func() {
			if err := healthSrv.Serve(healthLis); err != nil {
				serveErr <- fmt.Errorf("health: %w", err)
			}
		}()
	}
	var metricsSrv *http.Server
	if metricsLis != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", tel.Handler)
		if c.Pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := metricsSrv.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("metrics: %w", err)
			}
		}()
	}
	attrs := []any{"addr", lis.Addr().String(), "store", store.kind, "tracing", tel.TracingEnabled,
		"named_policies", len(policies.Names()), "provider_policies", len(policies.Providers())}
	if store.dir != "" {
		attrs = append(attrs, "store_dir", store.dir)
	}
	if metricsLis != nil {
		attrs = append(attrs, "metrics_addr", metricsLis.Addr().String())
	}
	attrs = append(attrs, "metrics_pushed", tel.MetricsPushed)
	attrs = append(attrs, "tls", c.TLSEnabled(), "mtls", c.MTLSEnabled())
	attrs = append(attrs, "auth", c.AuthEnabled())
	if healthLis != nil {
		attrs = append(attrs, "health_addr", healthLis.Addr().String())
	}
	log.Info("serving", attrs...)

	var runErr error
	select {
	case err := <-serveErr:
		runErr = fmt.Errorf("server: serve: %w", err)
	case <-ctx.Done():
	}

	start := time.Now()
	log.Info("shutting down", "timeout", c.ShutdownTimeout)
	stopProbing()
	hs.Shutdown() // NOT_SERVING: load balancers stop sending new work
	store.stop()  // awaiters get Cancelled(shutdown); watchers end
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(c.ShutdownTimeout):
		log.Warn("graceful stop timed out; closing remaining connections")
		srv.Stop()
		<-stopped
	}
	if healthSrv != nil {
		healthSrv.Stop() // probes saw NOT_SERVING through the drain
	}
	stopWatching()
	<-watched
	<-authWatched
	<-policiesWatched
	stopObserving()
	<-observed
	if metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = metricsSrv.Shutdown(sctx)
		cancel()
	}
	store.close(log) // in-flight calls have drained
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond))
	return runErr
}

// rpcTelemetryOptions are the options that record every call of the main
// port, and the observer the unary interceptor hands every unary call's
// end to: both outermost, so that they see the status the caller gets.
// RPC spans and rpc_server_* metrics exist only when someone can see
// them: with tracing on, otelgrpc's stats handler records both; with only
// a /metrics endpoint, telemetry.RPCMetrics records the same
// rpc.server.call.duration without a stats handler's per-call work
// (grpc-go copies the incoming metadata and allocates a stats event per
// phase of every call for one; otelgrpc adds a context value, a
// propagation extract and two attribute sets). With neither, nothing is
// recorded.
func rpcTelemetryOptions(tel *telemetry.Telemetry, metrics bool, getenv func(string) string) ([]grpc.ServerOption, callObserver, error) {
	switch {
	case tel.TracingEnabled || metrics && !telemetry.RPCMetricsReplaceOtelgrpc(getenv):
		return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tel.Tracer), otelgrpc.WithMeterProvider(tel.Meter)))}, nil, nil
	case metrics:
		m, err := telemetry.NewRPCMetrics(tel.Meter)
		if err != nil {
			return nil, nil, fmt.Errorf("server: rpc metrics: %w", err)
		}
		return []grpc.ServerOption{grpc.ChainStreamInterceptor(m.StreamServerInterceptor())}, m.Record, nil
	}
	return nil, nil, nil
}

// streamWorkers is how many goroutines of the main port run calls. By
// default grpc-go starts a goroutine per call, whose stack then grows
// (copied each time it doubles) to the depth of retryd's handlers; a
// worker keeps its grown stack from one call to the next. A call that
// finds every worker busy still gets a goroutine of its own, so the
// number bounds nothing: it only has to cover the calls usually in
// flight.
func streamWorkers() uint32 { return uint32(16 * runtime.GOMAXPROCS(0)) }

// openedStore is the configured store with its two steps of shutdown:
// stop ends its streams and timers before the drain (idempotent), close
// frees what it holds (the database file) once no call can reach it.
type openedStore struct {
	service.Store
	kind, dir string
	stop      func()
	release   func() error
	released  bool
}

func (s *openedStore) close(log *slog.Logger) {
	if s.released {
		return
	}
	s.released = true
	s.stop()
	if err := s.release(); err != nil {
		log.Error("closing the store", "err", err)
	}
}

func openStore(c Config, log *slog.Logger) (*openedStore, error) {
	opts := service.StoreOptions{ChainTTL: c.ChainTTL, AbandonGrace: c.AbandonGrace, EventLogSize: c.EventLogSize, Log: log}
	mc := memory.Config{StoreOptions: opts}
	switch kind, dir := c.StoreKind(); kind {
	case StoreMemory:
		s := memory.New(mc)
		return &openedStore{Store: s, kind: kind, stop: s.Close, release: func() error { return nil }}, nil
	case "file":
		s, err := file.Open(dir, mc)
		if err != nil {
			return nil, fmt.Errorf("server: store: %w", err)
		}
		return &openedStore{Store: s, kind: kind, dir: dir, stop: s.Store.Close, release: s.Close}, nil
	case "redis":
		s, err := redis.Open(context.Background(), redis.Config{URL: dir, StoreOptions: opts})
		if err != nil {
			return nil, fmt.Errorf("server: store: %w", err)
		}
		return &openedStore{Store: s, kind: kind, stop: s.Stop, release: s.Close}, nil
	default:
		return nil, &FieldError{Field: "store", Value: c.Store, Reason: "want memory, file:DIR, redis://host:port/db, redis://sentinel:26379/db?master_name=NAME or redis://node:6379?addr=node2:6379 (Cluster)"}
	}
}

// ConfigHealthService is the grpc.health.v1 service name that reports
// the policy file: SERVING while the file on disk is what decides (and
// always without --config), NOT_SERVING while its content is refused or
// it cannot be read. The last good policies keep deciding meanwhile, so
// "" and the RetryService stay SERVING: probe this name to see that a
// change did not apply, never to take a replica out of service.
const ConfigHealthService = "retryd.config"

// reportPolicyFile keeps ConfigHealthService's status in step with the
// policy file's; ps is nil without --config.
func reportPolicyFile(ps *policySource, hs *health.Server) {
	hs.SetServingStatus(ConfigHealthService, healthpb.HealthCheckResponse_SERVING)
	if ps == nil {
		return
	}
	ps.setCurrentHook(func(current bool) {
		status := healthpb.HealthCheckResponse_SERVING
		if !current {
			status = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus(ConfigHealthService, status)
	})
}

// storeProbeInterval is how often probeStore asks the store.
const storeProbeInterval = time.Second

// probeStore asks a store that implements service.Pinger every
// storeProbeInterval whether it can reach its state, and sets the health
// status of "" and of the RetryService to match: NOT_SERVING while it
// cannot (its calls fail UNAVAILABLE meanwhile), SERVING again once it
// can. It logs each change. The returned function stops the probe and
// waits for it; for other stores it does nothing.
func probeStore(store service.Store, hs *health.Server, log *slog.Logger) (stop func()) {
	p, ok := store.(service.Pinger)
	if !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(storeProbeInterval)
		defer t.Stop()
		serving := true
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, storeProbeInterval)
			err := p.Ping(pctx)
			pcancel()
			if ctx.Err() != nil || (err == nil) == serving {
				continue
			}
			serving = err == nil
			status := healthpb.HealthCheckResponse_SERVING
			if serving {
				log.Info("the store answers again; health reports SERVING")
			} else {
				status = healthpb.HealthCheckResponse_NOT_SERVING
				log.Warn("the store does not answer; health reports NOT_SERVING", "err", err)
			}
			hs.SetServingStatus("", status)
			hs.SetServingStatus(retrydv1.RetryService_ServiceDesc.ServiceName, status)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
