package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/server"
)

// runBinary runs the real retryd with args and env (added to the
// process's) and returns its stdout, stderr and exit status.
func runBinary(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bin := retrydtest.Binary(t) // built before the clock starts
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("retryd %q: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// TestHelp: -h, --help and help list every command on stdout and exit 0;
// help COMMAND and COMMAND --help show that command's flags.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}} {
		stdout, stderr, code := runBinary(t, nil, args...)
		if code != 0 || stderr != "" {
			t.Errorf("retryd %q: exit %d, stderr %q; want 0 and nothing", args, code, stderr)
		}
		for _, c := range commands() {
			if !strings.Contains(stdout, "\n  "+c.name+" ") {
				t.Errorf("retryd %q does not list the command %s:\n%s", args, c.name, stdout)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"help", "serve"}, []string{"usage: retryd serve", "-chain-ttl", "-store"}},
		{[]string{"serve", "--help"}, []string{"usage: retryd serve", "-listen"}},
		{[]string{"--listen", "127.0.0.1:0", "-h"}, []string{"usage: retryd serve"}},
		{[]string{"help", "verify"}, []string{"usage: retryd verify", "-server", "-tls-ca", "-token-file"}},
		{[]string{"verify", "--help"}, []string{"usage: retryd verify", "-tls-cert"}},
		{[]string{"check-config", "-h"}, []string{"usage: retryd check-config --config FILE", "-config"}},
		{[]string{"hash-token", "--help"}, []string{"usage: retryd hash-token < TOKEN", "SHA-256"}},
		{[]string{"help", "version"}, []string{"usage: retryd version"}},
	} {
		stdout, stderr, code := runBinary(t, []string{"RETRYD_CHAIN_TTL=bad"}, tc.args...) // help does not read the environment's values
		if code != 0 || stderr != "" {
			t.Errorf("retryd %q: exit %d, stderr %q; want 0 and nothing", tc.args, code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("retryd %q: stdout lacks %q:\n%s", tc.args, w, stdout)
			}
		}
	}
}

// TestVersion: version and --version print the version the binary was
// built with.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		stdout, stderr, code := runBinary(t, nil, args...)
		if want := "retryd " + server.Version + "\n"; code != 0 || stdout != want || stderr != "" {
			t.Errorf("retryd %q: exit %d, stdout %q, stderr %q; want 0 and %q", args, code, stdout, stderr, want)
		}
	}
}

// TestUsageErrors: a command line retryd cannot run exits 2 with one line
// on stderr naming what is wrong and pointing to --help, and nothing on
// stdout.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  []string
		args []string
		want []string // in the one line
	}{
		{nil, []string{"--bogus"}, []string{"-bogus", "'retryd serve --help'"}},
		{nil, []string{"serve", "--chain-ttl", "forever"}, []string{"chain-ttl", `"forever"`, "'retryd serve --help'"}},
		{nil, []string{"serve", "--chain-ttl", "10ms"}, []string{"chain-ttl", "at least 1s", "'retryd serve --help'"}},
		{[]string{"RETRYD_EVENT_LOG_SIZE=many"}, []string{"serve"}, []string{"RETRYD_EVENT_LOG_SIZE", `"many"`, "--help"}},
		{nil, []string{"serve", "extra"}, []string{`unexpected argument "extra"`, "--help"}},
		{nil, []string{"nope"}, []string{`unknown command "nope"`, "'retryd --help'"}},
		{nil, []string{"help", "nope"}, []string{`unknown command "nope"`, "'retryd --help'"}},
		{nil, []string{"check-config"}, []string{"--config is required", "'retryd check-config --help'"}},
		{nil, []string{"check-credentials", "--nope"}, []string{"-nope", "'retryd check-credentials --help'"}},
		{nil, []string{"hash-token", "secret"}, []string{"stdin", "--help"}},
		{nil, []string{"verify"}, []string{"--file or --server", "'retryd verify --help'"}},
		{nil, []string{"verify", "--server", "127.0.0.1:1", "--token-file", "/nonexistent"}, []string{"--token-file", "--help"}},
		{nil, []string{"version", "--short"}, []string{"-short", "'retryd version --help'"}},
	} {
		stdout, stderr, code := runBinary(t, tc.env, tc.args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != 2 || stdout != "" || len(lines) != 1 {
			t.Errorf("retryd %q (env %q): exit %d, stdout %q, stderr %q; want 2, nothing and one line", tc.args, tc.env, code, stdout, stderr)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(lines[0], w) {
				t.Errorf("retryd %q: %q lacks %q", tc.args, lines[0], w)
			}
		}
	}
}

// TestVerifyOverTLSWithToken: verify --server reaches a retryd that
// requires mTLS and authenticates tenants, with the client's TLS and token
// options, and reads the tenant's own event log only.
func TestVerifyOverTLSWithToken(t *testing.T) {
	t.Parallel()
	serverCA, clientCA := retrydtest.NewCA(t, "server CA"), retrydtest.NewCA(t, "client CA")
	certFile, keyFile := tlsFiles(t, serverCA.Server(t, "retryd", 10))
	dir := t.TempDir()
	serverCAFile, clientCAFile := filepath.Join(dir, "server-ca.pem"), filepath.Join(dir, "clients.pem")
	writeFile(t, serverCAFile, string(serverCA.PEM))
	writeFile(t, clientCAFile, string(clientCA.PEM))
	creds, tokenFile := filepath.Join(dir, "credentials.yaml"), filepath.Join(dir, "token")
	writeCredentials(t, creds, teamFile(nil, []string{tokenTeamB}, "    clientCertificates: [{commonName: team-a-agents}]\n", ""))
	writeFile(t, tokenFile, tokenTeamB+"\n")
	srv := retrydtest.Start(t, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", clientCAFile,
		"--auth-credentials", creds)

	teamA := clientCA.Client(t, "team-a-agents", 20)
	nobody := clientCA.Client(t, "nobody", 21)
	teamACert, teamAKey := tlsFiles(t, teamA)
	nobodyCert, nobodyKey := tlsFiles(t, nobody)
	conn := srv.ConnTLS(t, &tls.Config{RootCAs: serverCA.Pool(), Certificates: []tls.Certificate{teamA.TLSCertificate(t)}})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := retrydv1.NewRetryServiceClient(conn).FailedStep(ctx, report("openai", 1)); err != nil {
		t.Fatalf("FailedStep as team-a: %v", err)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"team-a by certificate", []string{"--tls-ca", serverCAFile, "--tls-cert", teamACert, "--tls-key", teamAKey}, 0, "1 events, 0 violations"},
		{"team-b by token", []string{"--tls-ca", serverCAFile, "--tls-cert", nobodyCert, "--tls-key", nobodyKey, "--token-file", tokenFile}, 0, "0 events, 0 violations"},
		{"no token", []string{"--tls-ca", serverCAFile, "--tls-cert", nobodyCert, "--tls-key", nobodyKey}, 1, "Unauthenticated"},
		{"untrusted server", []string{"--tls", "--tls-cert", teamACert, "--tls-key", teamAKey}, 1, "certificate"},
		{"plaintext", nil, 1, "verify:"},
		{"token without TLS", []string{"--token-file", tokenFile}, 2, "plaintext"},
	} {
		stdout, stderr, code := runBinary(t, nil, append([]string{"verify", "--server", srv.Addr}, tc.args...)...)
		if code != tc.code || !strings.Contains(stdout+stderr, tc.want) {
			t.Errorf("%s: verify exit %d, stdout %q, stderr %q; want %d and %q", tc.name, code, stdout, stderr, tc.code, tc.want)
		}
	}
}
