// Command retryd is the retry-decision service for LLM agent fleets.
//
//	retryd [serve] [flags]            serve the RetryService (default)
//	retryd check-config --config F    validate a policy file
//	retryd check-credentials --auth-credentials F
//	                                  validate a credentials file
//	retryd hash-token < TOKEN         print the SHA-256 of a bearer token
//	retryd verify (--file F | --server ADDR) [--session S] [TLS and token flags]
//	                                  run the invariant checker over an event log
//	retryd version, retryd --version  print the version
//	retryd help [command], -h, --help list the commands, or one command's flags
//
// A bad command line exits with status 2 and one line naming the problem.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process at once
	}()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	os.Exit(exitCode(os.Stderr, err))
}
