package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Bearer tokens of the tests (256 random-looking bits in hex, as
// `openssl rand -hex 32` makes them) and their hashes.
const (
	tokenTeamA = "5f0c8a1e9d2b4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a"
	tokenTeamB = "0a9b8c7d6e5f40312233445566778899aabbccddeeff00112233445566778899"
)

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// bearer sends a token with every call, over plaintext too (the tests'
// loopback connections).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// tokenConn dials the server in plaintext with token on every call.
func tokenConn(t *testing.T, srv *retrydtest.Server, token string) *grpc.ClientConn {
	t.Helper()
	return retrydtest.Dial(t, srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(token)))
}

// writeCredentials replaces the credentials file atomically (a rename), as
// a Secret update does, so a poll never reads half a file.
func writeCredentials(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// teamFile is a credentials file: team-a may use only openai; team-b
// anything. Tokens are listed only when given.
func teamFile(tokensA, tokensB []string, extraA, extraB string) string {
	var sb strings.Builder
	write := func(id string, tokens []string, extra string) {
		fmt.Fprintf(&sb, "  - id: %s\n    tokens:\n", id)
		if len(tokens) == 0 {
			sb.WriteString("      []\n")
		}
		for _, tok := range tokens {
			fmt.Fprintf(&sb, "      - sha256: %q\n", sha256Hex(tok))
		}
		sb.WriteString(extra)
	}
	sb.WriteString("tenants:\n")
	write("team-a", tokensA, "    providers: [openai]\n"+extraA)
	write("team-b", tokensB, extraB)
	return sb.String()
}

func report(provider string, step uint64) *retrydv1.FailedStepRequest {
	return &retrydv1.FailedStepRequest{SessionId: "auth", Turn: 1, Step: step, Provider: provider,
		Failure: &retrydv1.Failure{Code: "SERVER"}}
}

// TestAuthTokens: with --auth-credentials the RetryService needs a token
// (UNAUTHENTICATED without, unary and stream), health does not; a valid
// token is served; a provider outside the tenant's list is
// PERMISSION_DENIED with an ErrorInfo and records nothing.
func TestAuthTokens(t *testing.T) {
	t.Parallel()
	creds := filepath.Join(t.TempDir(), "credentials.yaml")
	writeCredentials(t, creds, teamFile([]string{tokenTeamA}, []string{tokenTeamB}, "", ""))
	srv := retrydtest.Start(t, "--auth-credentials", creds)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	anonymous := srv.Conn(t)
	if _, err := retrydv1.NewRetryServiceClient(anonymous).FailedStep(ctx, report("openai", 1)); status.Code(err) != codes.Unauthenticated {
		t.Errorf("FailedStep without a token: %v, want UNAUTHENTICATED", err)
	}
	if _, err := retrydtest.Events(ctx, anonymous, ""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("WatchEvents without a token: %v, want UNAUTHENTICATED", err)
	}
	if _, err := retrydv1.NewRetryServiceClient(tokenConn(t, srv, "wrong")).FailedStep(ctx, report("openai", 1)); status.Code(err) != codes.Unauthenticated ||
		strings.Contains(err.Error(), "wrong") {
		t.Errorf("FailedStep with a wrong token: %v, want UNAUTHENTICATED without the token", err)
	}
	if st, err := healthCheck(ctx, anonymous); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a token: %v %v, want SERVING", st, err)
	}

	a := tokenConn(t, srv, tokenTeamA)
	client := retrydv1.NewRetryServiceClient(a)
	resp, err := client.FailedStep(ctx, report("openai", 1))
	if err != nil || resp.GetDecision().GetSchedule() == nil {
		t.Fatalf("FailedStep with team-a's token: %v %v, want a schedule", resp, err)
	}
	before, err := retrydtest.Events(ctx, a, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "auth", Turn: 1, Step: 2, Provider: "deepseek"})
	st := status.Convert(err)
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if st.Code() != codes.PermissionDenied || info.GetReason() != "PROVIDER_NOT_ALLOWED" || info.GetDomain() != "retryd.dev" ||
		info.GetMetadata()["provider"] != "deepseek" || info.GetMetadata()["tenant"] != "team-a" {
		t.Errorf("StepSucceeded for a provider outside team-a's list: %v %v, want PERMISSION_DENIED PROVIDER_NOT_ALLOWED", err, info)
	}
	if after, err := retrydtest.Events(ctx, a, ""); err != nil || len(after) != len(before) {
		t.Errorf("the denied call changed the event log: %d events, then %d (%v)", len(before), len(after), err)
	}
	retrydtest.Verify(t, a)

	logs := srv.Logs()
	for _, want := range []string{`"msg":"auth credentials loaded"`, `"tenants":2`, `"auth":true`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "AUTHENTICATION DISABLED") || strings.Contains(logs, tokenTeamA) || strings.Contains(logs, sha256Hex(tokenTeamA)) {
		t.Errorf("logs say authentication is off, or show a token or hash:\n%s", logs)
	}
}

