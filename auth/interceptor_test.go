package auth_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/auth"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/tenant"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// recorder is a RetryService that answers every call with the tenant its
// context carries, in the "x-tenant" header ("-" for none), and counts
// the calls that reached it.
type recorder struct {
	retrydv1.UnimplementedRetryServiceServer
	calls atomic.Int64
}

func (r *recorder) tell(ctx context.Context) {
	r.calls.Add(1)
	id := "-"
	if t := tenant.FromContext(ctx); t != nil {
		id = "id:" + t.ID
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-tenant", id))
}

func (r *recorder) FailedStep(ctx context.Context, _ *retrydv1.FailedStepRequest) (*retrydv1.FailedStepResponse, error) {
	r.tell(ctx)
	return &retrydv1.FailedStepResponse{}, nil
}

func (r *recorder) StepSucceeded(ctx context.Context, _ *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	r.tell(ctx)
	return &retrydv1.StepSucceededResponse{}, nil
}

func (r *recorder) GetChains(ctx context.Context, _ *retrydv1.GetChainsRequest) (*retrydv1.GetChainsResponse, error) {
	r.tell(ctx)
	return &retrydv1.GetChainsResponse{}, nil
}

func (r *recorder) WatchEvents(_ *retrydv1.WatchEventsRequest, stream retrydv1.RetryService_WatchEventsServer) error {
	r.tell(stream.Context())
	return nil
}

// testServer is a real gRPC server on a loopback port with the
// interceptors, the recorder, health and reflection.
type testServer struct {
	addr string
	rec  *recorder
}

// startServer serves on 127.0.0.1 with creds (TLS when tlsCfg is set);
// it stops at cleanup.
func startServer(t *testing.T, creds *auth.Credentials, tlsCfg *tls.Config) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := auth.NewAuthenticator(func() *auth.Credentials { return creds }, nil)
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(a.StreamServerInterceptor()),
	}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	srv := grpc.NewServer(opts...)
	rec := &recorder{}
	retrydv1.RegisterRetryServiceServer(srv, rec)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return &testServer{addr: lis.Addr().String(), rec: rec}
}

func (s *testServer) conn(t *testing.T, tlsCfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	tc := insecure.NewCredentials()
	if tlsCfg != nil {
		tc = credentials.NewTLS(tlsCfg)
	}
	return retrydtest.Dial(t, s.addr, grpc.WithTransportCredentials(tc))
}

