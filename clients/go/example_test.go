package retryd_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"maps"
	"slices"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The examples call the retryd server that TestMain starts; retrydAddr is
// its address (see main_test.go). Each example uses a fresh random session
// id, as every agent session should have its own.

// exactPolicy is an adapter policy without jitter, so the delays the
// examples print are exact: two retries, after 50 ms and then 100 ms.
func exactPolicy() *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{
		Mode:       retrydv1.Mode_MODE_NORMAL,
		MaxRetries: proto.Uint32(2),
		Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(50),
			JitterRatio:    proto.Float64(0),
		},
	}
}

// An agent loop whose model request keeps failing with a rate limit: it
// retries when retryd says so and delegates once the budget is used.
func ExampleClient_Recover() {
	client, err := retryd.New(retrydAddr, retryd.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	sessionID := rand.Text()

	for step := uint64(1); ; step++ {
		// The model request of this step failed with HTTP 429.
		out, err := client.Recover(ctx, &retrydv1.FailedStepRequest{
			SessionId:    sessionID,
			Turn:         1,
			Step:         step,
			Provider:     "anthropic",
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: exactPolicy()},
			Failure:      &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429},
		})
		if err != nil {
			log.Fatal(err)
		}
		switch {
		case out.Retry:
			fmt.Printf("step %d: start retry %d of %d, after %d ms of %v\n", step,
				out.Started.GetRetryNumber(), out.Schedule.GetMaxRetries(),
				out.Schedule.GetDelayMs(), out.Schedule.GetDelaySource())
			continue // send the request again: the next step
		case out.Delegate != nil:
			fmt.Printf("step %d: delegate (%v)\n", step, out.Delegate.GetReason())
		case out.Cancelled != nil:
			fmt.Printf("step %d: retry cancelled (%v)\n", step, out.Cancelled.GetReason())
		}
		break
	}
	// Output:
	// step 1: start retry 1 of 2, after 50 ms of DELAY_SOURCE_BACKOFF
	// step 2: start retry 2 of 2, after 100 ms of DELAY_SOURCE_BACKOFF
	// step 3: delegate (DELEGATE_REASON_BUDGET_EXHAUSTED)
}

// When the agent gives up while a retry backs off (here its context times
// out), Recover cancels the retry on the server and returns ctx.Err().
func ExampleClient_Recover_contextEnds() {
	client, err := retryd.New(retrydAddr, retryd.WithInsecure(),
		retryd.WithReattachBackoff(100*time.Millisecond, 5*time.Second),
		retryd.WithCancelTimeout(2*time.Second),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	slow := exactPolicy()
	slow.Backoff.InitialDelayMs = proto.Uint64(10_000)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	out, err := client.Recover(ctx, &retrydv1.FailedStepRequest{
		SessionId:    rand.Text(),
		Turn:         1,
		Step:         1,
		Provider:     "anthropic",
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: slow},
		Failure:      &retrydv1.Failure{Code: "SERVER", HttpStatus: 503},
	})
	fmt.Println("error is the context's:", errors.Is(err, context.DeadlineExceeded))
	fmt.Println("scheduled delay:", out.Schedule.GetDelayMs(), "ms")
	fmt.Println("server cancelled it:", out.Cancelled.GetReason())
	// Output:
	// error is the context's: true
	// scheduled delay: 10000 ms
	// server cancelled it: CANCEL_REASON_REQUESTED
}

// A successful step closes the session's chains: the next failure is
// retry 1 again.
func ExampleClient_StepSucceeded() {
	client, err := retryd.New(retrydAddr, retryd.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	sessionID := rand.Text()
	fail := func(step uint64) {
		out, err := client.Recover(ctx, &retrydv1.FailedStepRequest{
			SessionId:    sessionID,
			Turn:         1,
			Step:         step,
			Provider:     "anthropic",
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: exactPolicy()},
			Failure:      &retrydv1.Failure{Code: "TIMEOUT"},
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("step %d failed: retry %d\n", step, out.Started.GetRetryNumber())
	}

	fail(1)
	resp, err := client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: sessionID, Turn: 1, Step: 2})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range resp.GetClosed() {
		fmt.Printf("step 2 succeeded: closed the %s chain after %d retry (%v)\n", c.GetProvider(), c.GetRetries(), c.GetReason())
	}
	fail(3)
	// Output:
	// step 1 failed: retry 1
	// step 2 succeeded: closed the anthropic chain after 1 retry (CLOSE_REASON_SUCCEEDED)
	// step 3 failed: retry 1
}

