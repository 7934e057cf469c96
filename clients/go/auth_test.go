package retryd_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Bearer tokens of the tests (256 random-looking bits in hex, as
// `openssl rand -hex 32` makes them).
const (
	tokenTeamA = "7c1e0f5a9b3d4e2f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9d0e1f2a3b"
	tokenTeamB = "e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170615"
)

// writeCredentials writes a credentials file: team-a (tokenTeamA) may use
// only the provider openai and the named policy interactive; team-b
// (tokenTeamB) anything. The file holds the tokens' hashes, as
// `retryd hash-token` prints them.
func writeCredentials(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "credentials.yaml")
	body := fmt.Sprintf(`tenants:
  - id: team-a
    tokens:
      - sha256: %q
    providers: [openai]
    policies: [interactive]
  - id: team-b
    tokens:
      - sha256: %q
`, tokenHash(tokenTeamA), tokenHash(tokenTeamB))
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tokenHash is the SHA-256 of token in hex, the form a credentials file
// holds and `retryd hash-token` prints. The client's module does not import
// the server's auth package, so the tests hash the token themselves.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// bearer sends a token on a raw connection (for Verify, which reads the
// event log behind the client's back), over plaintext too.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// tokenConn dials srv in plaintext with token on every call.
func tokenConn(t *testing.T, srv *retrydtest.Server, token string) *grpc.ClientConn {
	t.Helper()
	return retrydtest.Dial(t, srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(token)))
}

// newClient is retryd.New that fails the test on an error and closes the
// client at cleanup.
func newClient(t *testing.T, target string, opts ...retryd.Option) *retryd.Client {
	t.Helper()
	c, err := retryd.New(target, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBearerToken runs the token options against a server started with
// --auth-credentials: a client with a valid token is served as its
// tenant (through New and NewFromConn, the wrappers and Service alike);
// without one, or with a wrong one, it is refused UNAUTHENTICATED.
func TestBearerToken(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t, "--auth-credentials", writeCredentials(t))
	plain := srv.Conn(t)

	// served is a call that only an authenticated caller passes: the
	// unknown session is NOT_FOUND for it, UNAUTHENTICATED for anyone else.
	served := func(c *retryd.Client) error {
		_, err := c.GetChains(testContext(t), "bearer-unknown-session")
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return err
	}
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) *retryd.Client
		want   codes.Code // codes.OK: served
	}{
		{"New with WithInsecureBearerToken", func(t *testing.T) *retryd.Client {
			return newClient(t, srv.Addr, retryd.WithInsecure(), retryd.WithInsecureBearerToken(tokenTeamB))
		}, codes.OK},
		{"NewFromConn with WithInsecureBearerToken", func(t *testing.T) *retryd.Client {
			return retryd.NewFromConn(plain, retryd.WithInsecureBearerToken(tokenTeamB))
		}, codes.OK},
		{"the last token option wins", func(t *testing.T) *retryd.Client {
			return newClient(t, srv.Addr, retryd.WithInsecure(), retryd.WithInsecureBearerToken("not-a-token-of-anyone"), retryd.WithInsecureBearerToken(tokenTeamA))
		}, codes.OK},
		{"no token", func(t *testing.T) *retryd.Client {
			return newClient(t, srv.Addr, retryd.WithInsecure())
		}, codes.Unauthenticated},
		{"a wrong token", func(t *testing.T) *retryd.Client {
			return newClient(t, srv.Addr, retryd.WithInsecure(), retryd.WithInsecureBearerToken(strings.Repeat("0", 64)))
		}, codes.Unauthenticated},
		{"NewFromConn without a token", func(t *testing.T) *retryd.Client {
			return retryd.NewFromConn(plain)
		}, codes.Unauthenticated},
		// WithBearerToken never sends the token over plaintext: the call
		// fails in the client, and the server sees no token either.
		{"NewFromConn with WithBearerToken over plaintext", func(t *testing.T) *retryd.Client {
			return retryd.NewFromConn(plain, retryd.WithBearerToken(tokenTeamB))
		}, codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := served(tc.client(t)); status.Code(err) != tc.want {
				t.Errorf("GetChains = %v, want %v (NotFound for an authenticated caller)", err, tc.want)
			}
		})
	}

	// Calls through Service carry the client's token too, and the token
	// names the tenant: team-b's session is not team-a's.
	ctx := testContext(t)
	b := newClient(t, srv.Addr, retryd.WithInsecure(), retryd.WithInsecureBearerToken(tokenTeamB))
	if _, err := b.Service().FailedStep(ctx, failedStep("bearer-b", 1, 1, backoffPolicy(10_000, 2))); err != nil {
		t.Fatalf("FailedStep through Service with team-b's token: %v", err)
	}
	if _, err := b.GetChains(ctx, "bearer-b"); err != nil {
		t.Errorf("GetChains of team-b's own session: %v", err)
	}
	a := retryd.NewFromConn(plain, retryd.WithInsecureBearerToken(tokenTeamA))
	if _, err := a.Service().GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "bearer-b"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetChains of team-b's session as team-a = %v, want NotFound", err)
	}
	if _, err := b.CancelSession(ctx, "bearer-b"); err != nil {
		t.Errorf("CancelSession: %v", err)
	}
	retrydtest.Verify(t, tokenConn(t, srv, tokenTeamB))
}

