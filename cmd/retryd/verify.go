package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/retryd/retryd/auth"
	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
)

// errViolations makes verify exit non-zero after printing what it found.
var errViolations = errors.New("invariant violations found")

func verify(ctx context.Context, e *env, args []string) error {
	fs := newFlags("verify")
	file := fs.String("file", "", "event log as proto-JSON lines (- for stdin)")
	addr := fs.String("server", "", "read the event log of a live retryd at this `address` (WatchEvents)")
	session := fs.String("session", "", "with --server: only this session")
	var conn clientFlags
	conn.register(fs, e.getenv)
	if err := e.parse(fs, args, false); err != nil {
		return err
	}
	var (
		events []*retrydv1.Event
		err    error
	)
	switch {
	case (*file == "") == (*addr == ""):
		return usage("verify", errors.New("give exactly one of --file or --server"))
	case *file == "-":
		events, err = invariant.ReadJSONLines(e.stdin)
	case *file != "":
		var f *os.File
		if f, err = os.Open(*file); err == nil {
			events, err = invariant.ReadJSONLines(f)
			f.Close()
		}
	default:
		var opts []retryd.Option
		if opts, err = conn.options(); err != nil {
			return usage("verify", err)
		}
		events, err = watchAll(ctx, *addr, *session, opts)
	}
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	vs := invariant.Check(events)
	for _, v := range vs {
		fmt.Fprintln(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "%d events, %d violations\n", len(events), len(vs))
	if len(vs) > 0 {
		return errViolations
	}
	return nil
}

// watchAll reads every retained event of a live server with the Go client.
func watchAll(ctx context.Context, addr, session string, opts []retryd.Option) ([]*retrydv1.Event, error) {
	client, err := retryd.New(addr, opts...)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	var events []*retrydv1.Event
	for ev, err := range client.WatchEvents(ctx, &retrydv1.WatchEventsRequest{SessionId: session, StopAtEnd: true}) {
		if err != nil {
			return nil, err
		}
		events = append(events, ev)
	}
	return events, nil
}

// clientFlags are the connection settings of a command that calls a
// retryd: its transport security and bearer token, turned into the Go
// client's options (clients/go). Unlike the Go client's New, the
// connection is plaintext unless a --tls flag is given, as retryd's own
// default listener is.
type clientFlags struct {
	tls           bool
	caFile        string
	certFile      string
	keyFile       string
	serverName    string
	tokenFile     string
	insecureToken bool
}

func (c *clientFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.BoolVar(&c.tls, "tls", false, "connect over TLS, verifying the server against the system's roots (implied by the other --tls-* flags)")
	fs.StringVar(&c.caFile, "tls-ca", getenv("RETRYD_TLS_CA"), "PEM CA bundle that verifies the server's certificate, instead of the system's roots (env RETRYD_TLS_CA)")
	fs.StringVar(&c.certFile, "tls-cert", getenv("RETRYD_TLS_CLIENT_CERT"), "PEM client certificate chain, for a server that requires mTLS (env RETRYD_TLS_CLIENT_CERT)")
	fs.StringVar(&c.keyFile, "tls-key", getenv("RETRYD_TLS_CLIENT_KEY"), "PEM private key of --tls-cert (env RETRYD_TLS_CLIENT_KEY)")
	fs.StringVar(&c.serverName, "tls-server-name", "", "name to verify the server's certificate against; default the host of --server")
	fs.StringVar(&c.tokenFile, "token-file", getenv("RETRYD_TOKEN_FILE"), "`file` holding the tenant's bearer token (one line), sent only over TLS (env RETRYD_TOKEN_FILE)")
	fs.BoolVar(&c.insecureToken, "insecure-token", false, "also send the token over a plaintext connection (loopback, or a mesh that encrypts the hop)")
}

// options returns the Go client's options for these flags.
func (c *clientFlags) options() ([]retryd.Option, error) {
	var opts []retryd.Option
	useTLS := c.tls || c.caFile != "" || c.certFile != "" || c.keyFile != "" || c.serverName != ""
	if useTLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName}
		if c.caFile != "" {
			pem, err := os.ReadFile(c.caFile)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", c.caFile)
			}
		}
		if (c.certFile == "") != (c.keyFile == "") {
			return nil, errors.New("--tls-cert and --tls-key go together")
		}
		if c.certFile != "" {
			cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, retryd.WithTLS(cfg))
	} else {
		// Plaintext unless a --tls flag asks for TLS: retryd's own default
		// listener is plaintext on loopback.
		opts = append(opts, retryd.WithInsecure())
	}
	if c.tokenFile != "" {
		f, err := os.Open(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		token, err := auth.ReadToken(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("--token-file %s: %w", c.tokenFile, err)
		}
		if c.insecureToken {
			opts = append(opts, retryd.WithInsecureBearerToken(token))
		} else {
			if !useTLS {
				return nil, errors.New("--token-file without TLS: the token would cross the network in plaintext; add --tls-ca (or --tls), or --insecure-token where plaintext is safe")
			}
			opts = append(opts, retryd.WithBearerToken(token))
		}
	}
	return opts, nil
}