// TestAuthReload: the credentials file is read again while serving: a
// token added starts working and a token removed stops, without a
// restart; an invalid file is logged and the last good one keeps serving.
func TestAuthReload(t *testing.T) {
	t.Parallel()
	creds := filepath.Join(t.TempDir(), "credentials.yaml")
	writeCredentials(t, creds, teamFile([]string{tokenTeamA}, nil, "", ""))
	srv := retrydtest.Start(t, "--auth-credentials", creds, "--auth-reload-interval", "100ms")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := retrydv1.NewRetryServiceClient(tokenConn(t, srv, tokenTeamA))
	b := retrydv1.NewRetryServiceClient(tokenConn(t, srv, tokenTeamB))
	// StepSucceeded on a session never seen answers OK and records
	// nothing, whoever the tenant.
	succeeded := func(c retrydv1.RetryServiceClient) codes.Code {
		_, err := c.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "auth", Turn: 1, Step: 1})
		return status.Code(err)
	}
	if succeeded(a) != codes.OK || succeeded(b) != codes.Unauthenticated {
		t.Fatalf("at start: team-a %v, team-b %v; want OK, UNAUTHENTICATED", succeeded(a), succeeded(b))
	}

	writeCredentials(t, creds, teamFile(nil, []string{tokenTeamB}, "", ""))
	waitFor(t, 10*time.Second, "the added token to work", func() bool { return succeeded(b) == codes.OK })
	if got := succeeded(a); got != codes.Unauthenticated {
		t.Errorf("the removed token after the reload: %v, want UNAUTHENTICATED", got)
	}

	writeCredentials(t, creds, "tenants:\n  - id: team-b\n    tokens: [{sha256: not-a-hash}]\n")
	waitFor(t, 10*time.Second, "the invalid file to be logged", func() bool {
		return strings.Contains(srv.Logs(), "auth credentials reload failed")
	})
	if succeeded(b) != codes.OK || succeeded(a) != codes.Unauthenticated {
		t.Errorf("after an invalid file: team-b %v, team-a %v; want the previous credentials", succeeded(b), succeeded(a))
	}
	if logs := srv.Logs(); !strings.Contains(logs, "auth credentials reloaded") || !strings.Contains(logs, "tenants[0].tokens[0].sha256") {
		t.Errorf("the reloads are not logged with the bad field:\n%s", logs)
	}
}

