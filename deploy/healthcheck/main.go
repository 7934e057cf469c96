// Command retryd-healthcheck asks a gRPC server's grpc.health.v1 service
// whether it is SERVING, like grpc-health-probe, and exits 0 only if every
// named service answers SERVING.
//
// The retryd image carries it at /usr/local/bin/retryd-healthcheck so that
// the Helm chart's `helm test` pod needs no image besides retryd's own, and
// so that a container runtime without gRPC probes can use it as an exec
// probe:
//
//	retryd-healthcheck -addr=retryd:7700 -service= -service=retryd.v1.RetryService
//
// Exit codes: 0 all SERVING, 1 a service is not SERVING or unknown, 2 bad
// flags, 3 the server could not be reached or answered with an error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Exit codes of the command.
const (
	exitServing    = 0
	exitNotServing = 1
	exitUsage      = 2
	exitRPC        = 3
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// serviceList is a repeatable -service flag.
type serviceList []string

func (s *serviceList) String() string { return strings.Join(*s, ",") }

func (s *serviceList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// run checks every service and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("retryd-healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:7700", "`host:port` of the gRPC server (plaintext)")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of each health check")
	var services serviceList
	fs.Var(&services, "service", "health service `name` to check; repeatable; \"\" is the whole server (default \"\")")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "retryd-healthcheck: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "retryd-healthcheck: -timeout must be positive, got %v\n", *timeout)
		return exitUsage
	}
	if len(services) == 0 {
		services = serviceList{""}
	}

	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(stderr, "retryd-healthcheck: grpc.NewClient(%q): %v\n", *addr, err)
		return exitUsage
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	code := exitServing
	for _, service := range services {
		st, err := check(client, service, *timeout)
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "retryd-healthcheck: %s service %q: %v\n", *addr, service, err)
			code = max(code, exitRPC)
		case st != healthpb.HealthCheckResponse_SERVING:
			fmt.Fprintf(stderr, "retryd-healthcheck: %s service %q: %v\n", *addr, service, st)
			code = max(code, exitNotServing)
		default:
			fmt.Fprintf(stdout, "%s service %q: %v\n", *addr, service, st)
		}
	}
	return code
}

// check asks the server about one service. A NotFound status (the server
// does not know the service) is reported as SERVICE_UNKNOWN, not as an error.
func check(client healthpb.HealthClient, service string, timeout time.Duration) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if status.Code(err) == codes.NotFound {
		return healthpb.HealthCheckResponse_SERVICE_UNKNOWN, nil
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return healthpb.HealthCheckResponse_UNKNOWN, fmt.Errorf("Health.Check: no answer within %v: %w", timeout, err)
		}
		return healthpb.HealthCheckResponse_UNKNOWN, fmt.Errorf("Health.Check: %w", err)
	}
	return resp.GetStatus(), nil
}
