// Command consumer is an agent's program outside the repository: a module
// of its own that requires github.com/retryd/retryd/clients/go at a release
// and reports one failed model request to the retryd at its argument.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

func main() {
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := retryd.New(addr, retryd.WithInsecure())
	if err != nil {
		return err
	}
	defer client.Close()
	resp, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: "release-consumer", Turn: 1, Step: 1, Provider: "deepseek",
		Failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429},
	})
	if err != nil {
		return err
	}
	s := resp.GetDecision().GetSchedule()
	if s == nil {
		return fmt.Errorf("FailedStep answered %v, want a scheduled retry", resp.GetDecision())
	}
	fmt.Printf("scheduled retry %d of %d, id %s\n", s.GetRetryNumber(), s.GetMaxRetries(), s.GetRetryId())
	return nil
}
