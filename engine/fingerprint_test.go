package engine

import (
	"crypto/sha256"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestFingerprintIsTheDeterministicEncodings: a report's fingerprint is
// the SHA-256 of protobuf-go's deterministic encoding of it, as earlier
// versions computed and stores keep, for reports with every kind of
// field, an inline policy or a named one, and fields this version does
// not know.
func TestFingerprintIsTheDeterministicEncodings(t *testing.T) {
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
		if got, want := fingerprint(req), sha256.Sum256(b); got != want {
			t.Errorf("%s: fingerprint %x, want %x", name, got, want)
		}
	}
}

// BenchmarkFingerprint: a report's fingerprint, against the same digest of
// protobuf-go's deterministic encoding (how it was computed before).
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
			fingerprint(req)
		}
	})
}