func mustParse(t *testing.T, file string) *auth.Credentials {
	t.Helper()
	c, err := auth.Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func withAuth(ctx context.Context, values ...string) context.Context {
	for _, v := range values {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", v)
	}
	return ctx
}

// failedStep calls FailedStep and returns the tenant the handler saw
// ("" when the call did not reach it).
func failedStep(ctx context.Context, conn *grpc.ClientConn, req *retrydv1.FailedStepRequest) (string, error) {
	var hdr metadata.MD
	_, err := retrydv1.NewRetryServiceClient(conn).FailedStep(ctx, req, grpc.Header(&hdr))
	return strings.Join(hdr.Get("x-tenant"), ","), err
}

func step(provider string) *retrydv1.FailedStepRequest {
	return &retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: 1, Provider: provider,
		Failure: &retrydv1.Failure{Code: "SERVER"}}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestBearerToken: the token in "authorization: Bearer …" (any case of
// the scheme) authenticates its tenant, whom the handler finds in its
// context; a missing token says so, and every wrong or malformed one gets
// the same message, which never quotes what was sent.
func TestBearerToken(t *testing.T) {
	t.Parallel()
	srv := startServer(t, mustParse(t, exampleFile), nil)
	conn := srv.conn(t, nil)
	ctx := testCtx(t)
	const invalid = "invalid credentials"
	for _, tc := range []struct {
		name    string
		headers []string
		tenant  string
		code    codes.Code
		msg     string
	}{
		{"token A", []string{"Bearer " + tokenA}, "id:team-a", codes.OK, ""},
		{"token B", []string{"Bearer " + tokenB}, "id:team-b", codes.OK, ""},
		{"lower-case scheme", []string{"bearer " + tokenA}, "id:team-a", codes.OK, ""},
		{"upper-case scheme, two spaces", []string{"BEARER  " + tokenA}, "id:team-a", codes.OK, ""},
		{"no credentials", nil, "", codes.Unauthenticated, "missing credentials"},
		{"unknown token", []string{"Bearer " + tokenA + "x"}, "", codes.Unauthenticated, invalid},
		{"the hash instead of the token", []string{"Bearer " + hashA}, "", codes.Unauthenticated, invalid},
		{"another scheme", []string{"Basic " + tokenA}, "", codes.Unauthenticated, invalid},
		{"no scheme", []string{tokenA}, "", codes.Unauthenticated, invalid},
		{"scheme only", []string{"Bearer"}, "", codes.Unauthenticated, invalid},
		{"empty token", []string{"Bearer   "}, "", codes.Unauthenticated, invalid},
		{"empty header", []string{""}, "", codes.Unauthenticated, invalid},
		{"two headers, both valid", []string{"Bearer " + tokenA, "Bearer " + tokenA}, "", codes.Unauthenticated, invalid},
	} {
		before := srv.rec.calls.Load()
		got, err := failedStep(withAuth(ctx, tc.headers...), conn, step("")) // team-b may use no provider
		st := status.Convert(err)
		if st.Code() != tc.code || got != tc.tenant || !strings.HasPrefix(st.Message(), tc.msg) {
			t.Errorf("%s: tenant %q, %v; want %q, %v %q", tc.name, got, err, tc.tenant, tc.code, tc.msg)
		}
		if strings.Contains(st.Message(), "token-") {
			t.Errorf("%s: the message quotes the token: %q", tc.name, st.Message())
		}
		if tc.code != codes.OK && srv.rec.calls.Load() != before {
			t.Errorf("%s: a refused call reached the handler", tc.name)
		}
	}
}

// TestUnauthenticatedServices: health and reflection answer without
// credentials; every RetryService method, unary or stream, needs them.
func TestUnauthenticatedServices(t *testing.T) {
	t.Parallel()
	srv := startServer(t, mustParse(t, exampleFile), nil)
	conn := srv.conn(t, nil)
	ctx := testCtx(t)
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without credentials: %v", err)
	}
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	if resp, err := rs.Recv(); err != nil || len(resp.GetListServicesResponse().GetService()) == 0 {
		t.Errorf("reflection without credentials: %v %v", resp, err)
	}
	_ = rs.CloseSend()

	client := retrydv1.NewRetryServiceClient(conn)
	if _, err := client.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "s"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetChains without credentials: %v", err)
	}
	// A stream is refused when it opens: the first Recv carries the status.
	stream, err := client.WatchEvents(ctx, &retrydv1.WatchEventsRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("WatchEvents without credentials: %v", err)
	}
	var hdr metadata.MD
	stream, err = client.WatchEvents(withAuth(ctx, "Bearer "+tokenB), &retrydv1.WatchEventsRequest{}, grpc.Header(&hdr))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("WatchEvents with a token: %v", err)
	}
	if got := hdr.Get("x-tenant"); len(got) != 1 || got[0] != "id:team-b" {
		t.Errorf("WatchEvents handler saw tenant %q, want team-b", got)
	}
}