// An agent that lost track of its scheduled retry (it crashed while
// waiting, say) learns its id from the refusal of its next report, and
// awaits it.
func ExampleIsRetryPending() {
	client, err := retryd.New(retrydAddr, retryd.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	sessionID := rand.Text()
	report := func(step uint64) (*retrydv1.FailedStepResponse, error) {
		return client.FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId:    sessionID,
			Turn:         1,
			Step:         step,
			Provider:     "anthropic",
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: exactPolicy()},
			Failure:      &retrydv1.Failure{Code: "TRANSPORT"},
		})
	}

	first, err := report(1) // scheduled, and then forgotten
	if err != nil {
		log.Fatal(err)
	}
	_, err = report(2)
	retryID, pending := retryd.IsRetryPending(err)
	fmt.Println("pending:", pending, "- the forgotten retry:", retryID == first.GetDecision().GetSchedule().GetRetryId())

	term, err := client.AwaitRetry(ctx, retryID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("started retry", term.GetStarted().GetRetryNumber())
	// Output:
	// pending: true - the forgotten retry: true
	// started retry 1
}

// A report the server cannot accept names every bad field.
func ExampleFieldViolations() {
	client, err := retryd.New(retrydAddr, retryd.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	_, err = client.Recover(context.Background(), &retrydv1.FailedStepRequest{
		Provider: "anthropic", // no session id, no failure
	})
	violations := retryd.FieldViolations(err)
	for _, field := range slices.Sorted(maps.Keys(violations)) {
		fmt.Printf("%s: %s\n", field, violations[field])
	}
	// Output:
	// failure: required
	// session_id: required
}

// WatchEvents iterates over a session's event log; StopAtEnd ends the
// iteration once every recorded event was read.
func ExampleClient_WatchEvents() {
	client, err := retryd.New(retrydAddr, retryd.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	sessionID := rand.Text()
	if _, err := client.Recover(ctx, &retrydv1.FailedStepRequest{
		SessionId:    sessionID,
		Turn:         1,
		Step:         1,
		Provider:     "anthropic",
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: exactPolicy()},
		Failure:      &retrydv1.Failure{Code: "EMPTY_RESPONSE"},
	}); err != nil {
		log.Fatal(err)
	}

	for ev, err := range client.WatchEvents(ctx, &retrydv1.WatchEventsRequest{SessionId: sessionID, StopAtEnd: true}) {
		if err != nil {
			log.Fatal(err)
		}
		switch k := ev.GetKind().(type) {
		case *retrydv1.Event_Scheduled:
			fmt.Printf("scheduled retry %d after %d ms\n", k.Scheduled.GetRetryNumber(), k.Scheduled.GetDelayMs())
		case *retrydv1.Event_Started:
			fmt.Printf("started retry %d\n", k.Started.GetRetryNumber())
		default:
			fmt.Printf("%T\n", k)
		}
	}
	// Output:
	// scheduled retry 1 after 50 ms
	// started retry 1
}

// A shared retryd started with --auth-credentials serves only callers
// with a tenant's token. Over TLS, send it with WithBearerToken (and the
// TLS credentials in WithDialOptions); this example's server is on
// loopback, where WithInsecureBearerToken may send it in the clear.
// ProviderState then reads the fleet protection of a provider for the
// token's tenant.
func ExampleWithInsecureBearerToken() {
	client, err := retryd.New(tenantAddr, retryd.WithInsecure(), retryd.WithInsecureBearerToken(exampleToken))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()

	st, err := client.ProviderState(ctx, "deepseek")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("deepseek: protected %v, budget %v of %v, %v\n",
		st.GetProtected(), st.GetBudgetTokens(), st.GetBudgetCapacity(), st.GetCircuit())

	anonymous, err := retryd.New(tenantAddr, retryd.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer anonymous.Close()
	_, err = anonymous.ProviderState(ctx, "deepseek")
	fmt.Println("without a token:", status.Code(err))
	// Output:
	// deepseek: protected true, budget 20 of 20, CIRCUIT_STATE_CLOSED
	// without a token: Unauthenticated
}

// A shared retryd refuses work it cannot hold. This one lets a tenant hold
// one pending retry, so a second session's failure is refused — with
// nothing recorded, so the agent may report it again after the delay the
// server names, or hand it to its next recovery policy.
func ExampleIsLimitReached() {
	client, err := retryd.New(tenantAddr, retryd.WithInsecure(), retryd.WithInsecureBearerToken(exampleToken))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	slow := exactPolicy()
	slow.Backoff.InitialDelayMs = proto.Uint64(10_000)
	report := func(sessionID string) (*retrydv1.FailedStepResponse, error) {
		return client.FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId:    sessionID,
			Turn:         1,
			Step:         1,
			Provider:     "anthropic",
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: slow},
			Failure:      &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429},
		})
	}

	first, err := report(rand.Text()) // its retry is pending for 10 s
	if err != nil {
		log.Fatal(err)
	}
	_, err = report(rand.Text())
	if bound, full := retryd.IsLimitReached(err); full {
		delay, _ := retryd.RetryDelay(err)
		fmt.Printf("refused: %s is full; report again in %v or delegate\n", bound, delay)
	}

	// The first session's agent gives up: its place is free again.
	if _, err := client.CancelRetry(ctx, first.GetDecision().GetSchedule().GetRetryId()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// refused: pending_retries_per_tenant is full; report again in 1s or delegate
}
