package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/retryd/retryd/config"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// NewLogger builds the logger the configuration asks for.
func NewLogger(c Config, w io.Writer) *slog.Logger {
	level, _ := c.level()
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Run serves until ctx is done, then shuts down: health reports NOT_SERVING,
// every awaiter receives Cancelled (reason shutdown), in-flight calls drain,
// and the gRPC server stops within ShutdownTimeout. The listener is bound
// before Run logs "serving" with its address.
func Run(ctx context.Context, c Config, log *slog.Logger) error {
	if err := c.Validate(); err != nil {
		return err
	}
	policies := config.Default()
	if c.ConfigFile != "" {
		var err error
		if policies, err = config.Load(c.ConfigFile); err != nil {
			return err
		}
	}
	lis, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("server: listen: %w", err)
	}

	store := memory.New(memory.Config{
		ChainTTL:     c.ChainTTL,
		AbandonGrace: c.AbandonGrace,
		EventLogSize: c.EventLogSize,
	})
	srv := grpc.NewServer()
	retrydv1.RegisterRetryServiceServer(srv, service.New(store,
		service.WithPolicies(policies), service.WithLogger(log)))
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(retrydv1.RetryService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	log.Info("serving", "addr", lis.Addr().String(), "store", "memory",
		"named_policies", len(policies.Names()), "provider_policies", len(policies.Providers()))

	select {
	case err := <-serveErr:
		store.Close()
		return fmt.Errorf("server: serve: %w", err)
	case <-ctx.Done():
	}

	start := time.Now()
	log.Info("shutting down", "timeout", c.ShutdownTimeout)
	hs.Shutdown() // NOT_SERVING: load balancers stop sending new work
	store.Close() // awaiters get Cancelled(shutdown); watchers end
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
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond))
	return nil
}
