package auth

import (
	"context"
	"crypto/x509"
	"log/slog"
	"strconv"
	"strings"
	"unicode/utf8"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/tenant"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of retryd's errors.
const ErrorDomain = "retryd.dev"

// The google.rpc.ErrorInfo reasons of a PERMISSION_DENIED from the
// allow-lists. The ErrorInfo's metadata names the tenant and the refused
// provider or policy_name.
const (
	ReasonProviderNotAllowed = "PROVIDER_NOT_ALLOWED"
	ReasonPolicyNotAllowed   = "POLICY_NOT_ALLOWED"
)

// The messages of UNAUTHENTICATED. A wrong token, a malformed header, a
// certificate that maps to no tenant and a token and certificate naming
// different tenants all get the same message, so a caller cannot tell a
// well-formed guess from a badly formed one, or learn that a guessed token
// is valid by pairing it with its own certificate. None quotes what the
// caller sent.
const (
	msgMissing = `missing credentials: send "authorization: Bearer <token>" metadata, or a client certificate mapped to a tenant`
	msgInvalid = "invalid credentials"
)

// unauthenticatedServices are served without credentials: health checks
// come from kubelets and load balancers that hold none, and reflection
// describes the public API only. Every other service — the RetryService
// and any service registered later — needs credentials: the list of
// exceptions is closed, so a new service is never open by mistake.
var unauthenticatedServices = map[string]bool{
	healthpb.Health_ServiceDesc.ServiceName:                    true,
	reflectionv1.ServerReflection_ServiceDesc.ServiceName:      true,
	reflectionv1alpha.ServerReflection_ServiceDesc.ServiceName: true,
}

// Authenticator authenticates the calls of a gRPC server against the
// credentials in force, and checks the tenant's provider and policy
// allow-lists.
type Authenticator struct {
	current func() *Credentials
	log     *slog.Logger
}

// NewAuthenticator returns an Authenticator that checks each call against
// current() (a Source's Current, or fixed credentials in a test). Refused
// calls are logged at debug level, without the token.
func NewAuthenticator(current func() *Credentials, log *slog.Logger) *Authenticator {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Authenticator{current: current, log: log}
}

// UnaryServerInterceptor authenticates every unary call but health and
// reflection, puts the tenant into the context with tenant.NewContext and
// refuses requests outside its allow-lists (see Authorize) before the
// handler runs, so nothing is recorded.
func (a *Authenticator) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if exempt(info.FullMethod) {
			return handler(ctx, req)
		}
		t, err := a.authenticate(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		if err := Authorize(t, req); err != nil {
			return nil, err
		}
		return handler(tenant.NewContext(ctx, t), req)
	}
}

// StreamServerInterceptor authenticates every stream but health and
// reflection once, when it opens, and gives the handler a stream whose
// context carries the tenant. Each message the client sends is checked
// with Authorize (today's streams, AwaitRetry and WatchEvents, carry no
// provider or policy; the check is there for any that will).
func (a *Authenticator) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if exempt(info.FullMethod) {
			return handler(srv, ss)
		}
		t, err := a.authenticate(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &tenantStream{ServerStream: ss, ctx: tenant.NewContext(ss.Context(), t), tenant: t})
	}
}

// tenantStream is a server stream carrying the authenticated tenant.
type tenantStream struct {
	grpc.ServerStream
	ctx    context.Context
	tenant *tenant.Tenant
}

func (s *tenantStream) Context() context.Context { return s.ctx }

func (s *tenantStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return Authorize(s.tenant, m)
}

// exempt reports whether the method belongs to a service served without
// credentials. fullMethod is "/package.Service/Method".
func exempt(fullMethod string) bool {
	svc, _, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	return ok && unauthenticatedServices[svc]
}

// Authenticate returns the tenant ctx's credentials authenticate as, or
// an UNAUTHENTICATED status. Credentials are a bearer token in the
// "authorization" metadata (scheme "Bearer", any case) and, on an mTLS
// connection, the verified client certificate:
//
//   - a token must match a stored hash, else the call is refused (a bad
//     token is never ignored in favour of the certificate);
//   - a certificate counts when one of its identities is in the file
//     (TenantForCertificate); one mapped to no tenant is ignored, so mTLS
//     can protect the transport while tokens name the tenant;
//   - a token and a certificate naming different tenants are refused;
//   - neither is refused.
func (a *Authenticator) Authenticate(ctx context.Context) (*tenant.Tenant, error) {
	return a.authenticate(ctx, "")
}

