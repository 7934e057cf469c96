package retryd

import (
	"errors"
	"math"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// BenchmarkLocalDecision is the client's cost of one degraded-mode
// schedule decision (policy, chain, event record), without the wait:
//
//	go test -C clients/go -run '^$' -bench 'LocalDecision|ServerDecision' -benchmem .
func BenchmarkLocalDecision(b *testing.B) {
	c := NewFromConn(nil, WithLocalRetryBudget(math.MaxUint32))
	p := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE}
	req := &retrydv1.FailedStepRequest{SessionId: "bench", Turn: 1, Provider: "openai",
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: p},
		Failure:      &retrydv1.Failure{Code: "SERVER", HttpStatus: 503}}
	cause := errors.New("unavailable")
	now := time.Now()
	b.ReportAllocs()
	step := uint64(0)
	for b.Loop() {
		step++
		req.Step = step
		out, err := c.decideLocally(req, now, cause)
		if err != nil || out.Schedule == nil {
			b.Fatalf("decision %d: %+v, %v", step, out, err)
		}
	}
}
