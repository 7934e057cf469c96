package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"time"

	"github.com/retryd/retryd"
	"github.com/retryd/retryd/auth"
	"github.com/retryd/retryd/config"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store"
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
//
// Run is two steps: build makes the parts, pushing onto one cleanup stack
// how to release each, and serve serves every listener until its context
// ends, then stops them in order. The stack runs once, on a failed start
// as after the shutdown, so each part is released once whatever happened.
func Run(ctx context.Context, c Config, log *slog.Logger, getenv func(string) string) error {
	var cl cleanups
	defer cl.run()
	p, err := build(ctx, c, log, getenv, &cl)
	if err != nil {
		return err
	}
	return p.serve(ctx)
}

// cleanups is a stack of releases: each part build makes pushes how to
// release it, and run releases them all, the newest first, once.
type cleanups struct{ fns []func() }

func (c *cleanups) push(f func()) { c.fns = append(c.fns, f) }

func (c *cleanups) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

// parts are what build makes and serve runs.
type parts struct {
	c   Config
	log *slog.Logger

	policySrc       *policySource // nil without --config
	currentPolicies func() *config.Policies
	policies        *config.Policies // in force at start
	tel             *telemetry.Telemetry
	certs           *certSource  // nil without TLS
	creds           *auth.Source // nil without authentication
	authOpts        []grpc.ServerOption
	store           *openedStore
	// lis is the main port; metricsLis and healthLis are nil unless
	// configured. Once served is set the servers own them.
	lis, metricsLis, healthLis net.Listener
	served                     bool
	svc                        *service.Service
	opts                       []grpc.ServerOption // of the main port

	stopping time.Time // when the shutdown began; zero before
}

// build validates c and makes the parts in this order: the policy file,
// telemetry, the TLS and credentials files, the store, the listeners, the
// service. Each part pushes onto cl how to release it, so that when a step
// fails, running cl releases what was made.
func build(ctx context.Context, c Config, log *slog.Logger, getenv func(string) string, cl *cleanups) (*parts, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	setMemoryLimit(ctx, c.MemoryLimitRatio, log)
	p := &parts{c: c, log: log}
	if err := p.loadPolicies(); err != nil {
		return nil, err
	}
	if err := p.setupTelemetry(ctx, getenv, cl); err != nil {
		return nil, err
	}
	if err := p.loadTransportFiles(); err != nil {
		return nil, err
	}
	if err := p.setupStore(cl); err != nil {
		return nil, err
	}
	if err := p.listen(cl); err != nil {
		return nil, err
	}
	if err := p.newService(getenv); err != nil {
		return nil, err
	}
	return p, nil
}

// loadPolicies loads the policy file (--config); without one the default
// policies decide, resolved once: every chain decided by them shares
// their one policy (and its proto), which a chain keeps until it expires.
func (p *parts) loadPolicies() error {
	def := config.Default()
	p.currentPolicies = func() *config.Policies { return def }
	if p.c.ConfigFile != "" {
		src, err := newPolicySource(p.c.ConfigFile, p.log)
		if err != nil {
			return err
		}
		p.policySrc, p.currentPolicies = src, src.Current
	}
	p.policies = p.currentPolicies()
	return nil
}

// setupTelemetry sets up tracing and metrics; the stack flushes them last,
// after the "stopped" line (the flush may wait for a collector).
func (p *parts) setupTelemetry(ctx context.Context, getenv func(string) string, cl *cleanups) error {
	tel, err := telemetry.Setup(ctx, Version, getenv)
	if err != nil {
		return err
	}
	p.tel = tel
	cl.push(p.flushTelemetry)
	cl.push(p.logStopped)
	return nil
}

func (p *parts) flushTelemetry() {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.tel.Shutdown(sctx); err != nil {
		p.log.Warn("flushing telemetry", "err", err)
	}
}

// logStopped says how long the shutdown took; a start that failed never
// began one, and says nothing.
func (p *parts) logStopped() {
	if !p.stopping.IsZero() {
		p.log.Info("stopped", "took", time.Since(p.stopping).Round(time.Millisecond))
	}
}

// loadTransportFiles loads the TLS files before anything opens: a missing
// or invalid file refuses the start, naming its flag. So does the
// credentials file (authentication on); without one, setupAuth warns that
// every caller is the default tenant.
func (p *parts) loadTransportFiles() error {
	var err error
	if p.c.TLSEnabled() {
		if p.certs, err = newCertSource(p.c, p.log); err != nil {
			return err
		}
	}
	p.creds, p.authOpts, err = setupAuth(p.c, p.log)
	return err
}