// TestAuthMTLS: over mTLS the client certificate authenticates its tenant
// (common name → team-a, URI SAN → team-b), shown by team-a's provider
// list; a certificate mapped to no tenant needs a token, and a token of
// another tenant than the certificate's is refused.
func TestAuthMTLS(t *testing.T) {
	t.Parallel()
	serverCA, clientCA := retrydtest.NewCA(t, "server CA"), retrydtest.NewCA(t, "client CA")
	certFile, keyFile := tlsFiles(t, serverCA.Server(t, "retryd", 10))
	dir := t.TempDir()
	caFile, creds := filepath.Join(dir, "clients.pem"), filepath.Join(dir, "credentials.yaml")
	writeFile(t, caFile, string(clientCA.PEM))
	writeCredentials(t, creds, teamFile(nil, []string{tokenTeamB},
		"    clientCertificates: [{commonName: team-a-agents}]\n",
		"    clientCertificates: [{uriSAN: \"spiffe://example.org/team-b\"}]\n"))
	srv := retrydtest.Start(t, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile,
		"--auth-credentials", creds)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := func(p retrydtest.Pair, token string) retrydv1.RetryServiceClient {
		opts := []grpc.DialOption{}
		if token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
		}
		cfg := &tls.Config{RootCAs: serverCA.Pool(), Certificates: []tls.Certificate{p.TLSCertificate(t)}}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		return retrydv1.NewRetryServiceClient(retrydtest.Dial(t, srv.Addr, opts...))
	}
	teamA := conn(clientCA.Client(t, "team-a-agents", 20), "")
	teamB := conn(clientCA.ClientIdentity(t, 21, "agent", nil, []string{"spiffe://example.org/team-b"}), "")
	stranger := clientCA.Client(t, "nobody", 22)
	for _, tc := range []struct {
		name     string
		client   retrydv1.RetryServiceClient
		provider string
		want     codes.Code
	}{
		{"team-a's certificate, its provider", teamA, "openai", codes.OK},
		{"team-a's certificate, another provider", teamA, "deepseek", codes.PermissionDenied},
		{"team-b's certificate (URI SAN), any provider", teamB, "deepseek", codes.OK},
		{"an unmapped certificate alone", conn(stranger, ""), "openai", codes.Unauthenticated},
		{"an unmapped certificate with team-b's token", conn(stranger, tokenTeamB), "deepseek", codes.OK},
		{"team-a's certificate with team-b's token", conn(clientCA.Client(t, "team-a-agents", 23), tokenTeamB), "deepseek", codes.Unauthenticated},
	} {
		_, err := tc.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "mtls", Turn: 1, Step: 1, Provider: tc.provider})
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestAuthRefusesBadFiles: a missing or invalid credentials file, or a bad
// reload interval, refuses the start with a message naming the flag, the
// file and the bad field.
func TestAuthRefusesBadFiles(t *testing.T) {
	t.Parallel()
	bin := retrydtest.Binary(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	invalid := filepath.Join(dir, "invalid.yaml")
	writeFile(t, invalid, "tenants:\n  - id: team-a\n  - id: team-b\n    tokens: [{sha256: \""+tokenTeamA+"0\"}]\n")
	empty := filepath.Join(dir, "empty.yaml")
	writeFile(t, empty, "")
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"missing file", []string{"--auth-credentials", missing}, nil, []string{"auth-credentials", missing, "no such file or directory"}},
		{"invalid file", []string{"--auth-credentials", invalid}, nil, []string{"auth-credentials", invalid, "tenants[1].tokens[0].sha256"}},
		{"empty file", []string{"--auth-credentials", empty}, nil, []string{"auth-credentials", empty, "tenants: required"}},
		{"missing file from env", nil, []string{"RETRYD_AUTH_CREDENTIALS=" + missing}, []string{"auth-credentials", missing}},
		{"reload interval too short", []string{"--auth-reload-interval", "1ms"}, nil, []string{"auth-reload-interval", "1ms"}},
		{"reload interval from env", nil, []string{"RETRYD_AUTH_RELOAD_INTERVAL=soon"}, []string{"RETRYD_AUTH_RELOAD_INTERVAL"}},
	} {
		cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...)...)
		cmd.Env = append(os.Environ(), tc.env...)
		out, err := cmd.CombinedOutput()
		for _, w := range tc.want {
			if err == nil || !strings.Contains(string(out), w) {
				t.Errorf("%s: %v %q, want a refusal naming %q", tc.name, err, out, w)
			}
		}
		if strings.Contains(string(out), "msg=serving") || strings.Contains(string(out), tokenTeamA) {
			t.Errorf("%s: served, or quoted the token:\n%s", tc.name, out)
		}
	}
}

// TestAuthDisabledWarns: without a credentials file the start says once,
// at WARN, that authentication is off.
func TestAuthDisabledWarns(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	var warnings int
	for _, line := range strings.Split(srv.Logs(), "\n") {
		var rec struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Msg, "AUTHENTICATION DISABLED") {
			warnings++
			if rec.Level != "WARN" {
				t.Errorf("logged at %s, want WARN: %s", rec.Level, line)
			}
		}
	}
	if warnings != 1 || !strings.Contains(srv.Logs(), `"auth":false`) {
		t.Errorf("%d AUTHENTICATION DISABLED lines, want 1:\n%s", warnings, srv.Logs())
	}
}

