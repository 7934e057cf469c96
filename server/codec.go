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

// pooledCodec is the proto codec of the main port. It encodes exactly as
// grpc-go's default one, but every response goes into a pooled buffer,
// which the transport returns to the pool once the bytes are written.
// The default codec pools only messages of 1 KiB or more and allocates a
// fresh slice for each smaller one — nearly every answer of retryd's, and
// garbage that retryd's collector then pays for in proportion to retryd's
// live state. Decoding is grpc-go's own.
type pooledCodec struct{}

var _ encoding.CodecV2 = pooledCodec{}

// defaultCodec is grpc-go's proto codec, which decodes.
var defaultCodec = encoding.GetCodecV2(encproto.Name)

func (pooledCodec) Marshal(v any) (mem.BufferSlice, error) {
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
