package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/retryd/retryd/auth"
)

// hashToken prints the hex SHA-256 of the bearer token read from stdin:
// the value of a credentials file's tokens[].sha256.
func hashToken(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("retryd hash-token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		io.WriteString(stderr, "usage: printf %s \"$TOKEN\" | retryd hash-token\n"+
			"prints the hex SHA-256 of the token on stdin, for tokens[].sha256 of the credentials file\n")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("hash-token: the token is read from stdin, not from the command line (where ps and shell history would see it)")
	}
	token, err := auth.ReadToken(stdin)
	if err != nil {
		return fmt.Errorf("hash-token: %w", err)
	}
	if len(token) < auth.MinTokenLen {
		fmt.Fprintf(stderr, "retryd: warning: a %d-character token; use at least 128 random bits, e.g. openssl rand -hex 32\n", len(token))
	}
	fmt.Fprintln(stdout, auth.HashToken(token))
	return nil
}

// checkCredentials validates a credentials file and describes its tenants
// (never their hashes).
func checkCredentials(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("retryd check-credentials", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("auth-credentials", getenv("RETRYD_AUTH_CREDENTIALS"), "credentials file to validate (env RETRYD_AUTH_CREDENTIALS)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("check-credentials: --auth-credentials is required")
	}
	creds, err := auth.Load(*path)
	if err != nil {
		return fmt.Errorf("%s: %w", *path, err)
	}
	tenants, tokens, certs := creds.Len()
	fmt.Fprintf(stdout, "%s: ok, %d tenants, %d tokens, %d client certificate identities\n", *path, tenants, tokens, certs)
	list := func(l []string) string {
		if l == nil {
			return "any"
		}
		return "[" + strings.Join(l, ", ") + "]"
	}
	for _, s := range creds.Summaries() {
		fmt.Fprintf(stdout, "tenant %q: %d tokens, %d client certificates, providers %s, policies %s\n",
			s.ID, s.Tokens, s.ClientCertificates, list(s.Providers), list(s.Policies))
	}
	return nil
}
