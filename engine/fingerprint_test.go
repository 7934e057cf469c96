package engine

import (
	"crypto/sha256"
	"slices"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestEncodingFingerprintIsTheDeterministicEncodings: a report's encoding
// fingerprint is the SHA-256 of protobuf-go's deterministic encoding of
// it, as earlier versions computed and stores may still keep, for reports
// with every kind of field, an inline policy or a named one, and fields
// this version does not know.
func TestEncodingFingerprintIsTheDeterministicEncodings(t *testing.T) {
	t.Parallel()
	withUnknown := &retrydv1.FailedStepRequest{SessionId: "s", Turn: 2, Step: 3, Provider: "p",
		Failure: &retrydv1.Failure{Code: "SERVER"}}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 5))
	failure := &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429, Message: "slow down é",
		RetryAfter: proto.String("Wed, 21 Oct 2026 07:28:00 GMT"), ProviderRetryAfterMs: proto.Int64(1500)}
	failure.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 77, protowire.BytesType), []byte("x")))
	for name, req := range map[string]*retrydv1.FailedStepRequest{
		"empty":         {},
		"unknown field": withUnknown,
		"inline policy": {SessionId: "tenant/s-1", LogicalTurnId: "turn-abc", Turn: 1, Step: 7, Provider: "openai",
			Failure: failure, Downstream: retrydv1.Downstream_DOWNSTREAM_DECLINED,
			Deadline: timestamppb.New(timestamppb.Now().AsTime()),
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
				Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(5),
				Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(200), MaxDelayMs: proto.Uint64(5000),
					Multiplier: proto.Float64(2), Jitter: retrydv1.Jitter_JITTER_FULL}}}},
		"named policy": {SessionId: "s", Turn: 1, Step: 1, Provider: "anthropic",
			Failure: &retrydv1.Failure{Code: "HTTP_529"}, PolicySource: &retrydv1.FailedStepRequest_PolicyName{PolicyName: "agent-default"}},
	} {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := encodingFingerprint(req), sha256.Sum256(b); got != want {
			t.Errorf("%s: fingerprint %x, want %x", name, got, want)
		}
	}
}

// BenchmarkFingerprint: a report's encoding fingerprint, against the same
// digest of protobuf-go's deterministic encoding, and its fingerprint by
// meaning (the step record's).
//
//	go test -run '^$' -bench Fingerprint -benchmem ./engine/
func BenchmarkFingerprint(b *testing.B) {
	req := &retrydv1.FailedStepRequest{SessionId: "bench-session-123456", LogicalTurnId: "turn-abc", Turn: 1, Step: 1,
		Provider: "openai", Failure: &retrydv1.Failure{Code: "TRANSPORT", HttpStatus: 502},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
			Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(5),
			Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(200), MaxDelayMs: proto.Uint64(5000),
				Multiplier: proto.Float64(2), Jitter: retrydv1.Jitter_JITTER_FULL}}}}
	b.Run("protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf, _ = proto.MarshalOptions{Deterministic: true}.MarshalAppend(buf[:0], req)
			sha256.Sum256(buf)
		}
	})
	b.Run("fingerprint", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encodingFingerprint(req)
		}
	})
	b.Run("report", func(b *testing.B) {
		p, err := policy.Resolve(req.GetPolicy())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			reportFingerprint(req, p)
		}
	})
}

