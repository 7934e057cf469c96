package service

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/telemetry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Span and attribute names. retryd's own attributes live under retryd.*;
// the provider uses the semantic convention gen_ai.provider.name. The
// provider's failure code is retryd.failure.code: error.type is set only
// when the decision itself fails (to the gRPC status code the caller
// gets), so that error queries find failed operations, not every decision.
// Metrics carry the same names for the same things (docs/observability.md
// has the table): a span's attribute values are the API's enum names
// (DELEGATE_REASON_BUDGET_EXHAUSTED), a metric's their lower-case suffix
// (budget_exhausted).
const (
	instrumentationName = "github.com/retryd/retryd/service"

	spanDecide  = "retryd.decide"
	spanBackoff = "retryd.backoff"

	attrSessionID     = attribute.Key("retryd.session.id")
	attrTenantID      = attribute.Key("retryd.tenant.id")
	attrTurn          = attribute.Key("retryd.turn")
	attrStep          = attribute.Key("retryd.step")
	attrLogicalTurnID = attribute.Key("retryd.logical_turn.id")
	attrRetryID       = attribute.Key("retryd.retry.id")
	attrFailureCode   = attribute.Key("retryd.failure.code")
	attrRetryNumber   = attribute.Key("retryd.retry.number")
	attrRetryMax      = attribute.Key("retryd.retry.max")
	attrMode          = attribute.Key("retryd.mode")
	attrPolicyKey     = attribute.Key("retryd.policy.key")
	attrDelayMs       = attribute.Key("retryd.delay_ms")
	attrDelaySource   = attribute.Key("retryd.delay.source")
	attrDecision      = attribute.Key("retryd.decision")
	attrReason        = attribute.Key("retryd.delegate.reason")
	attrCancelReason  = attribute.Key("retryd.cancel.reason")
	attrLatenessMs    = attribute.Key("retryd.start.lateness_ms")
	attrProvider      = semconv.GenAIProviderNameKey
	// attrOutcome is how a logical operation ended (metrics only):
	// recovered or delegated.
	attrOutcome = attribute.Key("retryd.operation.outcome")
)

// maxProviderLabels bounds the provider label's values in metrics: the
// first providers seen keep their name, later ones are counted as "other".
const maxProviderLabels = 64

// instruments are the service's tracing and metrics.
type instruments struct {
	tracer  trace.Tracer
	enabled bool // spans are recorded: worth extracting trace contexts

	// The counters are observable: each attribute set's count is an
	// atomic that a decision adds to without a lock, and the SDK reads
	// them when it collects (see count).
	decisions     metric.Int64ObservableCounter
	attempts      metric.Int64ObservableCounter
	started       metric.Int64ObservableCounter
	cancelled     metric.Int64ObservableCounter
	operations    metric.Int64ObservableCounter
	decisionTime  metric.Float64Histogram
	startLateness metric.Float64Histogram

	mu        sync.Mutex
	backoffs  map[string]trace.Span // retry id → open backoff span
	providers map[string]struct{}
	dues      map[string]time.Time // retry id → due time, for pending retries (Observe only, without dueSource)
	// dueSource, when the store is one, answers due times instead of dues.
	dueSource store.DueSource
	// began is when the service began to follow the log: events before it
	// are replayed history (see Observe).
	began time.Time
	// counts holds the count of each attribute set of each counter the
	// service has added to (labelKey → *count), made once per set and
	// read without a lock: building and sorting a set per call costs more
	// than the measurement. Bounded like the labels are.
	counts sync.Map
	// decided caches decisionOptions' answers (decisionKey →
	// *decisionLabels), read without mu.
	decided sync.Map
}

// count is one attribute set's count of one counter. Adding to a
// synchronous counter of the metrics SDK resolves the attribute set and
// looks it up on every call, several times the cost of the rest of a
// delegation's telemetry; an atomic add is a few nanoseconds, and the SDK
// collects the same cumulative sums through the counters' callback.
type count struct {
	inst metric.Int64Observable // the counter
	opt  metric.ObserveOption   // the attribute set
	n    atomic.Int64
}

func (c *count) add() { c.n.Add(1) }

// labelKey names one attribute set of one instrument.
type labelKey struct {
	instrument          string
	decision, reason    string
	provider, mode      string
	outcome, cancelling string
}

// noSpan stands in for the decision span when tracing is off: no span is
// started, no attribute is built.
var noSpan trace.Span = tracenoop.Span{}

