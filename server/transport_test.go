package server

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestTransportSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		bad  string // the field the error must name; empty: valid
	}{
		{},
		{args: []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem"}},
		{env: map[string]string{"RETRYD_TLS_CERT": "c.pem", "RETRYD_TLS_KEY": "k.pem"}},
		{args: []string{"--tls-cert", "c.pem"}, bad: "tls-key"},
		{args: []string{"--tls-key", "k.pem"}, bad: "tls-cert"},
		{args: []string{"--tls-client-ca", "ca.pem"}, bad: "tls-client-ca"},
		{args: []string{"--tls-reload-interval", "1ms"}, bad: "tls-reload-interval"},
		{args: []string{"--health-listen", "127.0.0.1:0"}},
		{args: []string{"--health-listen", "nowhere"}, bad: "health-listen"},
		{args: []string{"--max-recv-msg-bytes", "100"}, bad: "max-recv-msg-bytes"},
		{env: map[string]string{"RETRYD_MAX_RECV_MSG_BYTES": "1073741824"}, bad: "max-recv-msg-bytes"},
		{args: []string{"--max-concurrent-streams", "0"}, bad: "max-concurrent-streams"},
		{args: []string{"--keepalive-min-time", "0s"}, bad: "keepalive-min-time"},
		{args: []string{"--max-connection-idle", "0s", "--max-connection-age", "0s", "--max-connection-age-grace", "0s"}},
		{args: []string{"--max-connection-idle", "-1s"}, bad: "max-connection-idle"},
		{args: []string{"--max-connection-age", "-1s"}, bad: "max-connection-age"},
		{args: []string{"--max-connection-age-grace", "-1s"}, bad: "max-connection-age-grace"},
		{args: []string{"--unary-timeout", "0s"}, bad: "unary-timeout"},
		{env: map[string]string{"RETRYD_UNARY_TIMEOUT": "1m"}},
		{args: []string{"--memory-limit-ratio", "1.5"}, bad: "memory-limit-ratio"},
		{args: []string{"--memory-limit-ratio", "-0.1"}, bad: "memory-limit-ratio"},
		{args: []string{"--memory-limit-ratio", "NaN"}, bad: "memory-limit-ratio"},
		{env: map[string]string{"RETRYD_MEMORY_LIMIT_RATIO": "0"}},
		{args: []string{"--memory-limit-ratio", "1"}},
	} {
		c := DefaultConfig()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		if err := ApplyEnv(fs, func(name string) string { return tc.env[name] }); err != nil {
			t.Fatal(err)
		}
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		var fe *FieldError
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		case tc.bad != "" && (!errors.As(err, &fe) || fe.Field != tc.bad):
			t.Errorf("%v %v: %v, want a FieldError naming %s", tc.args, tc.env, err, tc.bad)
		}
	}
}

// TestEveryFlagHasAnEnvName keeps RegisterFlags and EnvNames in step.
func TestEveryFlagHasAnEnvName(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs)
	fs.VisitAll(func(f *flag.Flag) {
		env, ok := EnvNames[f.Name]
		if !ok || !strings.Contains(f.Usage, env) {
			t.Errorf("flag --%s: env %q, usage %q", f.Name, env, f.Usage)
		}
	})
}

func TestUnaryTimeout(t *testing.T) {
	t.Parallel()
	t.Run("alone", func(t *testing.T) {
		t.Parallel()
		testUnaryTimeout(t, unaryTimeout(20*time.Millisecond, nil))
	})
	t.Run("observed", func(t *testing.T) {
		t.Parallel()
		var (
			mu   sync.Mutex
			seen []codes.Code
		)
		testUnaryTimeout(t, unaryTimeout(20*time.Millisecond, func(_ context.Context, method string, began time.Time, err error) {
			if method != "/test/Wait" || began.IsZero() || time.Since(began) < 0 {
				t.Errorf("observed %q began %v", method, began)
			}
			mu.Lock()
			seen = append(seen, status.Code(err))
			mu.Unlock()
		}))
		// The observer sees what the caller gets: the converted deadline.
		want := []codes.Code{codes.DeadlineExceeded, codes.DeadlineExceeded, codes.OK, codes.NotFound}
		if !slices.Equal(seen, want) {
			t.Errorf("observed %v, want %v", seen, want)
		}
	})
}

