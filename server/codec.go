package server

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// pooledCodec is the proto codec of the main port. It encodes the same
// bytes as grpc-go's default one, with two differences in how:
//
//   - every response goes into a pooled buffer, which the transport
//     returns to the pool once the bytes are written. The default codec
//     pools only messages of 1 KiB or more and allocates a fresh slice for
//     each smaller one — nearly every answer of retryd's, and garbage that
//     retryd's collector then pays for in proportion to retryd's live
//     state;
//   - retryd's own messages (gen/) are encoded by the code
//     protoc-gen-go-vtproto generated for them: a FailedStep answer in
//     about 0.3 µs, pool and buffer included, against 1 µs for
//     protobuf-go's table-driven encoder (BenchmarkCodecMarshal). Other
//     messages (health, reflection) take protobuf-go's.
//
// Decoding is grpc-go's own, so protobuf-go still checks every request,
// including that its strings are valid UTF-8, which the generated
// decoders do not.
type pooledCodec struct{}

// vtMarshaler is the part of protoc-gen-go-vtproto's generated methods
// the codec uses. MarshalToSizedBufferVT writes the message backwards
// from the end of the buffer, whose length must be SizeVT's.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVT(dst []byte) (int, error)
}

var _ encoding.CodecV2 = pooledCodec{}

// defaultCodec is grpc-go's proto codec, which decodes.
var defaultCodec = encoding.GetCodecV2(encproto.Name)

func (pooledCodec) Marshal(v any) (mem.BufferSlice, error) {
	if vm, ok := v.(vtMarshaler); ok {
		return marshalVT(vm)
	}
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("proto: failed to marshal, message is %T, want proto.Message", v)
	}
	// The size just computed is the one MarshalAppend reuses; the message
	// is not changed meanwhile (the stores never change a message they
	// have handed out).
	size := proto.Size(m)
	if size == 0 {
		return mem.BufferSlice{mem.SliceBuffer(nil)}, nil // as grpc-go's codec answers an empty message
	}
	buf := responses.Get(size)
	out, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend((*buf)[:0], m)
	if err != nil {
		responses.Put(buf)
		return nil, err
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, responses)}, nil
}

// marshalVT encodes one of retryd's own messages into a pooled buffer.
func marshalVT(m vtMarshaler) (mem.BufferSlice, error) {
	size := m.SizeVT()
	if size == 0 {
		return mem.BufferSlice{mem.SliceBuffer(nil)}, nil
	}
	buf := responses.Get(size)
	n, err := m.MarshalToSizedBufferVT(*buf)
	if err == nil && n != size {
		err = fmt.Errorf("proto: %T encoded %d bytes of the %d it sized", m, n, size)
	}
	if err != nil {
		responses.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, responses)}, nil
}

func (pooledCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return defaultCodec.Unmarshal(data, v)
}

func (pooledCodec) Name() string { return encproto.Name }

func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// pooledResponseCap is the capacity of the buffers responsePool keeps:
// more than a FailedStep answer needs. mem.NewBuffer returns a buffer to
// its pool only from 1 KiB of capacity up.
const pooledResponseCap = 2 << 10

// responsePool keeps response buffers of pooledResponseCap bytes and
// hands larger requests to grpc-go's default pool. Unlike that pool it
// does not clear a buffer it hands out: Marshal overwrites what it uses.
type responsePool struct{ buffers sync.Pool }

var responses mem.BufferPool = &responsePool{}

func (p *responsePool) Get(n int) *[]byte {
	if n > pooledResponseCap {
		return mem.DefaultBufferPool().Get(n)
	}
	if b, ok := p.buffers.Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, pooledResponseCap)
	return &b
}

func (p *responsePool) Put(b *[]byte) {
	if cap(*b) != pooledResponseCap {
		mem.DefaultBufferPool().Put(b)
		return
	}
	p.buffers.Put(b)
}
