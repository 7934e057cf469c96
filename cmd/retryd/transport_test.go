package main

import (
	"context"
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// tlsFiles writes a server pair issued by ca into a fresh directory and
// returns the paths of the certificate and the key.
func tlsFiles(t *testing.T, p retrydtest.Pair) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, certFile, string(p.CertPEM))
	writeFile(t, keyFile, string(p.KeyPEM))
	return certFile, keyFile
}

func healthCheck(ctx context.Context, conn *grpc.ClientConn) (healthpb.HealthCheckResponse_ServingStatus, error) {
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return resp.GetStatus(), err
}

// TestTLS: the gRPC port speaks TLS to a client that trusts the CA, and
// refuses a plaintext client.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := retrydtest.NewCA(t, "retryd test CA")
	certFile, keyFile := tlsFiles(t, ca.Server(t, "retryd", 10))
	srv := retrydtest.Start(t, "--tls-cert", certFile, "--tls-key", keyFile)
	if !srv.TLS || srv.MTLS {
		t.Errorf("serving line: tls=%v mtls=%v, want true, false", srv.TLS, srv.MTLS)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	conn := srv.ConnTLS(t, &tls.Config{RootCAs: ca.Pool()})
	var p peer.Peer
	resp, err := retrydv1.NewRetryServiceClient(conn).FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: "s", Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"},
	}, grpc.Peer(&p))
	if err != nil || resp.GetDecision().GetSchedule() == nil {
		t.Fatalf("FailedStep over TLS: %v %v", resp, err)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || info.State.Version < tls.VersionTLS12 || info.State.PeerCertificates[0].Subject.CommonName != "retryd" {
		t.Errorf("peer auth info %#v, want TLS ≥ 1.2 with the test certificate", p.AuthInfo)
	}
	retrydtest.Verify(t, conn)

	if _, err := healthCheck(ctx, srv.Conn(t)); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext client on the TLS port: %v, want UNAVAILABLE", err)
	}
	untrusting := srv.ConnTLS(t, &tls.Config{RootCAs: retrydtest.NewCA(t, "another CA").Pool()})
	if _, err := healthCheck(ctx, untrusting); status.Code(err) != codes.Unavailable {
		t.Errorf("client not trusting the CA: %v, want UNAVAILABLE", err)
	}
	// TLS 1.1 and older are refused.
	if c, err := tls.Dial("tcp", srv.Addr, &tls.Config{RootCAs: ca.Pool(), MaxVersion: tls.VersionTLS11, NextProtos: []string{"h2"}}); err == nil {
		c.Close()
		t.Error("a TLS 1.1 handshake succeeded")
	}
}

// TestMTLS: with --tls-client-ca a client must present a certificate
// signed by that CA.
func TestMTLS(t *testing.T) {
	t.Parallel()
	serverCA, clientCA := retrydtest.NewCA(t, "server CA"), retrydtest.NewCA(t, "client CA")
	certFile, keyFile := tlsFiles(t, serverCA.Server(t, "retryd", 10))
	caFile := filepath.Join(t.TempDir(), "clients.pem")
	writeFile(t, caFile, string(clientCA.PEM))
	srv := retrydtest.Start(t, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile)
	if !srv.TLS || !srv.MTLS {
		t.Errorf("serving line: tls=%v mtls=%v, want true, true", srv.TLS, srv.MTLS)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for name, certs := range map[string][]tls.Certificate{
		"no certificate":         nil,
		"a stranger certificate": {retrydtest.NewCA(t, "stranger CA").Client(t, "agent", 7).TLSCertificate(t)},
	} {
		conn := srv.ConnTLS(t, &tls.Config{RootCAs: serverCA.Pool(), Certificates: certs})
		if _, err := healthCheck(ctx, conn); status.Code(err) != codes.Unavailable {
			t.Errorf("client with %s: %v, want UNAVAILABLE", name, err)
		}
	}
	conn := srv.ConnTLS(t, &tls.Config{RootCAs: serverCA.Pool(),
		Certificates: []tls.Certificate{clientCA.Client(t, "agent", 7).TLSCertificate(t)}})
	if st, err := healthCheck(ctx, conn); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("client with a certificate of the client CA: %v %v, want SERVING", st, err)
	}
	retrydtest.Verify(t, conn)
}

