// Package service is retryd's gRPC edge: it validates requests (every bad
// field is reported with google.rpc.BadRequest and changes nothing),
// resolves which policy decides a failure, qualifies session ids with the
// caller's tenant, hands the work to the store's rules (package store),
// and converts their refusals into gRPC status codes with error details.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/retryd/retryd/admission"
	"github.com/retryd/retryd/config"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Service implements retrydv1.RetryServiceServer.
type Service struct {
	retrydv1.UnimplementedRetryServiceServer

	store *store.Store
	// policies are those of the start, which fleet protection keeps;
	// current returns those in force for the next failure.
	policies *config.Policies
	current  func() *config.Policies
	log      *slog.Logger
	now      func() time.Time
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	tel      *instruments
	// inline shares resolved inline policies between requests that send
	// the same one (most agents send one policy with every report).
	inline *policy.Cache
	// shared holds the providers and failures that sessions keep and
	// that repeat across them.
	shared *interner
	// fleets is fleet protection: per-provider budgets and circuits.
	fleets *fleets
	// limits and adm are admission control (package admission); adm is
	// nil when nothing is bounded.
	limits admission.Limits
	adm    *admission.Control
}

// Option configures a Service.
type Option interface{ apply(*Service) }

type optionFunc func(*Service)

func (f optionFunc) apply(s *Service) { f(s) }

// WithPolicies sets the server-configured policies (named and per provider).
func WithPolicies(p *config.Policies) Option {
	return optionFunc(func(s *Service) { s.policies = p })
}

// WithPolicySource makes current the source of the server-configured
// policies: each failure is decided with the policies current returns
// when it arrives, so a reloaded policy file applies to the failures
// that follow. A retry already decided keeps the policy it was decided
// with (its chain carries it). Fleet protection stays as current first
// returned it.
func WithPolicySource(current func() *config.Policies) Option {
	return optionFunc(func(s *Service) { s.current = current })
}

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(s *Service) { s.log = l })
}

// WithTracerProvider sets where decision and backoff spans go. Without it
// (or with a no-op provider) the service records no spans and extracts no
// trace contexts.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(s *Service) { s.tp = tp })
}

// WithMeterProvider sets where the service's metrics go.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(s *Service) { s.mp = mp })
}

// WithLimits turns admission control on (see admission.Limits).
// FailedStep bounds are counted from the event log by Observe, which must
// run.
func WithLimits(l admission.Limits) Option {
	return optionFunc(func(s *Service) { s.limits = l })
}

// WithClock replaces time.Now (tests).
func WithClock(now func() time.Time) Option {
	return optionFunc(func(s *Service) { s.now = now })
}

// New returns a Service over the store backend b.
func New(b store.Backend, opts ...Option) (*Service, error) {
	s := &Service{store: store.New(b), policies: config.Default(), log: slog.Default(), now: time.Now,
		inline: policy.NewCache(0), shared: newInterner()}
	for _, o := range opts {
		o.apply(s)
	}
	if s.current != nil {
		s.policies = s.current()
	} else {
		start := s.policies
		s.current = func() *config.Policies { return start }
	}
	dues, _ := b.(store.DueSource)
	tel, err := newTelemetry(s.tp, s.mp, dues)
	if err != nil {
		return nil, fmt.Errorf("service: metrics: %w", err)
	}
	s.tel = tel
	if s.adm, err = admission.New(s.limits, s.now, s.log, meterOf(s.mp)); err != nil {
		return nil, fmt.Errorf("service: admission: %w", err)
	}
	if err := checkFleetStore(s.policies, b); err != nil {
		return nil, err
	}
	s.fleets = newFleets(s.policies, s.store, s.log)
	if err := registerStoreGauges(s.mp, b); err != nil {
		return nil, fmt.Errorf("service: metrics: %w", err)
	}
	return s, nil
}

// FailedStep implements RetryService.FailedStep.
func (s *Service) FailedStep(ctx context.Context, req *retrydv1.FailedStepRequest) (*retrydv1.FailedStepResponse, error) {
	now := s.now()
	f, err := s.failure(req, now)
	if err != nil {
		return nil, err
	}
	scope := scopeOf(ctx)
	req.SessionId = scope + req.SessionId // validated: never already scoped
	held, err := s.adm.Admit(f, now)
	if err != nil {
		s.log.DebugContext(ctx, "failed step refused by admission control", "session", req.GetSessionId(), "err", err)
		return nil, toStatus(err)
	}
	tenantID, _ := SplitSessionID(scope)
	s.fleets.protect(&f, tenantID, now)
	began := time.Now()
	ctx, span, backoff := s.tel.startDecision(ctx, &f)
	out, err := s.store.FailedStep(ctx, f)
	s.adm.Decided(held, out, err)
	s.tel.endDecision(ctx, f, out, err, span, backoff, began)
	if err != nil {
		s.log.DebugContext(ctx, "failed step refused", "session", req.GetSessionId(),
			"turn", req.GetTurn(), "step", req.GetStep(), "err", err)
		return nil, toStatus(err)
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "failed step decided", "session", req.GetSessionId(), "turn", req.GetTurn(),
			"step", req.GetStep(), "provider", req.GetProvider(), "code", req.GetFailure().GetCode(),
			"decision", out.Response.GetDecision().String())
	}
	return unscoped(scope, out.Response), nil
}

