// Package policy holds retryd's pure retry rules: resolving a RetryPolicy to
// its canonical form with every default filled in, and deciding whether one
// failure is retried and after which delay.
//
// Nothing here does I/O or reads a clock or a global random source: the
// caller passes the current time and a jitter source, so a test can state
// the exact delay of every decision.
package policy

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
)

// Defaults and bounds. The numbers come from the harness's built-in executor
// (normal mode) and the dsh-retry plugin (schedule mode).
const (
	DefaultNormalMaxRetries = 2
	DefaultInitialDelayMs   = 500
	DefaultMaxDelayMs       = 10_000
	DefaultMultiplier       = 2.0
	DefaultJitterRatio      = 0.1
	DefaultTailDelayMs      = 20_000
	DefaultMinAttemptMs     = 100

	// MaxDelayMs is the largest delay any policy may name (a signed 32-bit
	// millisecond timer, as in the harness's runtime).
	MaxDelayMs = math.MaxInt32
	// MaxScheduleLen bounds the schedule of a schedule-mode policy.
	MaxScheduleLen = 64
	// MaxCodes bounds the retryable codes of a policy.
	MaxCodes = 64
	// MaxCodeLen bounds the length of one failure code.
	MaxCodeLen = 64
)

// CodeAborted is never retried in any mode: cancellation stays terminal.
const CodeAborted = "ABORTED"

// DefaultNormalCodes are the codes normal mode retries when the policy names
// none.
var DefaultNormalCodes = []string{"EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT"}

// DefaultScheduleCodes are the codes schedule mode retries when the policy
// names none (the dsh-retry plugin's list).
var DefaultScheduleCodes = []string{
	"EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT",
	"PI_AI_ERROR", "AUTH", "QUOTA", "ACCOUNT_QUOTA", "ACCOUNT_TOKEN_INVALID",
	"INVALID_CREDENTIAL", "MALFORMED_RESPONSE", "HTTP_*",
}

// DefaultSchedule is schedule mode's delay list when the policy names none.
var DefaultSchedule = []uint64{2000, 5000, 5000, 5000, 10000}

// Policy is a resolved retry policy: every default filled in, validated, and
// identified by its canonical Key. A Policy is immutable once resolved.
type Policy struct {
	Mode retrydv1.Mode
	// MaxRetries is the finite budget; meaningful only when Bounded.
	MaxRetries uint32
	Bounded    bool
	// Codes is the sorted retryable code set (entries ending in * are
	// prefix rules). Empty in always mode, which retries every code.
	Codes []string

	InitialDelayMs uint64
	MaxDelayMs     uint64
	Multiplier     float64
	JitterRatio    float64
	Jitter         retrydv1.Jitter

	Schedule    []uint64
	TailDelayMs uint64

	OverCap      retrydv1.RetryAfterOverCap
	MinAttemptMs uint64

	// Key is the canonical policy key (its format is in docs/api.md).
	Key string

	exact    map[string]struct{}
	prefixes []string
	shared   *retrydv1.RetryPolicy
}

// FieldViolation is one invalid field of a request, named by its path
// relative to the policy (for example "backoff.initial_delay_ms").
type FieldViolation struct {
	Field       string
	Description string
}

// ValidationError lists every invalid field of a policy.
type ValidationError struct {
	Violations []FieldViolation
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Description
	}
	return "policy: invalid: " + strings.Join(parts, "; ")
}

type violations []FieldViolation

