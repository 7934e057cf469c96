package retryd

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// bearerToken is the per-RPC credentials of WithBearerToken and
// WithInsecureBearerToken.
type bearerToken struct {
	token    string
	insecure bool
}

var _ credentials.PerRPCCredentials = (*bearerToken)(nil)

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b *bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: grpc
// refuses to send the token of WithBearerToken over a connection without
// transport security.
func (b *bearerToken) RequireTransportSecurity() bool { return !b.insecure }

// check refuses a token retryd could never match: empty, or with a byte
// outside visible ASCII (which `retryd hash-token` refuses too). The error
// names the offset, never the token.
func (b *bearerToken) check() error {
	if b.token == "" {
		return errors.New("retryd: the bearer token is empty")
	}
	for i := 0; i < len(b.token); i++ {
		if c := b.token[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("retryd: the bearer token has a space, control or non-ASCII byte at offset %d of %d "+
				"(a trailing newline from a file?): a token is one line of visible ASCII", i, len(b.token))
		}
	}
	return nil
}

// tokenConn sends a token with every call on a connection the caller owns
// (NewFromConn), as a per-call credential. It goes before the call's own
// options, so a call's grpc.PerRPCCredentials replaces it.
type tokenConn struct {
	grpc.ClientConnInterface
	token *bearerToken
}

// Invoke implements grpc.ClientConnInterface.
func (c tokenConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.ClientConnInterface.Invoke(ctx, method, args, reply, c.with(opts)...)
}

// NewStream implements grpc.ClientConnInterface.
func (c tokenConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.ClientConnInterface.NewStream(ctx, desc, method, c.with(opts)...)
}

func (c tokenConn) with(opts []grpc.CallOption) []grpc.CallOption {
	return append([]grpc.CallOption{grpc.PerRPCCredentials(c.token)}, opts...)
}
