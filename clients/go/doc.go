// Package retryd is the Go client of retryd, the retry-decision service
// for fleets of LLM agent loops.
//
// An agent loop that sees a model request fail reports it and either
// retries after the delay retryd chose or hands the failure to its next
// recovery policy. Recover does the whole exchange: it reports the failure
// (FailedStep), waits for the retry's single start confirmation
// (AwaitRetry, re-attaching if the stream breaks), and cancels the retry on
// the server if the agent gives up first:
//
//	client, err := retryd.New("127.0.0.1:7700", retryd.WithInsecure()) // a local retryd
//	if err != nil {
//		return err
//	}
//	defer client.Close()
//
//	out, err := client.Recover(ctx, &retrydv1.FailedStepRequest{
//		SessionId: sessionID,
//		Turn:      turn,
//		Step:      step,
//		Provider:  "anthropic",
//		Failure:   &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429},
//	})
//	if err != nil {
//		return err // ctx.Err(), or a gRPC status error (status.Code)
//	}
//	history = append(history, out.Event) // the scheduled or delegated record
//	switch {
//	case out.Retry:
//		// start the retry attempt now (out.Started)
//	case out.Delegate != nil:
//		// hand the failure to the next recovery policy (out.Delegate.Reason)
//	case out.Cancelled != nil:
//		// the retry will not start (out.Cancelled.Reason): stop or delegate
//	}
//
// After a model request succeeds, StepSucceeded closes the session's
// retry chains, so its next failure starts again at retry 1.
//
// The lower-level calls wrap the RetryService one to one: FailedStep,
// AwaitRetry, CancelRetry, CancelSession, StepSucceeded, GetChains,
// WatchEvents (an iterator over the event log) and ProviderState (a
// provider's fleet protection). Server errors are gRPC status errors
// returned as is; IsRetryPending, IsProviderNotAllowed,
// IsPolicyNotAllowed, IsLimitReached, RetryDelay, ErrorReason and
// FieldViolations read their google.rpc error details.
//
// A server started with --auth-credentials needs a tenant's bearer token
// on every call: WithBearerToken sends it over TLS only,
// WithInsecureBearerToken over any connection (loopback, a sidecar that
// encrypts the hop, tests).
//
// New connects over TLS unless WithInsecure asks for plaintext by name,
// balances round_robin over the target's addresses and lets gRPC retry
// the idempotent calls on UNAVAILABLE (ServiceConfig); a RESOURCE_EXHAUSTED
// refusal with a RetryInfo is sent again after the delay it names.
//
// Classify turns what a model provider answered (status, headers, error
// body, a client error, a dropped stream, an empty completion) into the
// Failure and Replay of a report, by the rules every retryd client shares.
//
// Options follow connect-go's pattern: Option is an interface with an
// unexported method, built by WithTLS, WithInsecure, WithDialOptions,
// WithBearerToken, WithInsecureBearerToken, WithReattachBackoff,
// WithCancelTimeout and WithExhaustedRetries.
//
// The Example functions of this package are its runnable documentation.
// They talk to a real retryd server that the package's TestMain builds
// from cmd/retryd and starts, and whose address it stores in the test
// variable retrydAddr; in an agent that address is where retryd serves.
package retryd