// newTelemetry makes the service's instruments; dues, when not nil, is the
// store answering due times (see store.DueSource).
func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider, dues store.DueSource) (*instruments, error) {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	_, noopTracer := tp.(tracenoop.TracerProvider)
	t := &instruments{
		tracer:    tp.Tracer(instrumentationName),
		enabled:   !noopTracer,
		backoffs:  make(map[string]trace.Span),
		providers: make(map[string]struct{}),
		dues:      make(map[string]time.Time),
		dueSource: dues,
	}
	m := mp.Meter(instrumentationName)
	var err error
	must := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	must(func() (e error) {
		t.attempts, e = m.Int64ObservableCounter("retryd.attempts.failed", metric.WithUnit("{attempt}"),
			metric.WithDescription("Failed model requests reported by agents (FailedStep calls that were decided)."))
		return
	})
	must(func() (e error) {
		t.decisions, e = m.Int64ObservableCounter("retryd.decisions", metric.WithUnit("{decision}"),
			metric.WithDescription("Decisions by outcome (schedule or delegate), delegate reason, provider and mode."))
		return
	})
	must(func() (e error) {
		t.started, e = m.Int64ObservableCounter("retryd.retries.started", metric.WithUnit("{retry}"),
			metric.WithDescription("Retries whose backoff ended with an agent present (Started recorded)."))
		return
	})
	must(func() (e error) {
		t.cancelled, e = m.Int64ObservableCounter("retryd.retries.cancelled", metric.WithUnit("{retry}"),
			metric.WithDescription("Retries cancelled before starting, by reason (requested, abandoned, expired)."))
		return
	})
	must(func() (e error) {
		t.operations, e = m.Int64ObservableCounter("retryd.operations", metric.WithUnit("{operation}"),
			metric.WithDescription("Logical operations that ended in retryd's hands: recovered (a step succeeded after retries) or delegated."))
		return
	})
	must(func() (e error) {
		t.decisionTime, e = m.Float64Histogram("retryd.decision.duration", metric.WithUnit("s"),
			metric.WithDescription("Time to decide one FailedStep inside retryd."),
			metric.WithExplicitBucketBoundaries(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1))
		return
	})
	must(func() (e error) {
		_, e = m.RegisterCallback(t.observeCounts, t.attempts, t.decisions, t.started, t.cancelled, t.operations)
		return
	})
	must(func() (e error) {
		t.startLateness, e = m.Float64Histogram("retryd.retry.start.lateness", metric.WithUnit("s"),
			metric.WithDescription("Actual start of a retry minus its due time."),
			metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
		return
	})
	return t, err
}

// providerLabel keeps the provider label's cardinality bounded.
func (t *instruments) providerLabel(p string) string {
	if p == "" {
		return "none"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.providers[p]; ok {
		return p
	}
	if len(t.providers) < maxProviderLabels {
		t.providers[p] = struct{}{}
		return p
	}
	return "other"
}

// countOf returns the count of k's attribute set, made once per set. The
// labels' values are bounded (the provider by providerLabel, the others
// by enums), so the map is too.
func (t *instruments) countOf(k labelKey) *count {
	if c, ok := t.counts.Load(k); ok {
		return c.(*count)
	}
	c := &count{}
	var kvs []attribute.KeyValue
	switch k.instrument {
	case "attempts":
		c.inst = t.attempts
		kvs = []attribute.KeyValue{attrProvider.String(k.provider)}
	case "decisions":
		c.inst = t.decisions
		// reason is the delegate reason of a delegation, the delay
		// source of a schedule: the attribute the span names it by.
		why := attrDelaySource.String(k.reason)
		if k.decision == "delegate" {
			why = attrReason.String(k.reason)
		}
		kvs = []attribute.KeyValue{attrDecision.String(k.decision), why,
			attrProvider.String(k.provider), attrMode.String(k.mode)}
	case "started":
		c.inst = t.started
	case "cancelled":
		c.inst = t.cancelled
		kvs = []attribute.KeyValue{attrCancelReason.String(k.cancelling)}
	case "operations":
		c.inst = t.operations
		kvs = []attribute.KeyValue{attrOutcome.String(k.outcome), attrProvider.String(k.provider)}
	default:
		panic("service: no counter " + k.instrument)
	}
	c.opt = metric.WithAttributeSet(attribute.NewSet(kvs...))
	// Two first adds of one set may race here: both keep the count stored
	// first.
	stored, _ := t.counts.LoadOrStore(k, c)
	return stored.(*count)
}

// observeCounts reports every count to its counter: the callback the SDK
// calls when it collects.
func (t *instruments) observeCounts(_ context.Context, o metric.Observer) error {
	t.counts.Range(func(_, v any) bool {
		c := v.(*count)
		o.ObserveInt64(c.inst, c.n.Load(), c.opt)
		return true
	})
	return nil
}

// decisionKey is what a decision's measurements are labelled by.
type decisionKey struct{ provider, decision, reason, mode string }

// decisionLabels are the provider label of a decision and the counts of
// its attempts and decisions.
type decisionLabels struct {
	provider            string
	attempts, decisions *count
}

// decisionCounts returns the provider label of a decision and the counts
// of its attempts and decisions. A decision like one already seen finds
// them without a lock: the cache holds only providers that keep their own
// label, so it is bounded like the labels are.
func (t *instruments) decisionCounts(provider, decision, reason, mode string) (label string, attempts, decisions *count) {
	k := decisionKey{provider, decision, reason, mode}
	if l, ok := t.decided.Load(k); ok {
		dl := l.(*decisionLabels)
		return dl.provider, dl.attempts, dl.decisions
	}
	label = t.providerLabel(provider)
	attempts = t.countOf(labelKey{instrument: "attempts", provider: label})
	decisions = t.countOf(labelKey{instrument: "decisions", decision: decision, reason: reason, provider: label, mode: mode})
	if label == provider || provider == "" {
		t.decided.Store(k, &decisionLabels{provider: label, attempts: attempts, decisions: decisions})
	}
	return label, attempts, decisions
}

// traceparent renders a span context as a W3C traceparent ("" if invalid).
func traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier.Get("traceparent")
}

// parseTraceparent is the inverse of traceparent.
func parseTraceparent(s string) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}

