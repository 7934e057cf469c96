package service_test

import (
	"context"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestStartLatenessIsRecorded: every started retry adds one start-lateness
// sample, whether the store answers due times itself (memory, file: a
// service.DueSource) or the service remembers them (redis).
func TestStartLatenessIsRecorded(t *testing.T) {
	t.Parallel()
	eachBackend(t, harnessOpts{telemetry: true}, func(t *testing.T, h *harness) {
		for i := uint64(1); i <= 2; i++ {
			s := h.schedule(failure("s", i, i, "deepseek", "RATE_LIMIT", fast(20)))
			h.start(s.GetRetryId())
			if _, err := h.client.StepSucceeded(context.Background(), &retrydv1.StepSucceededRequest{SessionId: "s", Turn: i, Step: i}); err != nil {
				t.Fatal(err)
			}
		}
		// Observe follows the log in the background.
		deadline := time.Now().Add(10 * time.Second)
		for {
			count, sum := lateness(t, h)
			if count == 2 {
				if sum < 0 || sum > 10 {
					t.Errorf("lateness sum %v s for two 20 ms retries", sum)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d start-lateness samples, want 2", count)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func lateness(t *testing.T, h *harness) (uint64, float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var count uint64
	var sum float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "retryd.retry.start.lateness" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				count += dp.Count
				sum += dp.Sum
			}
		}
	}
	return count, sum
}