func (vs *violations) add(field, format string, args ...any) {
	*vs = append(*vs, FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// Resolve validates p and fills in every default. A nil p is the built-in
// default policy (normal mode).
func Resolve(p *retrydv1.RetryPolicy) (*Policy, error) {
	if p == nil {
		p = &retrydv1.RetryPolicy{}
	}
	var vs violations
	out := &Policy{Mode: p.GetMode(), OverCap: p.GetRetryAfterOverCap(), MinAttemptMs: DefaultMinAttemptMs}
	if out.Mode == retrydv1.Mode_MODE_UNSPECIFIED {
		out.Mode = retrydv1.Mode_MODE_NORMAL
	}
	if _, ok := retrydv1.Mode_name[int32(out.Mode)]; !ok {
		vs.add("mode", "unknown mode %d", int32(out.Mode))
		return nil, &ValidationError{Violations: vs}
	}
	if _, ok := retrydv1.RetryAfterOverCap_name[int32(out.OverCap)]; !ok {
		vs.add("retry_after_over_cap", "unknown value %d", int32(out.OverCap))
	}
	if p.MinAttemptMs != nil {
		if p.GetMinAttemptMs() > MaxDelayMs {
			vs.add("min_attempt_ms", "must be at most %d ms, got %d", MaxDelayMs, p.GetMinAttemptMs())
		}
		out.MinAttemptMs = p.GetMinAttemptMs()
	}

	mode := out.Mode
	switch mode {
	case retrydv1.Mode_MODE_NORMAL:
		out.Bounded, out.MaxRetries = true, DefaultNormalMaxRetries
		if p.MaxRetries != nil {
			out.MaxRetries = p.GetMaxRetries()
		}
		out.Codes = resolveCodes(&vs, p.GetRetryableCodes(), DefaultNormalCodes)
		resolveBackoff(&vs, p.GetBackoff(), out)
		if len(p.GetSchedule()) > 0 {
			vs.add("schedule", "only allowed in schedule mode")
		}
		if p.TailDelayMs != nil {
			vs.add("tail_delay_ms", "only allowed in schedule mode")
		}
		if out.OverCap == retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_UNSPECIFIED {
			out.OverCap = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_DELEGATE
		}
	case retrydv1.Mode_MODE_ALWAYS:
		if p.MaxRetries != nil {
			vs.add("max_retries", "always mode is unlimited; use normal or schedule mode for a finite budget")
		}
		if len(p.GetRetryableCodes()) > 0 {
			vs.add("retryable_codes", "always mode retries every code except ABORTED; codes are only allowed in normal and schedule modes")
		}
		resolveBackoff(&vs, p.GetBackoff(), out)
		if len(p.GetSchedule()) > 0 {
			vs.add("schedule", "only allowed in schedule mode")
		}
		if p.TailDelayMs != nil {
			vs.add("tail_delay_ms", "only allowed in schedule mode")
		}
		if out.OverCap == retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_UNSPECIFIED {
			out.OverCap = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_LOCAL
		}
	case retrydv1.Mode_MODE_SCHEDULE:
		if p.MaxRetries != nil {
			out.Bounded, out.MaxRetries = true, p.GetMaxRetries()
		}
		out.Codes = resolveCodes(&vs, p.GetRetryableCodes(), DefaultScheduleCodes)
		if p.GetBackoff() != nil {
			vs.add("backoff", "not allowed in schedule mode; use schedule and tail_delay_ms")
		}
		resolveSchedule(&vs, p, out)
		if out.OverCap == retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_UNSPECIFIED {
			out.OverCap = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_LOCAL
		}
	}
	if len(vs) > 0 {
		return nil, &ValidationError{Violations: vs}
	}
	out.index()
	out.Key = out.canonicalKey()
	out.shared = out.Proto()
	return out, nil
}

func resolveBackoff(vs *violations, b *retrydv1.Backoff, out *Policy) {
	out.InitialDelayMs, out.MaxDelayMs = DefaultInitialDelayMs, DefaultMaxDelayMs
	out.Multiplier, out.JitterRatio = DefaultMultiplier, DefaultJitterRatio
	out.Jitter = retrydv1.Jitter_JITTER_SYMMETRIC
	if b == nil {
		return
	}
	if b.InitialDelayMs != nil {
		out.InitialDelayMs = b.GetInitialDelayMs()
	}
	if b.MaxDelayMs != nil {
		out.MaxDelayMs = b.GetMaxDelayMs()
	}
	switch {
	case out.InitialDelayMs == 0:
		vs.add("backoff.initial_delay_ms", "must be greater than 0")
	case out.InitialDelayMs > MaxDelayMs:
		vs.add("backoff.initial_delay_ms", "must be at most %d ms, got %d", MaxDelayMs, out.InitialDelayMs)
	}
	switch {
	case out.MaxDelayMs > MaxDelayMs:
		vs.add("backoff.max_delay_ms", "must be at most %d ms, got %d", MaxDelayMs, out.MaxDelayMs)
	case out.MaxDelayMs < out.InitialDelayMs:
		vs.add("backoff.max_delay_ms", "must be at least initial_delay_ms (%d), got %d", out.InitialDelayMs, out.MaxDelayMs)
	}
	if b.Multiplier != nil {
		out.Multiplier = b.GetMultiplier()
		if math.IsNaN(out.Multiplier) || math.IsInf(out.Multiplier, 0) || out.Multiplier < 1 {
			vs.add("backoff.multiplier", "must be a finite number >= 1, got %v", out.Multiplier)
		}
	}
	if b.JitterRatio != nil {
		out.JitterRatio = b.GetJitterRatio()
		if math.IsNaN(out.JitterRatio) || out.JitterRatio < 0 || out.JitterRatio > 1 {
			vs.add("backoff.jitter_ratio", "must be within [0, 1], got %v", out.JitterRatio)
		}
		if out.JitterRatio == 0 {
			out.JitterRatio = 0 // -0 behaves as 0 and must give the same key
		}
	}
	switch b.GetJitter() {
	case retrydv1.Jitter_JITTER_UNSPECIFIED, retrydv1.Jitter_JITTER_SYMMETRIC:
	case retrydv1.Jitter_JITTER_FULL:
		out.Jitter = retrydv1.Jitter_JITTER_FULL
	default:
		vs.add("backoff.jitter", "unknown jitter %d", int32(b.GetJitter()))
	}
}

func resolveSchedule(vs *violations, p *retrydv1.RetryPolicy, out *Policy) {
	out.Schedule = slices.Clone(DefaultSchedule)
	if s := p.GetSchedule(); len(s) > 0 {
		if len(s) > MaxScheduleLen {
			vs.add("schedule", "at most %d entries, got %d", MaxScheduleLen, len(s))
			return
		}
		for i, d := range s {
			if d == 0 || d > MaxDelayMs {
				vs.add(fmt.Sprintf("schedule[%d]", i), "must be within [1, %d] ms, got %d", MaxDelayMs, d)
			}
		}
		out.Schedule = slices.Clone(s)
	}
	out.TailDelayMs = DefaultTailDelayMs
	if p.TailDelayMs != nil {
		out.TailDelayMs = p.GetTailDelayMs()
		if out.TailDelayMs == 0 || out.TailDelayMs > MaxDelayMs {
			vs.add("tail_delay_ms", "must be within [1, %d] ms, got %d", MaxDelayMs, out.TailDelayMs)
		}
	}
}

// ValidateCode reports why code is not a valid failure code, or "" when it
// is. Codes are upper-snake identifiers: A-Z first, then A-Z, 0-9 or _.
func ValidateCode(code string) string {
	switch {
	case code == "":
		return "must not be empty"
	case len(code) > MaxCodeLen:
		return fmt.Sprintf("must be at most %d bytes", MaxCodeLen)
	}
	for i := 0; i < len(code); i++ {
		c := code[i]
		switch {
		case c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '_'):
		default:
			return fmt.Sprintf("must be an upper-snake identifier such as RATE_LIMIT, got %q", code)
		}
	}
	return ""
}

func resolveCodes(vs *violations, codes, defaults []string) []string {
	if len(codes) == 0 {
		return slices.Sorted(slices.Values(defaults))
	}
	if len(codes) > MaxCodes {
		vs.add("retryable_codes", "at most %d codes, got %d", MaxCodes, len(codes))
		return nil
	}
	seen := make(map[string]bool, len(codes))
	for i, c := range codes {
		field := fmt.Sprintf("retryable_codes[%d]", i)
		if c == "*" {
			vs.add(field, "a bare * would retry every failure; name the codes or use a prefix rule such as HTTP_*")
			continue
		}
		if msg := ValidateCode(strings.TrimSuffix(c, "*")); msg != "" {
			vs.add(field, "%s", msg)
			continue
		}
		if c == CodeAborted {
			vs.add(field, "ABORTED is never retried: cancellation stays terminal")
			continue
		}
		if seen[c] {
			vs.add(field, "duplicate code %s", c)
			continue
		}
		seen[c] = true
	}
	return slices.Sorted(slices.Values(codes))
}

func (p *Policy) index() {
	p.exact = make(map[string]struct{}, len(p.Codes))
	for _, c := range p.Codes {
		if prefix, ok := strings.CutSuffix(c, "*"); ok {
			p.prefixes = append(p.prefixes, prefix)
		} else {
			p.exact[c] = struct{}{}
		}
	}
}

// Retryable reports whether the policy may retry a failure with this code.
func (p *Policy) Retryable(code string) bool {
	if code == CodeAborted {
		return false
	}
	if p.Mode == retrydv1.Mode_MODE_ALWAYS {
		return true
	}
	if _, ok := p.exact[code]; ok {
		return true
	}
	for _, prefix := range p.prefixes {
		if strings.HasPrefix(code, prefix) {
			return true
		}
	}
	return false
}

// DelayCapMs is the largest local delay of the policy: the backoff cap, or
// the largest schedule or tail delay. A provider Retry-After above it is
// "over the cap".
func (p *Policy) DelayCapMs() uint64 {
	if p.Mode != retrydv1.Mode_MODE_SCHEDULE {
		return p.MaxDelayMs
	}
	return max(slices.Max(p.Schedule), p.TailDelayMs)
}

// Proto returns the resolved policy with every field explicit, as recorded
// in scheduled events.
func (p *Policy) Proto() *retrydv1.RetryPolicy {
	out := &retrydv1.RetryPolicy{
		Mode:              p.Mode,
		RetryableCodes:    slices.Clone(p.Codes),
		RetryAfterOverCap: p.OverCap,
		MinAttemptMs:      proto.Uint64(p.MinAttemptMs),
	}
	if p.Bounded {
		out.MaxRetries = proto.Uint32(p.MaxRetries)
	}
	switch p.Mode {
	case retrydv1.Mode_MODE_SCHEDULE:
		out.Schedule = slices.Clone(p.Schedule)
		out.TailDelayMs = proto.Uint64(p.TailDelayMs)
	default:
		out.Backoff = &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(p.InitialDelayMs),
			MaxDelayMs:     proto.Uint64(p.MaxDelayMs),
			Multiplier:     proto.Float64(p.Multiplier),
			JitterRatio:    proto.Float64(p.JitterRatio),
			Jitter:         p.Jitter,
		}
	}
	return out
}