// callerAttempt returns the traceparent the caller sent with its request:
// the agent's failed-attempt span.
func callerAttempt(ctx context.Context) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	vals := md.Get("traceparent")
	if len(vals) == 0 {
		return ""
	}
	if sc := parseTraceparent(vals[0]); sc.IsValid() {
		return traceparent(sc)
	}
	return ""
}

// startDecision opens the decision span for a validated failure and, when
// tracing is on, a backoff span whose traceparent the store records with a
// retry this decision may schedule. With tracing off it starts nothing.
func (t *instruments) startDecision(ctx context.Context, f *engine.Failure) (context.Context, trace.Span, trace.Span) {
	if !t.enabled {
		return ctx, noSpan, nil
	}
	req := f.Request
	tenantID, sessionID := SplitSessionID(req.GetSessionId()) // stored ids carry their tenant
	ctx, span := t.tracer.Start(ctx, spanDecide, trace.WithAttributes(
		attrTenantID.String(tenantID),
		attrSessionID.String(sessionID),
		attrTurn.Int64(int64(req.GetTurn())),
		attrStep.Int64(int64(req.GetStep())),
		semconv.GenAIProviderNameKey.String(req.GetProvider()),
		attrFailureCode.String(req.GetFailure().GetCode()),
	))
	if id := req.GetLogicalTurnId(); id != "" {
		span.SetAttributes(attrLogicalTurnID.String(id))
	}
	f.AttemptTrace = callerAttempt(ctx)
	_, backoff := t.tracer.Start(ctx, spanBackoff)
	f.BackoffTrace = traceparent(backoff.SpanContext())
	return ctx, span, backoff
}

