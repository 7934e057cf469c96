package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/retryd/retryd/internal/reload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// limitOptions are the explicit limits every gRPC server of retryd (the
// main port and the health port) runs with. observe, when not nil, sees
// every unary call's end (see unaryTimeout).
func limitOptions(c Config, observe callObserver) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(c.MaxRecvMsgBytes),
		grpc.MaxConcurrentStreams(uint32(c.MaxConcurrentStreams)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             c.KeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     c.MaxConnectionIdle,
			MaxConnectionAge:      c.MaxConnectionAge,
			MaxConnectionAgeGrace: c.MaxConnectionAgeGrace,
		}),
		grpc.ChainUnaryInterceptor(unaryTimeout(c.UnaryTimeout, observe)),
	}
}

// callObserver sees the end of a call: its method, when it began and the
// error it returns (nil: OK).
type callObserver func(ctx context.Context, fullMethod string, began time.Time, err error)

// unaryTimeout bounds the context of every unary call by d (a caller's
// shorter deadline still wins). A handler that gives up with the bare
// context error is answered DEADLINE_EXCEEDED. As the first interceptor
// it also hands each call's outcome to observe (when not nil): one
// interceptor instead of two saves the closure grpc-go builds per call
// for each further link of a chain.
func unaryTimeout(d time.Duration, observe callObserver) grpc.UnaryServerInterceptor {
	if observe == nil {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			return boundedCall(ctx, req, handler, d)
		}
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		began := time.Now()
		resp, err := boundedCall(ctx, req, handler, d)
		observe(ctx, info.FullMethod, began, err)
		return resp, err
	}
}

// boundedCall runs handler with its context bounded by d.
func boundedCall(ctx context.Context, req any, handler grpc.UnaryHandler, d time.Duration) (any, error) {
	bounded := ctx
	// When the caller's deadline is the bound already, a context of our
	// own would change nothing but cost a timer per call.
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > d {
		var cancel context.CancelFunc
		bounded, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	resp, err := handler(bounded, req)
	if err == nil {
		return resp, nil
	}
	if _, ok := status.FromError(err); !ok && errors.Is(err, context.DeadlineExceeded) {
		if ctx.Err() == nil {
			return nil, status.Errorf(codes.DeadlineExceeded, "call exceeded the server's unary timeout of %v", d)
		}
		return nil, status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	return resp, err
}

// certSource serves the TLS certificate (and the client CA pool, for
// mTLS) read from PEM files, and reloads them when the files change
// (polling; see internal/reload): a rotation takes effect for new
// connections without a restart, and a rotation that does not load
// (half-written, mismatched, invalid) is logged while the last good pair
// keeps serving.
type certSource struct {
	certFile, keyFile, caFile            string
	*reload.Source[pemFiles, tls.Config] // what new handshakes use
}

// newCertSource loads the files once; an unreadable or invalid file
// refuses the start with a FieldError naming its flag and path.
func newCertSource(c Config, log *slog.Logger) (*certSource, error) {
	s := &certSource{certFile: c.TLSCert, keyFile: c.TLSKey, caFile: c.TLSClientCA}
	src, err := reload.New(reload.Config[pemFiles, tls.Config]{
		Read: func() (pemFiles, [sha256.Size]byte, error) {
			files, err := s.read()
			return files, files.sum(), err
		},
		Build: func(files pemFiles) (*tls.Config, []any, error) {
			cfg, leaf, err := s.build(files)
			if err != nil {
				return nil, nil, err
			}
			return cfg, certAttrs(s.certFile, leaf), nil
		},
		Log:      log,
		Loaded:   "tls certificate loaded",
		Reloaded: "tls certificate reloaded",
		Failed:   "tls reload failed; serving the previous certificate",
	})
	if err != nil {
		return nil, err
	}
	s.Source = src
	return s, nil
}

// serverConfig is the tls.Config of the gRPC port: each handshake takes
// the currently loaded certificate and client CAs.
func (s *certSource) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.Current(), nil
		},
	}
}

// pemFiles are the contents of the TLS files.
type pemFiles struct{ cert, key, ca []byte }

func (f pemFiles) sum() [sha256.Size]byte {
	h := sha256.New()
	for _, b := range [][]byte{f.cert, f.key, f.ca} {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

func (s *certSource) read() (pemFiles, error) {
	var f pemFiles
	var errs []error
	readInto := func(field, path string, dst *[]byte) {
		if path == "" {
			return
		}
		b, err := os.ReadFile(path)
		if err != nil {
			reason := err.Error()
			if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
				reason = pe.Err.Error()
			}
			errs = append(errs, &FieldError{Field: field, Value: path, Reason: "cannot read: " + reason})
		}
		*dst = b
	}
	readInto("tls-cert", s.certFile, &f.cert)
	readInto("tls-key", s.keyFile, &f.key)
	readInto("tls-client-ca", s.caFile, &f.ca)
	return f, errors.Join(errs...)
}

// build parses the files into the tls.Config of a handshake and returns
// the leaf certificate.
func (s *certSource) build(f pemFiles) (*tls.Config, *x509.Certificate, error) {
	leaf, err := parseCertificates(f.cert)
	if err != nil {
		return nil, nil, &FieldError{Field: "tls-cert", Value: s.certFile, Reason: err.Error()}
	}
	pair, err := tls.X509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, nil, &FieldError{Field: "tls-key", Value: s.keyFile,
			Reason: fmt.Sprintf("does not load with --tls-cert %s: %v", s.certFile, err)}
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		NextProtos:   []string{"h2"},
	}
	if s.caFile != "" {
		if _, err := parseCertificates(f.ca); err != nil {
			return nil, nil, &FieldError{Field: "tls-client-ca", Value: s.caFile, Reason: err.Error()}
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(f.ca)
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, leaf, nil
}

// parseCertificates parses every CERTIFICATE block of a PEM file and
// returns the first; a file without one is an error.
func parseCertificates(b []byte) (*x509.Certificate, error) {
	var first *x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a certificate: %w", err)
		}
		if first == nil {
			first = c
		}
	}
	if first == nil {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return first, nil
}

func certAttrs(file string, leaf *x509.Certificate) []any {
	return []any{"file", file, "subject", leaf.Subject.String(), "serial", leaf.SerialNumber.String(),
		"not_after", leaf.NotAfter.UTC().Format(time.RFC3339)}
}