// TestBearerTokenTLS: WithBearerToken needs transport security. New
// refuses it over its default plaintext transport; over TLS the token is
// sent and the tenant is served.
func TestBearerTokenTLS(t *testing.T) {
	t.Parallel()
	ca := retrydtest.NewCA(t, "retryd client test CA")
	pair := ca.Server(t, "retryd", 2)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for path, data := range map[string][]byte{cert: pair.CertPEM, key: pair.KeyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	srv := retrydtest.Start(t, "--auth-credentials", writeCredentials(t), "--tls-cert", cert, "--tls-key", key)
	if !srv.TLS {
		t.Fatal("the server does not serve TLS")
	}

	if c, err := retryd.New(srv.Addr, retryd.WithInsecure(), retryd.WithBearerToken(tokenTeamA)); err == nil {
		c.Close()
		t.Errorf("New with WithBearerToken over plaintext succeeded; want an error (the token needs TLS)")
	} else if !strings.Contains(err.Error(), "transport level security") {
		t.Errorf("New with WithBearerToken over plaintext: %v, want grpc's transport security error", err)
	}

	tlsConfig := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	c := newClient(t, srv.Addr, retryd.WithBearerToken(tokenTeamA), retryd.WithTLS(tlsConfig))
	ctx := testContext(t)
	if _, err := c.GetChains(ctx, "tls-unknown"); status.Code(err) != codes.NotFound {
		t.Errorf("GetChains over TLS with the token = %v, want NotFound (authenticated)", err)
	}
	anonymous := newClient(t, srv.Addr, retryd.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig))))
	if _, err := anonymous.GetChains(ctx, "tls-unknown"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetChains over TLS without a token = %v, want Unauthenticated", err)
	}
}

// TestBearerTokenMalformed: a token retryd could never match fails New,
// and every call of a NewFromConn client, without quoting the token.
func TestBearerTokenMalformed(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t, "--auth-credentials", writeCredentials(t))
	for _, tc := range []struct {
		name, token, want string
	}{
		{"empty", "", "empty"},
		{"trailing newline", tokenTeamA + "\n", "offset 64"},
		{"space", "secret token", "offset 6"},
		{"non-ASCII", "sécret", "offset 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, opt := range []retryd.Option{retryd.WithBearerToken(tc.token), retryd.WithInsecureBearerToken(tc.token)} {
				c, err := retryd.New(srv.Addr, retryd.WithInsecure(), opt)
				if err == nil {
					c.Close()
					t.Fatalf("New accepted the token %q", tc.token)
				}
				if !strings.Contains(err.Error(), tc.want) || (tc.token != "" && strings.Contains(err.Error(), strings.TrimSpace(tc.token))) {
					t.Errorf("New: %v, want an error mentioning %q that does not quote the token", err, tc.want)
				}
			}
			_, err := retryd.NewFromConn(srv.Conn(t), retryd.WithInsecureBearerToken(tc.token)).GetChains(testContext(t), "malformed")
			if err == nil || status.Code(err) == codes.NotFound || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("GetChains through NewFromConn: %v, want the client's refusal mentioning %q", err, tc.want)
			}
		})
	}
}

