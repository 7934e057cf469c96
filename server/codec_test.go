package server

import (
	"strings"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestPooledCodec: the pooled codec encodes exactly as grpc-go's default
// one, small and large messages alike, and a buffer given back is used
// again without its old bytes showing.
func TestPooledCodec(t *testing.T) {
	t.Parallel()
	def := encoding.GetCodecV2(encproto.Name)
	var c pooledCodec
	msgs := []proto.Message{
		&retrydv1.FailedStepRequest{SessionId: "s", Turn: 1, Step: 2, Provider: "p",
			Failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429}},
		&retrydv1.FailedStepRequest{},                                // empty: zero bytes
		wrapperspb.String(strings.Repeat("x", pooledResponseCap)),    // over the pooled size
		wrapperspb.String(strings.Repeat("y", 10*pooledResponseCap)), // grpc-go's pool
		&retrydv1.FailedStepRequest{SessionId: "t"},                  // shorter than the first: a reused buffer
	}
	for range 3 {
		for _, m := range msgs {
			got, err := c.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			want, err := def.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if g, w := got.Materialize(), want.Materialize(); string(g) != string(w) {
				t.Errorf("%T: pooled %x, default %x", m, g, w)
			}
			back := m.ProtoReflect().New().Interface()
			if err := c.Unmarshal(got, back); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(back, m) {
				t.Errorf("round trip of %v: %v", m, back)
			}
			got.Free()
			want.Free()
		}
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Error("Marshal of a string: no error")
	}
	if c.Name() != "proto" {
		t.Errorf("Name() = %q", c.Name())
	}
}