// TestAllowLists: a provider or policy_name outside the tenant's lists is
// PERMISSION_DENIED with an ErrorInfo, before the handler runs; what is
// not restricted passes.
func TestAllowLists(t *testing.T) {
	t.Parallel()
	srv := startServer(t, mustParse(t, exampleFile), nil)
	conn := srv.conn(t, nil)
	ctx := testCtx(t)
	client := retrydv1.NewRetryServiceClient(conn)
	a, b := withAuth(ctx, "Bearer "+tokenA), withAuth(ctx, "Bearer "+tokenB)
	named := func(provider, name string) *retrydv1.FailedStepRequest {
		r := step(provider)
		r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: name}
		return r
	}
	inline := step("openai")
	inline.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{}}
	succeeded := func(ctx context.Context, provider string) error {
		_, err := client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "s", Turn: 1, Step: 1, Provider: provider})
		return err
	}
	for _, tc := range []struct {
		name          string
		call          func() error
		reason, key   string
		value, tenant string
	}{
		{"allowed provider", func() error { _, err := failedStep(a, conn, step("deepseek")); return err }, "", "", "", ""},
		{"provider outside the list", func() error { _, err := failedStep(a, conn, step("anthropic")); return err },
			auth.ReasonProviderNotAllowed, "provider", "anthropic", "team-a"},
		{"any provider under an empty list is refused", func() error { _, err := failedStep(b, conn, step("openai")); return err },
			auth.ReasonProviderNotAllowed, "provider", "openai", "team-b"},
		{"an empty provider is left to validation", func() error { _, err := failedStep(b, conn, step("")); return err }, "", "", "", ""},
		{"allowed policy_name", func() error { _, err := failedStep(a, conn, named("openai", "interactive")); return err }, "", "", "", ""},
		{"policy_name outside the list", func() error { _, err := failedStep(a, conn, named("openai", "batch")); return err },
			auth.ReasonPolicyNotAllowed, "policy_name", "batch", "team-a"},
		{"an inline policy is not a named one", func() error { _, err := failedStep(a, conn, inline); return err }, "", "", "", ""},
		{"StepSucceeded, allowed provider", func() error { return succeeded(a, "openai") }, "", "", "", ""},
		{"StepSucceeded, provider outside the list", func() error { return succeeded(a, "anthropic") },
			auth.ReasonProviderNotAllowed, "provider", "anthropic", "team-a"},
		{"StepSucceeded without a provider", func() error { return succeeded(b, "") }, "", "", "", ""},
		{"GetProviderState, provider outside the list", func() error {
			_, err := client.GetProviderState(a, &retrydv1.GetProviderStateRequest{Provider: "anthropic"})
			return err
		}, auth.ReasonProviderNotAllowed, "provider", "anthropic", "team-a"},
		{"GetChains has nothing to check", func() error {
			_, err := client.GetChains(b, &retrydv1.GetChainsRequest{SessionId: "s"})
			return err
		}, "", "", "", ""},
	} {
		before := srv.rec.calls.Load()
		err := tc.call()
		reached := srv.rec.calls.Load() != before
		if tc.reason == "" {
			if err != nil || !reached {
				t.Errorf("%s: %v (reached the handler: %v), want success", tc.name, err, reached)
			}
			continue
		}
		st := status.Convert(err)
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		if st.Code() != codes.PermissionDenied || info.GetReason() != tc.reason || info.GetDomain() != "retryd.dev" ||
			info.GetMetadata()[tc.key] != tc.value || info.GetMetadata()["tenant"] != tc.tenant {
			t.Errorf("%s: %v %v, want PERMISSION_DENIED %s with %s=%s", tc.name, err, info, tc.reason, tc.key, tc.value)
		}
		if reached {
			t.Errorf("%s: a denied call reached the handler", tc.name)
		}
	}
}

// TestAuthorizeWithoutTenant: with authentication disabled (no tenant)
// everything is allowed, and odd values still make a valid status.
func TestAuthorizeWithoutTenant(t *testing.T) {
	t.Parallel()
	if err := auth.Authorize(nil, step("anything")); err != nil {
		t.Errorf("nil tenant: %v", err)
	}
	none := &tenant.Tenant{ID: "t", Providers: []string{}}
	err := auth.Authorize(none, step("bad\xff"+strings.Repeat("p", 1000)))
	st := status.Convert(err)
	if st.Code() != codes.PermissionDenied || len(st.Details()) != 1 || len(st.Message()) > 400 {
		t.Errorf("odd provider: %v (%d details)", err, len(st.Details()))
	}
}

// mtlsFixture is a TLS server configuration that requires client
// certificates of a client CA, and the client side of it.
type mtlsFixture struct {
	serverCA, clientCA *retrydtest.CA
	server             *tls.Config
}