// servingSerial opens a new TLS connection and returns the serial of the
// certificate the server presents.
func servingSerial(t *testing.T, addr string, ca *retrydtest.CA) int64 {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestTLSRotation: overwriting the files with a new pair serves it to new
// connections without a restart; a broken rotation keeps the last good
// pair, and says so in the log.
func TestTLSRotation(t *testing.T) {
	t.Parallel()
	ca := retrydtest.NewCA(t, "retryd test CA")
	certFile, keyFile := tlsFiles(t, ca.Server(t, "retryd-a", 100))
	srv := retrydtest.Start(t, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-reload-interval", "100ms")
	if got := servingSerial(t, srv.Addr, ca); got != 100 {
		t.Fatalf("serial %d at start, want 100", got)
	}
	conn := srv.ConnTLS(t, &tls.Config{RootCAs: ca.Pool()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := healthCheck(ctx, conn); err != nil {
		t.Fatal(err)
	}

	// A broken rotation: the certificate file is cut short.
	writeFile(t, certFile, "-----BEGIN CERTIFICATE-----\nMIIB")
	waitFor(t, 10*time.Second, "the broken rotation to be logged", func() bool {
		return strings.Contains(srv.Logs(), "tls reload failed")
	})
	if got := servingSerial(t, srv.Addr, ca); got != 100 {
		t.Errorf("serial %d after a broken rotation, want the previous 100", got)
	}

	b := ca.Server(t, "retryd-b", 200)
	writeFile(t, keyFile, string(b.KeyPEM))
	writeFile(t, certFile, string(b.CertPEM))
	waitFor(t, 10*time.Second, "new connections to see serial 200", func() bool {
		return servingSerial(t, srv.Addr, ca) == 200
	})
	// The connection made before the rotation still works, and so does a
	// new gRPC connection.
	if _, err := healthCheck(ctx, conn); err != nil {
		t.Errorf("connection from before the rotation: %v", err)
	}
	var p peer.Peer
	fresh := srv.ConnTLS(t, &tls.Config{RootCAs: ca.Pool()})
	if _, err := healthpb.NewHealthClient(fresh).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		t.Fatal(err)
	}
	if info, ok := p.AuthInfo.(credentials.TLSInfo); !ok || info.State.PeerCertificates[0].Subject.CommonName != "retryd-b" {
		t.Errorf("new gRPC connection: peer %#v, want retryd-b", p.AuthInfo)
	}
	if !strings.Contains(srv.Logs(), "tls certificate reloaded") {
		t.Errorf("the rotation was not logged:\n%s", srv.Logs())
	}
}

func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(bound); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", bound, what)
		}
	}
}

// TestTLSRefusesBadFiles: a missing or invalid TLS file refuses the start
// with a message naming the flag and the file.
func TestTLSRefusesBadFiles(t *testing.T) {
	t.Parallel()
	bin := retrydtest.Binary(t)
	ca := retrydtest.NewCA(t, "retryd test CA")
	certFile, keyFile := tlsFiles(t, ca.Server(t, "retryd", 10))
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	writeFile(t, garbage, "not a PEM file\n")
	_, otherKey := tlsFiles(t, ca.Server(t, "other", 11))
	for _, tc := range []struct {
		name             string
		args             []string
		env              []string
		wantFlag, wantIn string
	}{
		{"missing cert", []string{"--tls-cert", missing, "--tls-key", keyFile}, nil, "tls-cert", missing},
		{"missing key", []string{"--tls-cert", certFile, "--tls-key", missing}, nil, "tls-key", missing},
		{"garbage cert", []string{"--tls-cert", garbage, "--tls-key", keyFile}, nil, "tls-cert", garbage},
		{"key of another certificate", []string{"--tls-cert", certFile, "--tls-key", otherKey}, nil, "tls-key", otherKey},
		{"missing client CA", []string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", missing}, nil, "tls-client-ca", missing},
		{"garbage client CA", []string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", garbage}, nil, "tls-client-ca", garbage},
		{"cert without key", []string{"--tls-cert", certFile}, nil, "tls-key", certFile},
		{"missing cert from env", nil, []string{"RETRYD_TLS_CERT=" + missing, "RETRYD_TLS_KEY=" + keyFile}, "tls-cert", missing},
	} {
		cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...)...)
		cmd.Env = append(os.Environ(), tc.env...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.wantFlag) || !strings.Contains(string(out), tc.wantIn) {
			t.Errorf("%s: %v %q, want a refusal naming %s and %s", tc.name, err, out, tc.wantFlag, tc.wantIn)
		}
		if strings.Contains(string(out), `msg=serving`) {
			t.Errorf("%s: served before refusing:\n%s", tc.name, out)
		}
	}
	out, err := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--unary-timeout", "0s",
		"--max-recv-msg-bytes", "1", "--max-concurrent-streams", "0", "--max-connection-age", "-1m").CombinedOutput()
	for _, flag := range []string{"unary-timeout", "max-recv-msg-bytes", "max-concurrent-streams", "max-connection-age"} {
		if err == nil || !strings.Contains(string(out), flag) {
			t.Errorf("bad limits: %v %q, want an error naming %s", err, out, flag)
		}
	}
}