// setupStore opens the store before the listeners: a store that cannot be
// opened (unreachable, locked, another schema version) refuses the start.
func (p *parts) setupStore(cl *cleanups) error {
	redis.SetLogger(p.log) // before the store dials: go-redis' own lines go through log
	store, err := openStore(p.c, p.log)
	if err != nil {
		return err
	}
	p.store = store
	cl.push(func() { store.close(p.log) }) // on a served run, once the drain is over
	return nil
}

// listen binds the main port, then the metrics and health ports when
// configured.
func (p *parts) listen(cl *cleanups) error {
	var err error
	if p.lis, err = p.bind(cl, p.c.Listen); err != nil {
		return fmt.Errorf("server: listen: %w", err)
	}
	if p.c.MetricsListen != "" {
		if p.metricsLis, err = p.bind(cl, p.c.MetricsListen); err != nil {
			return fmt.Errorf("server: metrics listen: %w", err)
		}
	}
	if p.c.HealthListen != "" {
		if p.healthLis, err = p.bind(cl, p.c.HealthListen); err != nil {
			return fmt.Errorf("server: health listen: %w", err)
		}
	}
	return nil
}

// bind listens on addr. The stack closes the listener unless a server
// has taken it (served): a server closes its listener when it stops.
func (p *parts) bind(cl *cleanups, addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	cl.push(func() {
		if !p.served {
			lis.Close()
		}
	})
	return lis, nil
}

// newService makes the service and the options of the main port.
// Metrics are read through the /metrics endpoint or pushed
// (OTEL_METRICS_EXPORTER): with neither the service records into a
// no-op provider, which costs nothing per call.
func (p *parts) newService(getenv func(string) string) error {
	metricsRead := p.metricsLis != nil || p.tel.MetricsPushed
	var meter metric.MeterProvider = metricnoop.NewMeterProvider()
	if metricsRead {
		meter = p.tel.Meter
	}
	if p.policySrc != nil {
		if err := p.policySrc.registerMetrics(meter); err != nil {
			return fmt.Errorf("server: metrics: %w", err)
		}
	}
	svc, err := service.New(p.store.Backend, // the store itself: its gauges come from its Stats
		service.WithPolicySource(p.currentPolicies), service.WithLogger(p.log),
		service.WithTracerProvider(p.tel.Tracer), service.WithMeterProvider(meter),
		service.WithLimits(p.c.Limits()))
	if err != nil {
		return err
	}
	opts, observe, err := rpcTelemetryOptions(p.tel, metricsRead, getenv)
	if err != nil {
		return err
	}
	opts = append(opts, limitOptions(p.c, observe)...)
	opts = append(opts, grpc.ForceServerCodecV2(pooledCodec{}), grpc.NumStreamWorkers(streamWorkers()))
	if p.certs != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(p.certs.serverConfig())))
	}
	p.svc, p.opts = svc, append(opts, p.authOpts...) // the main port only: the health port needs none
	return nil
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
// stops it and frees what it holds (the database file, the connections)
// once no call can reach it. stop and release are the store's own methods.
type openedStore struct {
	store.Backend
	kind, dir string
	stop      func()
	release   func() error // nil: nothing to free
}

func (s *openedStore) close(log *slog.Logger) {
	s.stop()
	if s.release == nil {
		return
	}
	if err := s.release(); err != nil {
		log.Error("closing the store", "err", err)
	}
}

func openStore(c Config, log *slog.Logger) (*openedStore, error) {
	opts := store.Options{ChainTTL: c.ChainTTL, AbandonGrace: c.AbandonGrace, EventLogSize: c.EventLogSize, Log: log}
	mc := memory.Config{Options: opts}
	switch kind, dir := c.StoreKind(); kind {
	case StoreMemory:
		s := memory.New(mc)
		return &openedStore{Backend: s, kind: kind, stop: func() { _ = s.Close() }}, nil
	case "file":
		s, err := file.Open(dir, mc)
		if err != nil {
			return nil, fmt.Errorf("server: store: %w", err)
		}
		return &openedStore{Backend: s, kind: kind, dir: dir, stop: func() { _ = s.Store.Close() }, release: s.Close}, nil
	case "redis":
		s, err := redis.Open(context.Background(), redis.Config{URL: dir, Options: opts})
		if err != nil {
			return nil, fmt.Errorf("server: store: %w", err)
		}
		return &openedStore{Backend: s, kind: kind, stop: s.Stop, release: s.Close}, nil
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

// probeStore asks a store that implements store.Pinger every
// storeProbeInterval whether it can reach its state, and sets the health
// status of "" and of the RetryService to match: NOT_SERVING while it
// cannot (its calls fail UNAVAILABLE meanwhile), SERVING again once it
// can. It logs each change. The returned function stops the probe and
// waits for it; for other stores it does nothing.
func probeStore(b store.Backend, hs *health.Server, log *slog.Logger) (stop func()) {
	p, ok := b.(store.Pinger)
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