// endDecision records the outcome on the spans and metrics. The backoff
// span is kept open until the retry starts or is cancelled (see observe);
// the one opened for a failure that was not scheduled is ended marked
// telemetry.DiscardKey, so it is dropped instead of exported. With tracing
// off only the metrics are recorded.
func (t *instruments) endDecision(ctx context.Context, f engine.Failure, out engine.FailOutcome, err error,
	span, backoff trace.Span, began time.Time,
) {
	defer span.End()
	if backoff != nil && out.Scheduled == nil {
		backoff.SetAttributes(telemetry.DiscardKey.Bool(true))
		backoff.End()
	}
	if err != nil {
		if t.enabled {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(semconv.ErrorTypeKey.String(status.Code(toStatus(err)).String()))
		}
		return
	}
	t.decisionTime.Record(ctx, time.Since(began).Seconds())
	if t.enabled {
		for _, tp := range out.PreviousAttempts {
			if sc := parseTraceparent(tp); sc.IsValid() {
				span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("retryd.link", "previous_attempt")}})
			}
		}
		if sc := parseTraceparent(f.AttemptTrace); sc.IsValid() {
			span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("retryd.link", "attempt")}})
		}
	}
	d := out.Response.GetDecision()
	if s := d.GetSchedule(); s != nil {
		_, attempts, decisions := t.decisionCounts(f.Request.GetProvider(), "schedule", delaySourceLabel(s.GetDelaySource()), modeLabel(s.GetMode()))
		attempts.add()
		decisions.add()
		if !t.enabled {
			return
		}
		attrs := []attribute.KeyValue{
			attrDecision.String("schedule"),
			attrRetryID.String(s.GetRetryId()),
			attrRetryNumber.Int64(int64(s.GetRetryNumber())),
			attrMode.String(s.GetMode().String()),
			attrPolicyKey.String(s.GetPolicyKey()),
			attrDelayMs.Int64(int64(s.GetDelayMs())),
			attrDelaySource.String(s.GetDelaySource().String()),
		}
		if s.MaxRetries != nil {
			attrs = append(attrs, attrRetryMax.Int64(int64(s.GetMaxRetries())))
		}
		span.SetAttributes(attrs...)
		if backoff != nil && out.Scheduled != nil {
			tenantID, sessionID := SplitSessionID(f.Request.GetSessionId())
			backoff.SetAttributes(append(attrs[1:], attrTenantID.String(tenantID), attrSessionID.String(sessionID))...)
			t.mu.Lock()
			t.backoffs[s.GetRetryId()] = backoff
			t.mu.Unlock()
		}
		return
	}
	dg := d.GetDelegate()
	ev := out.Response.GetEvent().GetDelegated()
	provider, attempts, decisions := t.decisionCounts(f.Request.GetProvider(), "delegate", reasonLabel(dg.GetReason()), modeLabel(ev.GetMode()))
	attempts.add()
	decisions.add()
	switch dg.GetReason() {
	case retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST:
		// Not the end of the operation: the same step comes back.
	default:
		t.countOf(labelKey{instrument: "operations", outcome: "delegated", provider: provider}).add()
	}
	if !t.enabled {
		return
	}
	span.SetAttributes(attrDecision.String("delegate"), attrReason.String(dg.GetReason().String()))
	if ev.GetPolicyKey() != "" {
		span.SetAttributes(attrPolicyKey.String(ev.GetPolicyKey()), attrMode.String(ev.GetMode().String()))
	}
	if dg.GetReason() == retrydv1.DelegateReason_DELEGATE_REASON_BUDGET_EXHAUSTED {
		span.SetStatus(codes.Error, dg.GetDetail())
	}
}

// remember notes a scheduled retry's due time, unless the store knows it.
func (t *instruments) remember(sc *retrydv1.RetryScheduled) {
	if t.dueSource == nil {
		t.dues[sc.GetRetryId()] = sc.GetDueAt().AsTime()
	}
}

// dueOf returns a retry's due time and forgets the service's copy of it.
func (t *instruments) dueOf(retryID string) (time.Time, bool) {
	if t.dueSource != nil {
		return t.dueSource.Due(retryID)
	}
	due, ok := t.dues[retryID]
	delete(t.dues, retryID)
	return due, ok
}

// forget drops the service's copy of a retry's due time, if it keeps one:
// for a retry that ended without a start, whose due time no metric needs.
func (t *instruments) forget(retryID string) {
	if t.dueSource == nil {
		delete(t.dues, retryID)
	}
}