// failure validates req and resolves its policy; now is when it arrived.
func (s *Service) failure(req *retrydv1.FailedStepRequest, now time.Time) (engine.Failure, error) {
	var v validator
	v.sessionID("session_id", req.GetSessionId())
	v.label("logical_turn_id", req.GetLogicalTurnId(), false)
	v.label("provider", req.GetProvider(), false)
	v.failure("failure", req.GetFailure())
	v.enum("downstream", int32(req.GetDownstream()), retrydv1.Downstream_name)
	v.enum("replay", int32(req.GetReplay()), retrydv1.Replay_name)
	if d := req.GetDeadline(); d != nil {
		if err := d.CheckValid(); err != nil {
			v.add("deadline", "not a valid timestamp: "+err.Error())
		}
	}
	var p *policy.Policy
	policies := s.current()
	switch src := req.GetPolicySource().(type) {
	case *retrydv1.FailedStepRequest_Policy:
		var err error
		if p, err = s.inline.Resolve(src.Policy); err != nil {
			v.policy("policy", err)
		}
	case *retrydv1.FailedStepRequest_PolicyName:
		named, known := policies.Named(src.PolicyName)
		switch {
		case src.PolicyName == "":
			v.add("policy_name", "must not be empty when set")
		case !v.label("policy_name", src.PolicyName, true):
			// Bounded and printable before it is quoted back.
		case known:
			p = named
		default:
			v.add("policy_name", "no policy named "+strconv.Quote(src.PolicyName)+" is configured on this server")
		}
	default:
		if req.GetProvider() != "" {
			p = policies.ForProvider(req.GetProvider())
		}
	}
	if err := v.err(); err != nil {
		return engine.Failure{}, err
	}
	if req.GetProvider() == "" {
		p = nil // no provider adapter was selected: delegate
	}
	s.shared.intern(req)
	fl := req.GetFailure()
	return engine.Failure{
		Request:    req,
		Policy:     p,
		RetryAfter: policy.ProviderRetryAfter(fl.ProviderRetryAfterMs, fl.RetryAfter, now),
	}, nil
}

// AwaitRetry implements RetryService.AwaitRetry.
func (s *Service) AwaitRetry(req *retrydv1.AwaitRetryRequest, stream retrydv1.RetryService_AwaitRetryServer) error {
	var v validator
	v.retryID("retry_id", req.GetRetryId())
	if err := v.err(); err != nil {
		return err
	}
	scope := scopeOf(stream.Context())
	leave, err := s.adm.Await(scope, req.GetRetryId())
	if err != nil {
		return toStatus(err)
	}
	defer leave()
	sessionID, err := s.locate(stream.Context(), scope, req.GetRetryId())
	if err == nil {
		err = s.store.AwaitRetry(stream.Context(), sessionID, req.GetRetryId(), func(r *retrydv1.AwaitRetryResponse) error {
			return stream.Send(unscoped(scope, r))
		})
	}
	return toStatus(notFound(err, "no retry ", req.GetRetryId()))
}

// locate returns the session of retry retryID, when it is in the caller's
// scope: a retry id is the one id a caller sends that does not carry its
// tenant, so a retry of another tenant's session is not found.
func (s *Service) locate(ctx context.Context, scope, retryID string) (string, error) {
	sessionID, err := s.store.Locate(ctx, retryID)
	if err != nil {
		return "", err
	}
	if !InScope(scope, sessionID) {
		return "", &engine.Error{Kind: engine.KindNotFound, Message: "no retry " + retryID}
	}
	return sessionID, nil
}