// TestReportFingerprintCoversEveryField: every field of a report and its
// failure changes the report's fingerprint, except the policy's spelling
// (the policy counts by its canonical key); and the equivalent spellings
// the fingerprint resolves are the same report.
func TestReportFingerprintCoversEveryField(t *testing.T) {
	t.Parallel()
	always := resolve(t, &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS})
	normal := resolve(t, nil)
	baseReport := func() *retrydv1.FailedStepRequest {
		return &retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: 1, Provider: "p",
			Failure: &retrydv1.Failure{Code: "SERVER"}}
	}
	want := reportFingerprint(baseReport(), always)
	// Each field set, on its own, to a value that is not its default.
	eachField := func(of func(r *retrydv1.FailedStepRequest) protoreflect.Message, skip ...protoreflect.Name) {
		fields := of(baseReport()).Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if slices.Contains(skip, fd.Name()) {
				continue
			}
			var v protoreflect.Value
			switch fd.Kind() {
			case protoreflect.StringKind:
				v = protoreflect.ValueOfString("other")
			case protoreflect.Uint64Kind:
				v = protoreflect.ValueOfUint64(9)
			case protoreflect.Uint32Kind:
				v = protoreflect.ValueOfUint32(503)
			case protoreflect.Int64Kind:
				v = protoreflect.ValueOfInt64(-1)
			case protoreflect.EnumKind:
				v = protoreflect.ValueOfEnum(2)
			case protoreflect.MessageKind:
				if fd.Message().FullName() != "google.protobuf.Timestamp" {
					t.Fatalf("field %s: a message field the test does not know how to set", fd.FullName())
				}
				v = protoreflect.ValueOfMessage((&timestamppb.Timestamp{Seconds: 1}).ProtoReflect())
			default:
				t.Fatalf("field %s: kind %s the test does not know how to set", fd.FullName(), fd.Kind())
			}
			r := baseReport()
			of(r).Set(fd, v)
			if reportFingerprint(r, always) == want {
				t.Errorf("%s does not change the fingerprint", fd.FullName())
			}
		}
	}
	eachField(func(r *retrydv1.FailedStepRequest) protoreflect.Message { return r.ProtoReflect() },
		"failure", "policy", "policy_name")
	eachField(func(r *retrydv1.FailedStepRequest) protoreflect.Message { return r.GetFailure().ProtoReflect() })
	req := baseReport()
	// The deadline counts to the nanosecond.
	req.Deadline = &timestamppb.Timestamp{Seconds: 1}
	at := reportFingerprint(req, always)
	req.Deadline.Nanos = 5
	if reportFingerprint(req, always) == at {
		t.Error("the deadline's nanoseconds do not change the fingerprint")
	}
	req.Deadline = nil
	// Optional fields count when set to their zero value too.
	req.Failure.ProviderRetryAfterMs, req.Failure.RetryAfter = proto.Int64(0), nil
	if reportFingerprint(req, always) == want {
		t.Error("provider_retry_after_ms set to 0 does not change the fingerprint")
	}
	req.Failure.ProviderRetryAfterMs, req.Failure.RetryAfter = nil, proto.String("")
	if reportFingerprint(req, always) == want {
		t.Error("an empty retry_after does not change the fingerprint")
	}

	same := map[string]func(r *retrydv1.FailedStepRequest) *policy.Policy{
		"downstream NOT_ASKED": func(r *retrydv1.FailedStepRequest) *policy.Policy {
			r.Downstream = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
			return always
		},
		"replay SAFE": func(r *retrydv1.FailedStepRequest) *policy.Policy {
			r.Replay = retrydv1.Replay_REPLAY_SAFE
			return always
		},
		"the policy inline": func(r *retrydv1.FailedStepRequest) *policy.Policy {
			r.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS}}
			return always
		},
		"the policy by name": func(r *retrydv1.FailedStepRequest) *policy.Policy {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "agent-default"}
			return always
		},
		"unknown fields": func(r *retrydv1.FailedStepRequest) *policy.Policy {
			r.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 5))
			return always
		},
	}
	for name, change := range same {
		r := baseReport()
		if p := change(r); reportFingerprint(r, p) != want {
			t.Errorf("%s changes the fingerprint", name)
		}
	}
	// Downstream decides nothing outside always mode.
	inNormal := reportFingerprint(baseReport(), normal)
	for d := range retrydv1.Downstream_name {
		r := baseReport()
		r.Downstream = retrydv1.Downstream(d)
		if reportFingerprint(r, normal) != inNormal {
			t.Errorf("downstream %s changes the fingerprint of a normal-mode report", r.Downstream)
		}
	}
	for name, p := range map[string]*policy.Policy{"another policy": normal, "no policy": nil} {
		if reportFingerprint(baseReport(), p) == want {
			t.Errorf("%s does not change the fingerprint", name)
		}
	}
	if reportFingerprint(baseReport(), always) == encodingFingerprint(baseReport()) {
		t.Error("a report's fingerprint equals its encoding fingerprint")
	}
}