// Observe is telemetry's consumer of the event log: it turns Started and
// Cancelled events into metrics (with the start lateness: actual start
// minus due time) and the end of their backoff spans. Only the service's
// follower calls it, from one goroutine.
func (t *instruments) Observe(ctx context.Context, ev *retrydv1.Event) {
	if ev.GetTime().AsTime().Before(t.began) {
		// A durable store replays what happened before this process
		// started: learn the pending retries' due times, count nothing.
		switch k := ev.GetKind().(type) {
		case *retrydv1.Event_Scheduled:
			t.remember(k.Scheduled)
		case *retrydv1.Event_Started:
			t.forget(k.Started.GetRetryId())
		case *retrydv1.Event_Cancelled:
			t.forget(k.Cancelled.GetRetryId())
		}
		return
	}
	switch k := ev.GetKind().(type) {
	case *retrydv1.Event_Scheduled:
		t.remember(k.Scheduled)
	case *retrydv1.Event_Started:
		st := k.Started
		t.countOf(labelKey{instrument: "started"}).add()
		if due, ok := t.dueOf(st.GetRetryId()); ok {
			t.startLateness.Record(ctx, st.GetStartedAt().AsTime().Sub(due).Seconds())
		}
		span := t.takeBackoff(st.GetRetryId())
		if span == nil {
			return
		}
		at := st.GetStartedAt().AsTime()
		span.AddEvent("started", trace.WithTimestamp(at))
		span.End(trace.WithTimestamp(at))
	case *retrydv1.Event_Cancelled:
		c := k.Cancelled
		t.forget(c.GetRetryId())
		t.countOf(labelKey{instrument: "cancelled", cancelling: cancelLabel(c.GetReason())}).add()
		if span := t.takeBackoff(c.GetRetryId()); span != nil {
			at := ev.GetTime().AsTime()
			span.AddEvent("cancelled", trace.WithTimestamp(at), trace.WithAttributes(attrCancelReason.String(c.GetReason().String())))
			span.End(trace.WithTimestamp(at))
		}
	case *retrydv1.Event_Closed:
		if k.Closed.GetReason() == retrydv1.CloseReason_CLOSE_REASON_SUCCEEDED && k.Closed.GetRetries() > 0 {
			t.countOf(labelKey{instrument: "operations", outcome: "recovered",
				provider: t.providerLabel(k.Closed.GetProvider())}).add()
		}
	}
}

func (t *instruments) takeBackoff(retryID string) trace.Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	span := t.backoffs[retryID]
	delete(t.backoffs, retryID)
	return span
}

// endAll ends every open backoff span at shutdown.
func (t *instruments) endAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, span := range t.backoffs {
		span.AddEvent("shutdown")
		span.End()
		delete(t.backoffs, id)
	}
}

func modeLabel(m retrydv1.Mode) string {
	switch m {
	case retrydv1.Mode_MODE_ALWAYS:
		return "always"
	case retrydv1.Mode_MODE_SCHEDULE:
		return "schedule"
	case retrydv1.Mode_MODE_NORMAL:
		return "normal"
	}
	return "none"
}

// reasonLabels and cancelLabels are the metric labels of the enums' known
// values, indexed by value and computed once: a label per decision must
// cost neither an allocation nor a map lookup.
var (
	reasonLabels = enumLabels(retrydv1.DelegateReason_name, "DELEGATE_REASON_")
	cancelLabels = enumLabels(retrydv1.CancelReason_name, "CANCEL_REASON_")
	sourceLabels = enumLabels(retrydv1.DelaySource_name, "DELAY_SOURCE_")
)

// maxEnumLabel bounds the enum values enumLabels indexes.
const maxEnumLabel = 256

func enumLabels(names map[int32]string, prefix string) []string {
	var out []string
	for v, name := range names {
		if v < 0 || v >= maxEnumLabel {
			continue
		}
		if int(v) >= len(out) {
			out = append(out, make([]string, int(v)+1-len(out))...)
		}
		out[v] = trimPrefix(name, prefix)
	}
	return out
}

// enumLabel returns the label of v, or "" when v is not a known value.
func enumLabel(labels []string, v int32) string {
	if v >= 0 && int(v) < len(labels) {
		return labels[v]
	}
	return ""
}

// delaySourceLabel is the retryd.delay.source of a scheduled decision:
// what set its delay, the policy (backoff, schedule, tail), the
// provider's Retry-After, or a fleet rule that held the retry
// (fleet_budget, circuit_open, provider_pacing).
func delaySourceLabel(src retrydv1.DelaySource) string {
	if l := enumLabel(sourceLabels, int32(src)); l != "" {
		return l
	}
	return trimPrefix(src.String(), "DELAY_SOURCE_")
}

func reasonLabel(r retrydv1.DelegateReason) string {
	if l := enumLabel(reasonLabels, int32(r)); l != "" {
		return l
	}
	return trimPrefix(r.String(), "DELEGATE_REASON_")
}

func cancelLabel(r retrydv1.CancelReason) string {
	if l := enumLabel(cancelLabels, int32(r)); l != "" {
		return l
	}
	return trimPrefix(r.String(), "CANCEL_REASON_")
}

func trimPrefix(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}