// SharedProto returns one resolved-policy message shared by every caller
// of this Policy, so that each scheduled record need not carry its own
// copy. Callers must not modify it; use Proto for a private copy.
func (p *Policy) SharedProto() *retrydv1.RetryPolicy { return p.shared }

// canonicalKey renders the policy as a human-readable string naming every
// behaviour-affecting field, with defaults resolved, codes sorted and the
// schedule in order. Fields are separated by ";" and appear in this order:
//
//	normal;max=2;codes=A,B;backoff=500..10000*2;jitter=symmetric:0.1;over_cap=delegate;min_attempt=100
//	normal;max=5;codes=SERVER;backoff=100..1000*1.5;jitter=full;over_cap=honor;min_attempt=0
//	always;max=inf;backoff=1000..30000*2;jitter=symmetric:0.2;over_cap=local;min_attempt=100
//	schedule;max=inf;codes=A,HTTP_*;schedule=2000,5000;tail=20000;over_cap=local;min_attempt=100
func (p *Policy) canonicalKey() string {
	var b strings.Builder
	b.WriteString(modeName(p.Mode))
	b.WriteString(";max=")
	if p.Bounded {
		b.WriteString(strconv.FormatUint(uint64(p.MaxRetries), 10))
	} else {
		b.WriteString("inf")
	}
	if p.Mode != retrydv1.Mode_MODE_ALWAYS {
		b.WriteString(";codes=")
		b.WriteString(strings.Join(p.Codes, ","))
	}
	if p.Mode == retrydv1.Mode_MODE_SCHEDULE {
		b.WriteString(";schedule=")
		for i, d := range p.Schedule {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(d, 10))
		}
		b.WriteString(";tail=")
		b.WriteString(strconv.FormatUint(p.TailDelayMs, 10))
	} else {
		fmt.Fprintf(&b, ";backoff=%d..%d*%s;jitter=%s", p.InitialDelayMs, p.MaxDelayMs,
			strconv.FormatFloat(p.Multiplier, 'g', -1, 64), jitterName(p.Jitter))
		if p.Jitter == retrydv1.Jitter_JITTER_SYMMETRIC {
			// The ratio only shapes symmetric jitter; full jitter ignores it.
			b.WriteByte(':')
			b.WriteString(strconv.FormatFloat(p.JitterRatio, 'g', -1, 64))
		}
	}
	b.WriteString(";over_cap=")
	b.WriteString(overCapName(p.OverCap))
	b.WriteString(";min_attempt=")
	b.WriteString(strconv.FormatUint(p.MinAttemptMs, 10))
	return b.String()
}

func modeName(m retrydv1.Mode) string {
	return strings.ToLower(strings.TrimPrefix(m.String(), "MODE_"))
}

func jitterName(j retrydv1.Jitter) string {
	return strings.ToLower(strings.TrimPrefix(j.String(), "JITTER_"))
}

func overCapName(o retrydv1.RetryAfterOverCap) string {
	return strings.ToLower(strings.TrimPrefix(o.String(), "RETRY_AFTER_OVER_CAP_"))
}
