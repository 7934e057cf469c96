package retryd_test

import (
	"fmt"
	"net/http"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// A provider answered 429: the classification carries the code, the
// status and the provider's delay; the caller adds its session, turn,
// step and provider and reports it with Recover.
func ExampleClassify() {
	header := http.Header{}
	header.Set("retry-after-ms", "1500")
	c := retryd.Classify(retryd.ProviderFailure{
		Status: http.StatusTooManyRequests,
		Header: header,
		Body:   []byte(`{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`),
	})
	req := c.Apply(&retrydv1.FailedStepRequest{SessionId: "s1", Turn: 1, Step: 1, Provider: "openai"})
	fmt.Println(req.GetFailure().GetCode(), req.GetFailure().GetHttpStatus(), req.GetFailure().GetProviderRetryAfterMs(), req.GetReplay())

	// Out of credit is a 429 too, but not one to wait for.
	quota := retryd.Classify(retryd.ProviderFailure{
		Status: http.StatusTooManyRequests,
		Body:   []byte(`{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`),
	})
	fmt.Println(quota.Failure.GetCode())

	// Anthropic's overloaded_error inside a 200 stream, after text was
	// shown to the user: a retry would show a second answer.
	stream := retryd.Classify(retryd.ProviderFailure{
		Status:      http.StatusOK,
		Body:        []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`),
		OutputShown: true,
	})
	fmt.Println(stream.Failure.GetCode(), stream.Replay)
	// Output:
	// RATE_LIMIT 429 1500 REPLAY_SAFE
	// QUOTA
	// SERVER REPLAY_UNSAFE
}