// CancelRetries implements RetryService.CancelRetries.
func (s *Service) CancelRetries(ctx context.Context, req *retrydv1.CancelRetriesRequest) (*retrydv1.CancelRetriesResponse, error) {
	var v validator
	var (
		resp  *retrydv1.CancelRetriesResponse
		err   error
		scope = scopeOf(ctx)
	)
	switch t := req.GetTarget().(type) {
	case *retrydv1.CancelRetriesRequest_RetryId:
		if v.retryID("retry_id", t.RetryId); v.ok() {
			var sessionID string
			if sessionID, err = s.locate(ctx, scope, t.RetryId); err == nil {
				resp, err = s.store.CancelRetry(ctx, sessionID, t.RetryId)
			}
			err = notFound(err, "no retry ", t.RetryId)
		}
	case *retrydv1.CancelRetriesRequest_SessionId:
		if v.sessionID("session_id", t.SessionId); v.ok() {
			resp, err = s.store.CancelSession(ctx, scope+t.SessionId)
			err = notFound(err, "no session ", t.SessionId)
		}
	default:
		v.add("target", "set retry_id or session_id")
	}
	if verr := v.err(); verr != nil {
		return nil, verr
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return unscoped(scope, resp), nil
}

// StepSucceeded implements RetryService.StepSucceeded.
func (s *Service) StepSucceeded(ctx context.Context, req *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	var v validator
	v.sessionID("session_id", req.GetSessionId())
	v.label("provider", req.GetProvider(), false)
	if err := v.err(); err != nil {
		return nil, err
	}
	scope := scopeOf(ctx)
	req.SessionId = scope + req.SessionId
	resp, err := s.store.StepSucceeded(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	tenantID, _ := SplitSessionID(scope)
	s.fleets.succeeded(ctx, tenantID, req.GetProvider(), s.now())
	return resp, nil
}

// GetChains implements RetryService.GetChains.
func (s *Service) GetChains(ctx context.Context, req *retrydv1.GetChainsRequest) (*retrydv1.GetChainsResponse, error) {
	var v validator
	v.sessionID("session_id", req.GetSessionId())
	if err := v.err(); err != nil {
		return nil, err
	}
	scope := scopeOf(ctx)
	resp, err := s.store.GetChains(ctx, scope+req.GetSessionId())
	if err != nil {
		return nil, toStatus(notFound(err, "no session ", req.GetSessionId()))
	}
	return unscoped(scope, resp), nil
}

// WatchEvents implements RetryService.WatchEvents.
func (s *Service) WatchEvents(req *retrydv1.WatchEventsRequest, stream retrydv1.RetryService_WatchEventsServer) error {
	var v validator
	if req.GetSessionId() != "" {
		v.sessionID("session_id", req.GetSessionId())
	}
	if err := v.err(); err != nil {
		return err
	}
	scope := scopeOf(stream.Context())
	if scope != "" && req.GetSessionId() != "" {
		req.SessionId = scope + req.SessionId
	}
	// Without a session filter the log of every session is read and the
	// caller's tenant's events are picked out of it.
	all := req.GetSessionId() == ""
	return toStatus(s.store.WatchEvents(stream.Context(), req, func(ev *retrydv1.Event) error {
		if all && !InScope(scope, ev.GetSessionId()) {
			return nil
		}
		return stream.Send(&retrydv1.WatchEventsResponse{Event: unscoped(scope, ev)})
	}))
}

// notFound replaces the message of a store's not-found error with what +
// id, the id as the caller sent it: the store's names the stored,
// tenant-qualified id. Other errors, and nil, are returned as they are
// (nothing is built on success).
func notFound(err error, what, id string) error {
	if err == nil {
		return nil
	}
	var ee *engine.Error
	if errors.As(err, &ee) && ee.Kind == engine.KindNotFound {
		return &engine.Error{Kind: engine.KindNotFound, Message: what + id}
	}
	return err
}

// errorDomain is the google.rpc.ErrorInfo domain of retryd's errors.
const errorDomain = "retryd.dev"

// toStatus converts a store error into a gRPC status at the edge.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, store.ErrShutdown):
		return status.Error(codes.Unavailable, store.ErrShutdown.Error())
	case errors.Is(err, store.ErrUnavailable):
		return status.Error(codes.Unavailable, store.ErrUnavailable.Error())
	}
	if r := (*admission.Refusal)(nil); errors.As(err, &r) {
		return refusalStatus(r)
	}
	var ee *engine.Error
	if !errors.As(err, &ee) {
		return status.Error(codes.Internal, "internal error")
	}
	var (
		code   codes.Code
		reason string
	)
	switch ee.Kind {
	case engine.KindNotFound:
		return status.Error(codes.NotFound, ee.Message)
	case engine.KindConflict:
		code, reason = codes.FailedPrecondition, "STEP_RECORD_CONFLICT"
	case engine.KindStale:
		code, reason = codes.FailedPrecondition, "STALE_STEP"
	case engine.KindPending:
		code, reason = codes.FailedPrecondition, "RETRY_PENDING"
	case engine.KindClosed:
		code, reason = codes.FailedPrecondition, "DELEGATION_CANCELLED"
	default:
		return status.Error(codes.Internal, "internal error")
	}
	info := &errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}
	if ee.RetryID != "" {
		info.Metadata = map[string]string{"retry_id": ee.RetryID}
	}
	st, derr := status.New(code, ee.Message).WithDetails(info)
	if derr != nil {
		return status.Error(code, ee.Message)
	}
	return st.Err()
}

// refusalStatus is the RESOURCE_EXHAUSTED status of a call admission
// control refused, with the bound it met (ErrorInfo, QuotaFailure) and when
// to try again (RetryInfo).
func refusalStatus(r *admission.Refusal) error {
	st, err := status.New(codes.ResourceExhausted, r.Error()).WithDetails(
		&errdetails.ErrorInfo{Reason: "LIMIT_REACHED", Domain: errorDomain,
			Metadata: map[string]string{"bound": r.Bound, "limit": strconv.Itoa(r.Limit)}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(admission.RetryDelay)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: r.Subject, Description: r.Description,
			QuotaId: r.Bound, QuotaValue: int64(r.Limit), QuotaDimensions: r.Dimensions,
		}}},
	)
	if err != nil {
		return status.Error(codes.ResourceExhausted, r.Error())
	}
	return st.Err()
}