func (a *Authenticator) authenticate(ctx context.Context, method string) (*tenant.Tenant, error) {
	refuse := func(msg, reason string) (*tenant.Tenant, error) {
		attrs := []any{"method", method, "reason", reason}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			attrs = append(attrs, "peer", p.Addr.String())
		}
		a.log.Debug("call not authenticated", attrs...)
		return nil, status.Error(codes.Unauthenticated, msg)
	}
	creds := a.current()
	if creds == nil {
		return refuse(msgInvalid, "no credentials loaded")
	}
	token, hasToken, wellFormed := bearerToken(ctx)
	cert := verifiedLeaf(ctx)
	if !hasToken && cert == nil {
		return refuse(msgMissing, "no token and no client certificate")
	}
	var byToken, byCert *tenant.Tenant
	if hasToken {
		if !wellFormed {
			return refuse(msgInvalid, "malformed authorization metadata")
		}
		if byToken = creds.TenantForToken(token); byToken == nil {
			return refuse(msgInvalid, "unknown token")
		}
	}
	if cert != nil {
		var err error
		if byCert, _, err = creds.TenantForCertificate(cert); err != nil {
			return refuse(msgInvalid, err.Error())
		}
	}
	switch {
	case byToken != nil && byCert != nil && byToken.ID != byCert.ID:
		return refuse(msgInvalid, "the token and the client certificate name different tenants")
	case byToken != nil:
		return byToken, nil
	case byCert != nil:
		return byCert, nil
	default:
		return refuse(msgInvalid, "the client certificate maps to no tenant")
	}
}

// bearerToken reads the "authorization" metadata. hasToken says whether
// the metadata is there at all; wellFormed whether it is exactly one
// "Bearer <token>" value (the scheme in any case, as HTTP allows).
func bearerToken(ctx context.Context) (token string, hasToken, wellFormed bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", false, false
	}
	if len(vals) > 1 {
		return "", true, false
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "bearer") || tok == "" {
		return "", true, false
	}
	return tok, true, true
}

// verifiedLeaf returns the client certificate of an mTLS connection, as
// verified against the client CAs, or nil. Unverified peer certificates
// (TLS without --tls-client-ca never asks for one) never count.
func verifiedLeaf(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

// Authorize checks a request against t's allow-lists and returns a
// PERMISSION_DENIED status with a google.rpc.ErrorInfo when it is outside
// them: FailedStep's provider and, when the policy is selected by
// policy_name, that name; StepSucceeded's provider. Empty values are left
// to the service's validation (an empty provider is never retried, so it
// uses no provider's policy or budget); an inline policy is not a named
// policy and is not restricted. A nil t (authentication disabled) may do
// anything.
func Authorize(t *tenant.Tenant, req any) error {
	switch r := req.(type) {
	case *retrydv1.FailedStepRequest:
		if p := r.GetProvider(); p != "" && !t.AllowsProvider(p) {
			return denied(t, ReasonProviderNotAllowed, "provider", p)
		}
		if src, ok := r.GetPolicySource().(*retrydv1.FailedStepRequest_PolicyName); ok &&
			src.PolicyName != "" && !t.AllowsPolicy(src.PolicyName) {
			return denied(t, ReasonPolicyNotAllowed, "policy_name", src.PolicyName)
		}
	case *retrydv1.StepSucceededRequest:
		if p := r.GetProvider(); p != "" && !t.AllowsProvider(p) {
			return denied(t, ReasonProviderNotAllowed, "provider", p)
		}
	case *retrydv1.GetProviderStateRequest:
		if p := r.GetProvider(); p != "" && !t.AllowsProvider(p) {
			return denied(t, ReasonProviderNotAllowed, "provider", p)
		}
	}
	return nil
}

func denied(t *tenant.Tenant, reason, field, value string) error {
	value = clip(value)
	msg := "tenant " + strconv.Quote(t.ID) + " may not use " + field + " " + strconv.Quote(value)
	st, err := status.New(codes.PermissionDenied, msg).WithDetails(&errdetails.ErrorInfo{
		Reason: reason, Domain: ErrorDomain,
		Metadata: map[string]string{"tenant": t.ID, field: value},
	})
	if err != nil {
		return status.Error(codes.PermissionDenied, msg)
	}
	return st.Err()
}

// clip makes a caller's value fit for a message and a proto string:
// valid UTF-8, at most MaxTenantIDLen bytes (the service refuses longer
// ones anyway).
func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxTenantIDLen {
		return s
	}
	s = s[:MaxTenantIDLen]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