// TestHealthPort: with the main port on TLS, --health-listen answers
// grpc.health.v1 in plaintext — and only that — from the same health
// server, so NOT_SERVING at shutdown shows there too.
func TestHealthPort(t *testing.T) {
	t.Parallel()
	ca := retrydtest.NewCA(t, "retryd test CA")
	certFile, keyFile := tlsFiles(t, ca.Server(t, "retryd", 10))
	srv := retrydtest.Start(t, "--tls-cert", certFile, "--tls-key", keyFile, "--health-listen", "127.0.0.1:0",
		"--shutdown-timeout", "3s")
	if srv.HealthAddr == "" || srv.HealthAddr == srv.Addr {
		t.Fatalf("health address %q (main %q)", srv.HealthAddr, srv.Addr)
	}
	if !strings.Contains(srv.Logs(), `"health_addr":"`+srv.HealthAddr+`"`) {
		t.Errorf("the serving line lacks health_addr:\n%s", srv.Logs())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	health := srv.HealthConn(t)
	for _, name := range []string{"", "retryd.v1.RetryService"} {
		resp, err := healthpb.NewHealthClient(health).Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("plaintext health %q: %v %v, want SERVING", name, resp, err)
		}
	}
	if _, err := retrydv1.NewRetryServiceClient(health).GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "s"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("RetryService on the health port: %v, want UNIMPLEMENTED", err)
	}
	tlsHealth := retrydtest.Dial(t, srv.HealthAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})))
	if _, err := healthCheck(ctx, tlsHealth); err == nil {
		t.Error("the health port answered a TLS client; it is plaintext")
	}

	// A health Watch on the main port is a stream that does not end by
	// itself, so the drain lasts --shutdown-timeout: long enough to probe
	// the health port while the server stops.
	mainWatch, err := healthpb.NewHealthClient(srv.ConnTLS(t, &tls.Config{RootCAs: ca.Pool()})).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	healthWatch, err := healthpb.NewHealthClient(health).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for port, w := range map[string]healthpb.Health_WatchClient{"main": mainWatch, "health": healthWatch} {
		if first, err := w.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("watch on the %s port: %v %v, want SERVING", port, first, err)
		}
	}
	if err := srv.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for port, w := range map[string]healthpb.Health_WatchClient{"main": mainWatch, "health": healthWatch} {
		if next, err := w.Recv(); err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("watch on the %s port after SIGTERM: %v %v, want NOT_SERVING", port, next, err)
		}
	}
	if st, err := healthCheck(ctx, health); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health port check while draining: %v %v, want NOT_SERVING", st, err)
	}
	if err := srv.Wait(15 * time.Second); err != nil {
		t.Errorf("exit: %v\n%s", err, srv.Logs())
	}
}

// TestMaxRecvMsgBytes: a message over --max-recv-msg-bytes is refused
// RESOURCE_EXHAUSTED before the service sees it; under the default limit
// the service's own 4 KiB request bound answers.
func TestMaxRecvMsgBytes(t *testing.T) {
	t.Parallel()
	small, def := retrydtest.Start(t, "--max-recv-msg-bytes", "2048"), retrydtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	failWith := func(conn *grpc.ClientConn, sessionBytes int) error {
		_, err := retrydv1.NewRetryServiceClient(conn).FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId: strings.Repeat("s", sessionBytes), Turn: 1, Step: 1, Provider: "p",
			Failure: &retrydv1.Failure{Code: "SERVER"},
		})
		return err
	}

	conn := small.Conn(t)
	if err := failWith(conn, 3000); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("3000-byte message, limit 2048: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := failWith(conn, 10); err != nil {
		t.Errorf("small message: %v", err)
	}
	retrydtest.Verify(t, conn)

	conn = def.Conn(t)
	if err := failWith(conn, 2<<20); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("2 MiB message, default limit: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := failWith(conn, 5000); status.Code(err) != codes.InvalidArgument {
		t.Errorf("5000-byte message, default limit: %v, want INVALID_ARGUMENT from the service", err)
	}
	retrydtest.Verify(t, conn)
}

// TestLimitsFromEnv: the limits are read from their environment variables
// and the server serves with them.
func TestLimitsFromEnv(t *testing.T) {
	t.Parallel()
	srv := retrydtest.StartWithEnv(t, []string{
		"RETRYD_MAX_RECV_MSG_BYTES=2048", "RETRYD_MAX_CONCURRENT_STREAMS=10", "RETRYD_KEEPALIVE_MIN_TIME=1s",
		"RETRYD_MAX_CONNECTION_IDLE=1m", "RETRYD_MAX_CONNECTION_AGE=10m", "RETRYD_MAX_CONNECTION_AGE_GRACE=5s",
		"RETRYD_UNARY_TIMEOUT=2s",
	})
	conn := srv.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := retrydv1.NewRetryServiceClient(conn).FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: strings.Repeat("s", 3000), Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"},
	})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("3000-byte message, RETRYD_MAX_RECV_MSG_BYTES=2048: %v, want RESOURCE_EXHAUSTED", err)
	}
	if st, err := healthCheck(ctx, srv.Conn(t)); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v %v", st, err)
	}
	if !strings.Contains(srv.Logs(), `"tls":false`) || !strings.Contains(srv.Logs(), `"mtls":false`) {
		t.Errorf("the serving line lacks tls=false, mtls=false:\n%s", srv.Logs())
	}
}
