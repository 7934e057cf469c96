package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/retryd/retryd/auth"
	"google.golang.org/grpc"
)

// minAuthReloadInterval bounds how often the credentials file is read.
const minAuthReloadInterval = 100 * time.Millisecond

// AuthEnabled reports whether calls must carry credentials.
func (c *Config) AuthEnabled() bool { return c.AuthCredentials != "" }

// validateAuth checks the authentication settings. The credentials file
// itself is read (and refused by name) when the server starts.
func (c *Config) validateAuth(bad func(field, value, reason string)) {
	if c.AuthReloadInterval < minAuthReloadInterval {
		bad("auth-reload-interval", c.AuthReloadInterval.String(), "must be at least "+minAuthReloadInterval.String())
	}
}

// setupAuth loads the credentials file and returns its source and the
// interceptors of the main gRPC port. A missing or invalid file refuses the
// start with a FieldError naming the flag and the file. Without a file it
// says once, at WARN, that authentication is off, and returns neither.
//
// The interceptors go on the main port only: the health port serves
// nothing but grpc.health.v1, which needs no credentials, and on the main
// port health and reflection are exempt too (auth.Authenticator).
func setupAuth(c Config, log *slog.Logger) (*auth.Source, []grpc.ServerOption, error) {
	if !c.AuthEnabled() {
		log.Warn("AUTHENTICATION DISABLED: every caller is the default tenant and can see, cancel and exhaust every session; " +
			"set --auth-credentials (RETRYD_AUTH_CREDENTIALS) to require credentials")
		return nil, nil, nil
	}
	src, err := auth.NewSource(c.AuthCredentials, log)
	if err != nil {
		return nil, nil, &FieldError{Field: "auth-credentials", Value: c.AuthCredentials, Reason: err.Error()}
	}
	if !c.TLSEnabled() {
		log.Warn("bearer tokens cross the network in plaintext: serve TLS (--tls-cert, --tls-key) unless the network is private")
	}
	if _, _, certs := src.Current().Len(); certs > 0 && !c.MTLSEnabled() {
		log.Warn("the credentials map client certificates, but without --tls-client-ca no client certificate is asked for: only tokens authenticate")
	}
	a := auth.NewAuthenticator(src.Current, log)
	return src, []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(a.StreamServerInterceptor()),
	}, nil
}

// watchAuth reloads the credentials file every interval until ctx is
// done; the returned channel closes when it has stopped. With no source it
// is closed at once.
func watchAuth(ctx context.Context, src *auth.Source, interval time.Duration) <-chan struct{} {
	done := make(chan struct{})
	if src == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		src.Watch(ctx, interval)
	}()
	return done
}
