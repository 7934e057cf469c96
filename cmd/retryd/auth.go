package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/retryd/retryd/auth"
)

// hashToken prints the hex SHA-256 of the bearer token read from stdin:
// the value of a credentials file's tokens[].sha256.
func hashToken(_ context.Context, e *env, args []string) error {
	fs := newFlags("hash-token")
	if err := e.parse(fs, args, true); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usage("hash-token", errors.New("the token is read from stdin, not from the command line (where ps and shell history would see it): printf %s \"$TOKEN\" | retryd hash-token"))
	}
	token, err := auth.ReadToken(e.stdin)
	if err != nil {
		return fmt.Errorf("hash-token: %w", err)
	}
	if len(token) < auth.MinTokenLen {
		fmt.Fprintf(e.stderr, "retryd: warning: a %d-character token; use at least 128 random bits, e.g. openssl rand -hex 32\n", len(token))
	}
	fmt.Fprintln(e.stdout, auth.HashToken(token))
	return nil
}

// checkCredentials validates a credentials file and describes its tenants
// (never their hashes).
func checkCredentials(_ context.Context, e *env, args []string) error {
	fs := newFlags("check-credentials")
	path := fs.String("auth-credentials", e.getenv("RETRYD_AUTH_CREDENTIALS"), "credentials `file` to validate (env RETRYD_AUTH_CREDENTIALS)")
	if err := e.parse(fs, args, false); err != nil {
		return err
	}
	if *path == "" {
		return usage("check-credentials", errors.New("--auth-credentials is required"))
	}
	creds, err := auth.Load(*path)
	if err != nil {
		return fmt.Errorf("%s: %w", *path, err)
	}
	tenants, tokens, certs := creds.Len()
	fmt.Fprintf(e.stdout, "%s: ok, %d tenants, %d tokens, %d client certificate identities\n", *path, tenants, tokens, certs)
	list := func(l []string) string {
		if l == nil {
			return "any"
		}
		return "[" + strings.Join(l, ", ") + "]"
	}
	for _, s := range creds.Summaries() {
		fmt.Fprintf(e.stdout, "tenant %q: %d tokens, %d client certificates, providers %s, policies %s\n",
			s.ID, s.Tokens, s.ClientCertificates, list(s.Providers), list(s.Policies))
	}
	return nil
}
