package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// serve serves every listener until ctx ends or a server fails, then
// shuts down (see shutdown) and returns the failure, if any. Run's
// cleanup stack then closes the store and flushes telemetry.
func (p *parts) serve(ctx context.Context) error {
	s := p.newServers()
	st := p.start(s)
	p.logServing()
	var err error
	select {
	case failed := <-s.failed:
		err = fmt.Errorf("server: serve: %w", failed)
	case <-ctx.Done():
	}
	p.shutdown(s.hs, st)
	return err
}

// servers serve the bound listeners. Each serve method serves one
// listener until its context ends, then stops its server, which closes
// the listener.
type servers struct {
	hs      *health.Server // on the main port and the health port
	main    *grpc.Server
	health  *grpc.Server // nil without a health listener
	metrics *http.Server // nil without a metrics listener

	lis, healthLis, metricsLis net.Listener
	drainTimeout               time.Duration
	log                        *slog.Logger
	// failed receives what a server that stopped serving by itself
	// returned: one error per server at most.
	failed chan error
}

// newServers makes the servers of the bound listeners. The health port
// is plaintext and serves only the main port's health server, so
// NOT_SERVING at shutdown shows on both ports.
func (p *parts) newServers() *servers {
	s := &servers{lis: p.lis, healthLis: p.healthLis, metricsLis: p.metricsLis,
		drainTimeout: p.c.ShutdownTimeout, log: p.log, failed: make(chan error, 3)}
	s.main = grpc.NewServer(p.opts...)
	retrydv1.RegisterRetryServiceServer(s.main, p.svc)
	s.hs = health.NewServer()
	s.hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.hs.SetServingStatus(retrydv1.RetryService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	reportPolicyFile(p.policySrc, s.hs)
	healthpb.RegisterHealthServer(s.main, s.hs)
	reflection.Register(s.main)
	if p.healthLis != nil {
		s.health = grpc.NewServer(limitOptions(p.c, nil)...)
		healthpb.RegisterHealthServer(s.health, s.hs)
	}
	if p.metricsLis != nil {
		s.metrics = &http.Server{Handler: p.metricsHandler(), ReadHeaderTimeout: 5 * time.Second}
	}
	return s
}

// metricsHandler serves /metrics, and with --pprof the profiles.
func (p *parts) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", p.tel.Handler)
	if p.c.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// stops are how to stop what start started; shutdown calls them in order.
type stops struct{ probing, watching, observing, main, health, metrics func() }

// start starts the store probe, the file reloads, the event log's
// observer and a server on each listener, in that order.
func (p *parts) start(s *servers) stops {
	st := stops{health: func() {}, metrics: func() {}}
	// A store whose state lives in a server of its own (Redis) is probed:
	// health reports NOT_SERVING while that server does not answer.
	st.probing = probeStore(p.store.Backend, s.hs, p.log)
	st.watching = goUntilStopped(p.watchFiles)
	st.observing = goUntilStopped(p.observe)
	p.served = true // from here on the servers close the listeners
	st.main = goUntilStopped(s.serveMain)
	if s.health != nil {
		st.health = goUntilStopped(s.serveHealth)
	}
	if s.metrics != nil {
		st.metrics = goUntilStopped(s.serveMetrics)
	}
	return st
}

// shutdown stops what start started, in this order: health reports
// NOT_SERVING, the store ends its streams, the main port drains within
// ShutdownTimeout, then the health port, the file reloads, the observer
// and the metrics port stop.
func (p *parts) shutdown(hs *health.Server, st stops) {
	p.stopping = time.Now()
	p.log.Info("shutting down", "timeout", p.c.ShutdownTimeout)
	st.probing()
	hs.Shutdown()  // NOT_SERVING: load balancers stop sending new work
	p.store.stop() // awaiters get Cancelled(shutdown); watchers end
	st.main()      // in-flight calls drain
	st.health()    // probes saw NOT_SERVING through the drain
	st.watching()
	st.observing()
	st.metrics()
}

// logServing says "serving" with the bound addresses and what serves.
func (p *parts) logServing() {
	attrs := []any{"addr", p.lis.Addr().String(), "store", p.store.kind, "tracing", p.tel.TracingEnabled,
		"named_policies", len(p.policies.Names()), "provider_policies", len(p.policies.Providers())}
	if p.store.dir != "" {
		attrs = append(attrs, "store_dir", p.store.dir)
	}
	if p.metricsLis != nil {
		attrs = append(attrs, "metrics_addr", p.metricsLis.Addr().String())
	}
	attrs = append(attrs, "metrics_pushed", p.tel.MetricsPushed)
	attrs = append(attrs, "tls", p.c.TLSEnabled(), "mtls", p.c.MTLSEnabled())
	attrs = append(attrs, "auth", p.c.AuthEnabled())
	if p.healthLis != nil {
		attrs = append(attrs, "health_addr", p.healthLis.Addr().String())
	}
	p.log.Info("serving", attrs...)
}

// watchFiles reloads the TLS files, the credentials file and the policy
// file (those in use) until ctx ends.
func (p *parts) watchFiles(ctx context.Context) {
	authWatched := watchAuth(ctx, p.creds, p.c.AuthReloadInterval)
	policiesWatched := closedChan()
	if p.policySrc != nil {
		policiesWatched = p.policySrc.watch(ctx, p.c.ConfigReloadInterval)
	}
	if p.certs != nil {
		p.certs.Watch(ctx, p.c.TLSReloadInterval)
	}
	<-authWatched
	<-policiesWatched
}

// observe follows the event log until ctx ends (Service.Observe).
func (p *parts) observe(ctx context.Context) {
	if err := p.svc.Observe(ctx); err != nil {
		p.log.Error("observing the event log", "err", err)
	}
}

// serveMain serves the RetryService, health and reflection on the main
// port until ctx ends, then drains it.
func (s *servers) serveMain(ctx context.Context) {
	serveUntil(ctx, func() error { return s.main.Serve(s.lis) }, s.drain, s.failed)
}

// serveHealth serves grpc.health.v1 on the health port until ctx ends.
func (s *servers) serveHealth(ctx context.Context) {
	serve := func() error {
		if err := s.health.Serve(s.healthLis); err != nil {
			return fmt.Errorf("health: %w", err)
		}
		return nil
	}
	serveUntil(ctx, serve, s.health.Stop, s.failed)
}

// serveMetrics serves the metrics port until ctx ends, then gives its
// requests a second to finish.
func (s *servers) serveMetrics(ctx context.Context) {
	serve := func() error {
		if err := s.metrics.Serve(s.metricsLis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics: %w", err)
		}
		return nil
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.metrics.Shutdown(sctx)
		cancel()
	}
	serveUntil(ctx, serve, stop, s.failed)
}

// drain stops the main port gracefully: calls in flight finish, and
// those still running after drainTimeout have their connections closed.
func (s *servers) drain() {
	stopped := make(chan struct{})
	go func() {
		s.main.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(s.drainTimeout):
		s.log.Warn("graceful stop timed out; closing remaining connections")
		s.main.Stop()
		<-stopped
	}
}

// serveUntil runs serve, which serves one listener, until ctx ends; then
// it calls stop and waits for serve to return. If serve returns first,
// its error goes to failed at once, so that Run shuts down; stop still
// runs when ctx ends, for the connections serve accepted.
func serveUntil(ctx context.Context, serve func() error, stop func(), failed chan<- error) {
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := serve(); err != nil {
			failed <- err
		}
	}()
	<-ctx.Done()
	stop()
	<-served
}

// goUntilStopped runs run in a goroutine with a context of its own; the
// returned stop ends that context and waits for run to return.
func goUntilStopped(run func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