func testUnaryTimeout(t *testing.T, intercept grpc.UnaryServerInterceptor) {
	info := &grpc.UnaryServerInfo{FullMethod: "/test/Wait"}
	waitForCtx := func(ctx context.Context, _ any) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}

	start := time.Now()
	_, err := intercept(context.Background(), nil, info, waitForCtx)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a handler waiting on its context: %v, want DEADLINE_EXCEEDED", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the bounded call took %v", took)
	}

	// A caller's shorter deadline still wins.
	parent, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err = intercept(parent, nil, info, func(ctx context.Context, _ any) (any, error) {
		if d, _ := ctx.Deadline(); d.After(time.Now().Add(10 * time.Millisecond)) {
			t.Errorf("deadline %v is later than the caller's", d)
		}
		return waitForCtx(ctx, nil)
	})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("caller's deadline: %v, want DEADLINE_EXCEEDED", err)
	}

	// A quick handler's answer and a status error pass through unchanged.
	resp, err := intercept(context.Background(), nil, info, func(context.Context, any) (any, error) { return "ok", nil })
	if resp != "ok" || err != nil {
		t.Errorf("quick handler: %v %v", resp, err)
	}
	want := status.Error(codes.NotFound, "nope")
	if _, err := intercept(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, want }); err != want {
		t.Errorf("status error: %v, want %v", err, want)
	}
}

// TestCertSourceReload: a rotation to a valid pair takes effect, a broken
// one keeps the last good pair and is logged, and unreadable or invalid
// files at start are refused naming their flag.
func TestCertSourceReload(t *testing.T) {
	t.Parallel()
	ca := retrydtest.NewCA(t, "test CA")
	a, b := ca.Server(t, "retryd-a", 100), ca.Server(t, "retryd-b", 200)
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.TLSCert, cfg.TLSKey = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	write := func(path string, b []byte) {
		t.Helper()
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	if _, err := newCertSource(cfg, log); !namesField(err, "tls-cert") || !strings.Contains(err.Error(), cfg.TLSCert) {
		t.Errorf("missing cert: %v, want an error naming tls-cert and its file", err)
	}
	write(cfg.TLSCert, a.CertPEM)
	write(cfg.TLSKey, b.KeyPEM)
	if _, err := newCertSource(cfg, log); !namesField(err, "tls-key") {
		t.Errorf("mismatched key: %v, want an error naming tls-key", err)
	}
	write(cfg.TLSKey, a.KeyPEM)
	src, err := newCertSource(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		c := src.serverConfig()
		got, err := c.GetConfigForClient(nil)
		if err != nil {
			t.Fatal(err)
		}
		return got.Certificates[0].Leaf.SerialNumber.Int64()
	}
	if got := serial(); got != 100 {
		t.Fatalf("serial %d, want 100", got)
	}
	if src.Reload() {
		t.Error("reload without a change reported a new certificate")
	}
	write(cfg.TLSCert, []byte("-----BEGIN CERTIFICATE-----\nhalf"))
	if src.Reload() || serial() != 100 {
		t.Errorf("a broken rotation replaced the certificate (serial %d)", serial())
	}
	if !strings.Contains(logs.String(), "tls reload failed") {
		t.Errorf("the broken rotation was not logged:\n%s", logs.String())
	}
	write(cfg.TLSCert, b.CertPEM)
	write(cfg.TLSKey, b.KeyPEM)
	if !src.Reload() || serial() != 200 {
		t.Errorf("rotation to serial 200: serving %d", serial())
	}

	cfg.TLSClientCA = filepath.Join(dir, "ca.pem")
	write(cfg.TLSClientCA, []byte("not pem"))
	if _, err := newCertSource(cfg, log); !namesField(err, "tls-client-ca") {
		t.Errorf("invalid client CA: %v, want an error naming tls-client-ca", err)
	}
}

func namesField(err error, field string) bool {
	var fe *FieldError
	return errors.As(err, &fe) && fe.Field == field
}
