package main

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// startHealthServer serves grpc.health.v1 on a loopback port: "" SERVING,
// "retryd.v1.RetryService" as given. It stops at the end of the test.
func startHealthServer(t *testing.T, retryService healthpb.HealthCheckResponse_ServingStatus) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("retryd.v1.RetryService", retryService)
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis) //nolint:errcheck // Serve returns when Stop is called.
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestRun(t *testing.T) {
	t.Parallel()
	serving := startHealthServer(t, healthpb.HealthCheckResponse_SERVING)
	notServing := startHealthServer(t, healthpb.HealthCheckResponse_NOT_SERVING)

	// A port that was free a moment ago: nothing answers there.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()

	cases := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{"default service", []string{"-addr=" + serving}, exitServing, ""},
		{"both services", []string{"-addr=" + serving, "-service=", "-service=retryd.v1.RetryService"}, exitServing, ""},
		{"not serving", []string{"-addr=" + notServing, "-service=", "-service=retryd.v1.RetryService"}, exitNotServing, "NOT_SERVING"},
		{"unknown service", []string{"-addr=" + serving, "-service=nope.v1.Nope"}, exitNotServing, "SERVICE_UNKNOWN"},
		{"unreachable", []string{"-addr=" + closed, "-timeout=300ms"}, exitRPC, "no answer within 300ms"},
		{"bad timeout", []string{"-timeout=0s"}, exitUsage, "-timeout must be positive"},
		{"stray argument", []string{"-addr=" + serving, "extra"}, exitUsage, "unexpected arguments"},
		{"unknown flag", []string{"-port=1"}, exitUsage, "flag provided but not defined"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("run(%q) = %d, want %d; stderr: %s", tc.args, code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tc.wantStderr)
			}
			if tc.wantCode == exitServing && !strings.Contains(stdout.String(), "SERVING") {
				t.Errorf("stdout %q does not report SERVING", stdout.String())
			}
		})
	}
}