func newMTLS(t *testing.T) *mtlsFixture {
	t.Helper()
	f := &mtlsFixture{serverCA: retrydtest.NewCA(t, "server CA"), clientCA: retrydtest.NewCA(t, "client CA")}
	pair := f.serverCA.Server(t, "retryd", 2)
	f.server = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair.TLSCertificate(t)},
		ClientCAs:    f.clientCA.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	return f
}

func (f *mtlsFixture) client(t *testing.T, p retrydtest.Pair) *tls.Config {
	return &tls.Config{RootCAs: f.serverCA.Pool(), Certificates: []tls.Certificate{p.TLSCertificate(t)}}
}

// TestClientCertificates: over mTLS the verified client certificate maps
// to a tenant by URI SAN, then DNS SAN, then CN; a certificate that maps
// to no tenant needs a token; a token and a certificate of different
// tenants are refused with the same message as a wrong token.
func TestClientCertificates(t *testing.T) {
	t.Parallel()
	f := newMTLS(t)
	srv := startServer(t, mustParse(t, exampleFile), f.server)
	ctx := testCtx(t)
	ca := f.clientCA
	for _, tc := range []struct {
		name   string
		pair   retrydtest.Pair
		header string
		tenant string
		code   codes.Code
		msg    string
	}{
		{"uri SAN", ca.ClientIdentity(t, 10, "x", nil, []string{"spiffe://example.org/team-a"}), "", "id:team-a", codes.OK, ""},
		{"dns SAN in another case", ca.ClientIdentity(t, 11, "x", []string{"AGENTS.team-a.internal"}, nil), "", "id:team-a", codes.OK, ""},
		{"common name", ca.Client(t, "team-a-agents", 12), "", "id:team-a", codes.OK, ""},
		{"unmapped certificate with a token", ca.Client(t, "nobody", 13), "Bearer " + tokenB, "id:team-b", codes.OK, ""},
		{"unmapped certificate alone", ca.Client(t, "nobody", 14), "", "", codes.Unauthenticated, "invalid credentials"},
		{"certificate and token of the same tenant", ca.Client(t, "team-a-agents", 15), "Bearer " + tokenA, "id:team-a", codes.OK, ""},
		{"certificate and token of different tenants", ca.Client(t, "team-a-agents", 16), "Bearer " + tokenB, "", codes.Unauthenticated, "invalid credentials"},
		{"mapped certificate with a wrong token", ca.Client(t, "team-a-agents", 17), "Bearer nope", "", codes.Unauthenticated, "invalid credentials"},
	} {
		conn := srv.conn(t, f.client(t, tc.pair))
		c := ctx
		if tc.header != "" {
			c = withAuth(ctx, tc.header)
		}
		got, err := failedStep(c, conn, step(""))
		if st := status.Convert(err); st.Code() != tc.code || got != tc.tenant || st.Message() != tc.msg && tc.msg != "" {
			t.Errorf("%s: tenant %q, %v; want %q, %v %q", tc.name, got, err, tc.tenant, tc.code, tc.msg)
		}
	}
}

// TestTLSWithoutClientCA: on a TLS port that does not ask for client
// certificates, none counts, and a token is needed.
func TestTLSWithoutClientCA(t *testing.T) {
	t.Parallel()
	f := newMTLS(t)
	serverOnly := f.server.Clone()
	serverOnly.ClientAuth, serverOnly.ClientCAs = tls.NoClientCert, nil
	srv := startServer(t, mustParse(t, exampleFile), serverOnly)
	conn := srv.conn(t, f.client(t, f.clientCA.Client(t, "team-a-agents", 20)))
	ctx := testCtx(t)
	if _, err := failedStep(ctx, conn, step("openai")); status.Code(err) != codes.Unauthenticated ||
		!strings.HasPrefix(status.Convert(err).Message(), "missing credentials") {
		t.Errorf("certificate not asked for: %v, want UNAUTHENTICATED missing credentials", err)
	}
	if got, err := failedStep(withAuth(ctx, "Bearer "+tokenA), conn, step("openai")); err != nil || got != "id:team-a" {
		t.Errorf("token over TLS: %q %v", got, err)
	}
}
