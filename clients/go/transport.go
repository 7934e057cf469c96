package retryd

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ServiceConfig is the gRPC service config New gives its connection:
// round_robin over every address the target resolves to, so a
// "dns:///" target of a headless service spreads calls over its replicas
// and loses only the calls in flight on a replica that dies; and gRPC
// retries of the idempotent calls (FailedStep is idempotent per step
// record; GetChains, CancelRetries and StepSucceeded are too) when an
// attempt fails with UNAVAILABLE: up to 4 attempts, 50 ms to 1 s apart,
// within the call's deadline. AwaitRetry is not retried here: it
// re-attaches by itself. Pass grpc.WithDefaultServiceConfig in
// WithDialOptions to replace it.
const ServiceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [
      {"service": "retryd.v1.RetryService", "method": "FailedStep"},
      {"service": "retryd.v1.RetryService", "method": "GetChains"},
      {"service": "retryd.v1.RetryService", "method": "CancelRetries"},
      {"service": "retryd.v1.RetryService", "method": "StepSucceeded"}
    ],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.05s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// honorRetryInfo runs call, and runs it again, at most retries times,
// after the delay a RESOURCE_EXHAUSTED refusal's RetryInfo asks for
// (retryd's admission control records nothing when it refuses, so the
// same request may be sent again). It returns the refusal when ctx's
// deadline would pass during the wait or ctx ends while waiting.
func honorRetryInfo[T any](ctx context.Context, retries int, call func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		resp, err := call()
		if err == nil || attempt >= retries || status.Code(err) != codes.ResourceExhausted {
			return resp, err
		}
		delay, ok := RetryDelay(err)
		if !ok {
			return resp, err
		}
		if deadline, has := ctx.Deadline(); has && time.Until(deadline) < delay {
			return resp, err
		}
		if werr := sleep(ctx, delay); werr != nil {
			return resp, err
		}
	}
}
