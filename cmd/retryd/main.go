// Command retryd is the retry-decision service for LLM agent fleets.
//
//	retryd [serve] [flags]            serve the RetryService (default)
//	retryd check-config --config F    validate a policy file
//	retryd check-credentials --auth-credentials F
//	                                  validate a credentials file
//	retryd hash-token < TOKEN         print the SHA-256 of a bearer token
//	retryd verify (--file F | --server ADDR) [--session S]
//	                                  run the invariant checker over an event log
//	retryd version                    print the version
package main

import (
	"context"
	"fmt"
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
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "retryd:", err)
		os.Exit(1)
	}
}