// TestHashTokenAndCheckCredentials: hash-token prints what sha256sum
// prints for the token on stdin (the trailing newline of echo dropped),
// warns about short tokens and refuses a token on the command line;
// check-credentials describes a good file and names the bad field of
// another.
func TestHashTokenAndCheckCredentials(t *testing.T) {
	t.Parallel()
	bin := retrydtest.Binary(t)
	hash := func(stdin string, args ...string) (string, string, error) {
		cmd := exec.Command(bin, append([]string{"hash-token"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	for _, in := range []string{tokenTeamA, tokenTeamA + "\n"} {
		if out, errOut, err := hash(in); err != nil || out != sha256Hex(tokenTeamA)+"\n" || errOut != "" {
			t.Errorf("hash-token %q: %q %q %v", in, out, errOut, err)
		}
	}
	if out, errOut, err := hash("short\n"); err != nil || out != sha256Hex("short")+"\n" || !strings.Contains(errOut, "warning") {
		t.Errorf("hash-token of a short token: %q %q %v, want the hash and a warning", out, errOut, err)
	}
	if _, errOut, err := hash("", tokenTeamA); err == nil || strings.Contains(errOut, tokenTeamA) {
		t.Errorf("hash-token with the token as an argument: %q %v, want a refusal", errOut, err)
	}
	if _, errOut, err := hash(""); err == nil || !strings.Contains(errOut, "no token") {
		t.Errorf("hash-token with nothing on stdin: %q %v", errOut, err)
	}

	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, teamFile([]string{tokenTeamA}, []string{tokenTeamB}, "", "    clientCertificates: [{commonName: b}]\n"))
	out, err := exec.Command(bin, "check-credentials", "--auth-credentials", good).CombinedOutput()
	if err != nil {
		t.Fatalf("check-credentials good: %v\n%s", err, out)
	}
	for _, want := range []string{
		good + ": ok, 2 tenants, 2 tokens, 1 client certificate identities",
		`tenant "team-a": 1 tokens, 0 client certificates, providers [openai], policies any`,
		`tenant "team-b": 1 tokens, 1 client certificates, providers any, policies any`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check-credentials output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), sha256Hex(tokenTeamA)) {
		t.Errorf("check-credentials prints a hash:\n%s", out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "tenants:\n  - id: a\n  - id: a\n")
	out, err = exec.Command(bin, "check-credentials", "--auth-credentials", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), bad) || !strings.Contains(string(out), "tenants[1].id") {
		t.Errorf("check-credentials bad: %v %q, want a failure naming the file and tenants[1].id", err, out)
	}
}

// TestAuthTenantIsolation: through the binary, with real tokens, the same
// session id in two tenants is two sessions, and team-b cannot see,
// await or cancel team-a's session or retry: each answers exactly like an
// unknown id.
func TestAuthTenantIsolation(t *testing.T) {
	t.Parallel()
	creds := filepath.Join(t.TempDir(), "credentials.yaml")
	writeCredentials(t, creds, teamFile([]string{tokenTeamA}, []string{tokenTeamB}, "", ""))
	srv := retrydtest.Start(t, "--auth-credentials", creds)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	connA, connB := tokenConn(t, srv, tokenTeamA), tokenConn(t, srv, tokenTeamB)
	a, b := retrydv1.NewRetryServiceClient(connA), retrydv1.NewRetryServiceClient(connB)

	ra, err := a.FailedStep(ctx, report("openai", 1))
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.FailedStep(ctx, report("openai", 1))
	if err != nil {
		t.Fatal(err)
	}
	sa, sb := ra.GetDecision().GetSchedule(), rb.GetDecision().GetSchedule()
	if sa.GetRetryNumber() != 1 || sb.GetRetryNumber() != 1 || sa.GetRetryId() == sb.GetRetryId() {
		t.Fatalf("team-a %v, team-b %v: want two sessions, each at retry 1", sa, sb)
	}
	if _, err := a.FailedStep(ctx, &retrydv1.FailedStepRequest{SessionId: "only-a", Turn: 1, Step: 1, Provider: "openai",
		Failure: &retrydv1.Failure{Code: "SERVER"}}); err != nil {
		t.Fatal(err)
	}

	notFound := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.NotFound {
			t.Errorf("team-b %s: %v, want NOT_FOUND", what, err)
		}
	}
	_, err = b.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "only-a"})
	notFound("GetChains(team-a's session)", err)
	_, err = b.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: sa.GetRetryId()}})
	notFound("CancelRetries(team-a's retry)", err)
	stream, err := b.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: sa.GetRetryId()})
	if err == nil {
		_, err = stream.Recv()
	}
	notFound("AwaitRetry(team-a's retry)", err)

	// team-a's retry is untouched, and each log holds its own tenant's
	// sessions only, under the ids the tenant sent.
	chains, err := a.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "auth"})
	if err != nil || chains.GetChains()[0].GetLatest().GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		t.Errorf("team-a's retry after team-b's calls: %v %v, want pending", chains, err)
	}
	for conn, want := range map[*grpc.ClientConn]int{connA: 2, connB: 1} {
		evs, err := retrydtest.Events(ctx, conn, "")
		if err != nil {
			t.Fatal(err)
		}
		sessions := map[string]bool{}
		for _, ev := range evs {
			sessions[ev.GetSessionId()] = true
		}
		if len(sessions) != want || !sessions["auth"] {
			t.Errorf("a tenant's log shows sessions %v, want %d of its own", sessions, want)
		}
		retrydtest.Verify(t, conn)
	}
}