// TestNotAllowed reads the PERMISSION_DENIED refusals of a tenant's
// allow-lists: a provider outside team-a's providers (FailedStep,
// StepSucceeded, ProviderState) and a named policy outside its policies.
// Neither records anything.
func TestNotAllowed(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t, "--auth-credentials", writeCredentials(t))
	c := newClient(t, srv.Addr, retryd.WithInsecure(), retryd.WithInsecureBearerToken(tokenTeamA))
	ctx := testContext(t)

	req := failedStep("not-allowed", 1, 1, backoffPolicy(10_000, 2)) // provider anthropic
	_, err := c.Recover(ctx, req)
	for _, e := range []error{err, fmt.Errorf("agent: %w", err)} {
		if got, ok := retryd.IsProviderNotAllowed(e); !ok || got != "anthropic" {
			t.Errorf("IsProviderNotAllowed(%v) = %q, %v; want anthropic, true", e, got, ok)
		}
		if got := retryd.ErrorReason(e); got != retryd.ReasonProviderNotAllowed {
			t.Errorf("ErrorReason(%v) = %q, want %s", e, got, retryd.ReasonProviderNotAllowed)
		}
	}
	if got, ok := retryd.IsPolicyNotAllowed(err); ok {
		t.Errorf("IsPolicyNotAllowed(provider refusal) = %q, true; want false", got)
	}
	_, err = c.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "not-allowed", Turn: 1, Step: 1, Provider: "anthropic"})
	if got, ok := retryd.IsProviderNotAllowed(err); !ok || got != "anthropic" {
		t.Errorf("StepSucceeded: IsProviderNotAllowed(%v) = %q, %v; want anthropic, true", err, got, ok)
	}
	_, err = c.ProviderState(ctx, "anthropic")
	if got, ok := retryd.IsProviderNotAllowed(err); !ok || got != "anthropic" {
		t.Errorf("ProviderState: IsProviderNotAllowed(%v) = %q, %v; want anthropic, true", err, got, ok)
	}

	req.Provider = "openai"
	req.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "batch"}
	_, err = c.FailedStep(ctx, req)
	if got, ok := retryd.IsPolicyNotAllowed(err); !ok || got != "batch" {
		t.Errorf("IsPolicyNotAllowed(%v) = %q, %v; want batch, true", err, got, ok)
	}
	if got, ok := retryd.IsProviderNotAllowed(err); ok {
		t.Errorf("IsProviderNotAllowed(policy refusal) = %q, true; want false", got)
	}
	if _, err := c.GetChains(ctx, "not-allowed"); status.Code(err) != codes.NotFound {
		t.Errorf("GetChains after the refusals = %v, want NotFound (nothing recorded)", err)
	}
	for _, e := range []error{nil, fmt.Errorf("plain"), status.Error(codes.PermissionDenied, "no details")} {
		if got, ok := retryd.IsProviderNotAllowed(e); ok {
			t.Errorf("IsProviderNotAllowed(%v) = %q, true; want false", e, got)
		}
		if got, ok := retryd.IsPolicyNotAllowed(e); ok {
			t.Errorf("IsPolicyNotAllowed(%v) = %q, true; want false", e, got)
		}
	}
	retrydtest.Verify(t, tokenConn(t, srv, tokenTeamA))
}
