package server

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/auth"
	"github.com/retryd/retryd/service"
)

// TestAuthSettings: the two auth settings come from flags or the
// environment (the flag wins), default to off and 5s, and a reload
// interval under 100ms is refused by name.
func TestAuthSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args     []string
		env      map[string]string
		file     string
		interval time.Duration
		bad      string
	}{
		{interval: 5 * time.Second},
		{args: []string{"--auth-credentials", "/etc/retryd/credentials.yaml"}, file: "/etc/retryd/credentials.yaml", interval: 5 * time.Second},
		{env: map[string]string{"RETRYD_AUTH_CREDENTIALS": "/env.yaml", "RETRYD_AUTH_RELOAD_INTERVAL": "30s"}, file: "/env.yaml", interval: 30 * time.Second},
		{args: []string{"--auth-credentials", "/flag.yaml"}, env: map[string]string{"RETRYD_AUTH_CREDENTIALS": "/env.yaml"}, file: "/flag.yaml", interval: 5 * time.Second},
		{args: []string{"--auth-reload-interval", "50ms"}, bad: "auth-reload-interval"},
		{env: map[string]string{"RETRYD_AUTH_RELOAD_INTERVAL": "0s"}, bad: "auth-reload-interval"},
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
		case tc.bad != "":
			if !errors.As(err, &fe) || fe.Field != tc.bad {
				t.Errorf("%v %v: %v, want a FieldError naming %s", tc.args, tc.env, err, tc.bad)
			}
		case err != nil:
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		case c.AuthCredentials != tc.file || c.AuthReloadInterval != tc.interval || c.AuthEnabled() != (tc.file != ""):
			t.Errorf("%v %v: file %q interval %v enabled %v", tc.args, tc.env, c.AuthCredentials, c.AuthReloadInterval, c.AuthEnabled())
		}
	}
}

// TestTenantIDBound: tenant ids are bounded like session ids, whose state
// they namespace.
func TestTenantIDBound(t *testing.T) {
	t.Parallel()
	if auth.MaxTenantIDLen != service.MaxSessionIDLen {
		t.Errorf("auth.MaxTenantIDLen = %d, service.MaxSessionIDLen = %d", auth.MaxTenantIDLen, service.MaxSessionIDLen)
	}
}

// TestSetupAuth: without a file, one WARN and no interceptors; with a bad
// file, a FieldError naming the flag and the file; with a good one, the
// interceptors and the warnings that fit the transport.
func TestSetupAuth(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	c := DefaultConfig()
	src, opts, err := setupAuth(c, log)
	if src != nil || opts != nil || err != nil {
		t.Fatalf("disabled: %v %v %v", src, opts, err)
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"AUTHENTICATION DISABLED"); n != 1 {
		t.Errorf("disabled: %d warnings, want 1:\n%s", n, logs.String())
	}

	dir := t.TempDir()
	c.AuthCredentials = filepath.Join(dir, "missing.yaml")
	var fe *FieldError
	if _, _, err := setupAuth(c, log); !errors.As(err, &fe) || fe.Field != "auth-credentials" || fe.Value != c.AuthCredentials ||
		!strings.Contains(fe.Reason, "no such file") {
		t.Errorf("missing file: %v", err)
	}

	c.AuthCredentials = filepath.Join(dir, "credentials.yaml")
	if err := os.WriteFile(c.AuthCredentials, []byte("tenants: [{id: a, clientCertificates: [{commonName: a}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	src, opts, err = setupAuth(c, log)
	if err != nil || src == nil || len(opts) != 2 {
		t.Fatalf("good file: %v %v %v", src, opts, err)
	}
	for _, want := range []string{"auth credentials loaded", "in plaintext", "without --tls-client-ca"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("good file without TLS: logs lack %q:\n%s", want, logs.String())
		}
	}
}
