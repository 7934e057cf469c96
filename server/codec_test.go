package server

import (
	"context"
	"strings"
	"testing"

	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/memory"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
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

// TestPooledCodecGeneratedEncoders: for every message of retryd's own
// protos, filled field by field (each member of each oneof in turn, lists,
// maps, nested messages, well-known types, unknown fields), the generated
// encoder the codec uses writes the bytes protobuf-go writes, and a
// message of another package still goes through protobuf-go.
func TestPooledCodecGeneratedEncoders(t *testing.T) {
	t.Parallel()
	def := encoding.GetCodecV2(encproto.Name)
	var c pooledCodec
	checked := 0
	for _, fd := range []protoreflect.FileDescriptor{
		retrydv1.File_retryd_v1_retry_service_proto, retrydv1.File_retryd_v1_events_proto,
		retrydv1.File_retryd_v1_policy_proto, statev1.File_retryd_state_v1_state_proto,
	} {
		for md := range allMessages(fd.Messages()) {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := mt.New().Interface().(vtMarshaler); !ok {
				t.Errorf("%s has no generated encoder: is protoc-gen-go-vtproto in buf.gen.yaml?", md.FullName())
				continue
			}
			for variant := range 3 {
				m := mt.New()
				fill(m, variant, 0)
				m.SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9999, protowire.VarintType), 7))
				got, err := c.Marshal(m.Interface())
				if err != nil {
					t.Fatalf("%s: %v", md.FullName(), err)
				}
				want, err := def.Marshal(m.Interface())
				if err != nil {
					t.Fatal(err)
				}
				if g, w := got.Materialize(), want.Materialize(); string(g) != string(w) {
					t.Errorf("%s variant %d:\n generated %x\n protobuf  %x", md.FullName(), variant, g, w)
				}
				got.Free()
				want.Free()
				checked++
			}
		}
	}
	if checked < 30 {
		t.Errorf("checked only %d messages", checked)
	}
	if _, ok := any(wrapperspb.String("x")).(vtMarshaler); ok {
		t.Fatal("wrapperspb has a generated encoder: the next check proves nothing")
	}
}

// allMessages yields the messages of a file, nested ones included
// (map entries excluded: they are encoded as their map field).
func allMessages(mds protoreflect.MessageDescriptors) func(func(protoreflect.MessageDescriptor) bool) {
	return func(yield func(protoreflect.MessageDescriptor) bool) {
		for i := range mds.Len() {
			md := mds.Get(i)
			if md.IsMapEntry() {
				continue
			}
			if !yield(md) {
				return
			}
			for n := range allMessages(md.Messages()) {
				if !yield(n) {
					return
				}
			}
		}
	}
}

// fill sets every field of m to a value that is not its default; of each
// oneof it sets the member variant selects. Nested messages are filled to
// a depth of three.
func fill(m protoreflect.Message, variant, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() &&
			od.Fields().Get(variant%od.Fields().Len()) != fd {
			continue
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			mp.Set(scalar(fd.MapKey(), 1).MapKey(), mapValue(mp, fd.MapValue(), variant, depth))
		case fd.IsList():
			l := m.Mutable(fd).List()
			for n := range 2 {
				if fd.Message() != nil {
					if depth < 3 {
						e := l.NewElement()
						fill(e.Message(), variant+n, depth+1)
						l.Append(e)
					}
					continue
				}
				l.Append(scalar(fd, n+1))
			}
		case fd.Message() != nil:
			if depth < 3 {
				fill(m.Mutable(fd).Message(), variant, depth+1)
			}
		default:
			m.Set(fd, scalar(fd, variant+1))
		}
	}
}

func mapValue(mp protoreflect.Map, fd protoreflect.FieldDescriptor, variant, depth int) protoreflect.Value {
	if fd.Message() == nil {
		return scalar(fd, 2)
	}
	v := mp.NewValue()
	if depth < 3 {
		fill(v.Message(), variant, depth+1)
	}
	return v
}

// scalar is a value of a scalar field that is not its default, n ≥ 1.
func scalar(fd protoreflect.FieldDescriptor, n int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(n % vals.Len()).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(-1000 * n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(-1) << (30 + n))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(300 * n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(1) << (40 + n))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1.5 * float32(n))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(2.25 * float64(n))
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(strings.Repeat("é"+string(fd.Name()), n))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{0, byte(n), 0xff})
	}
	panic("unknown kind " + fd.Kind().String())
}

// BenchmarkCodecMarshal encodes a FailedStep answer (an inline full-jitter
// policy, scheduled) as the main port's codec does, and as protobuf-go
// does into a buffer of its own: the difference is the generated
// encoder's.
//
//	go test -run '^$' -bench CodecMarshal -benchmem ./server/
func BenchmarkCodecMarshal(b *testing.B) {
	store := memory.New(memory.Config{})
	defer store.Close()
	svc, err := service.New(store)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := svc.FailedStep(context.Background(), &retrydv1.FailedStepRequest{
		SessionId: "bench-session-123456", LogicalTurnId: "turn-abc", Turn: 1, Step: 1, Provider: "openai",
		Failure: &retrydv1.Failure{Code: "TRANSPORT", HttpStatus: 502},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
			Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(5),
			Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(200), MaxDelayMs: proto.Uint64(5000),
				Multiplier: proto.Float64(2), Jitter: retrydv1.Jitter_JITTER_FULL}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, pooledResponseCap)
		for b.Loop() {
			buf = buf[:0:proto.Size(resp)]
			if buf, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(buf, resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		var c pooledCodec
		for b.Loop() {
			out, err := c.Marshal(resp)
			if err != nil {
				b.Fatal(err)
			}
			out.Free()
		}
	})
}
