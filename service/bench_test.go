package service_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/server"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/memory"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/protobuf/proto"
)

// BenchmarkFailedStep measures one decision through the service in
// process: validation, policy resolution, telemetry (a real metrics SDK,
// as with --metrics-listen, and no tracing) and the memory store, without
// gRPC. Each case is one entry of retryd-bench's mix; an op is one
// FailedStep on one of 1024 sessions, followed by CancelRetries of the
// session when it scheduled a retry (as the load does), so allocs/op
// counts both calls. The always case reports each step twice
// (downstream_first, then declined).
//
//	go test -run '^$' -bench FailedStep -benchmem ./service/
func BenchmarkFailedStep(b *testing.B) {
	for _, bc := range benchCases() {
		b.Run(bc.name, func(b *testing.B) { benchFailedStep(b, bc, false) })
	}
}

// BenchmarkFailedStepDeployed is BenchmarkFailedStep as retryd serves by
// default: admission control on with the server's default bounds, and the
// event-log observer (Observe) running in its own goroutine, as
// server.Run starts it. Its work is on another goroutine, so ns/op leaves
// it out; cpu-ns/op is the process's CPU time (user and system, all
// goroutines, the collector included) per op, the figure to compare. It
// overstates what the observer's wake-ups cost a server: pacing them took
// a sixth off cpu-ns/op here and nothing off retryd's CPU per call under
// retryd-bench's load, where they put no more threads on a CPU
// (docs/benchmarks.md). Confirm a gain here under load before keeping
// it.
//
//	go test -run '^$' -bench FailedStepDeployed -benchmem ./service/
func BenchmarkFailedStepDeployed(b *testing.B) {
	for _, bc := range benchCases() {
		b.Run(bc.name, func(b *testing.B) { benchFailedStep(b, bc, true) })
	}
}

// benchCase is one entry of retryd-bench's FailedStep mix.
type benchCase struct {
	name     string
	provider string
	policy   *retrydv1.RetryPolicy
	failure  *retrydv1.Failure
	always   bool
}

func benchCases() []benchCase {
	full := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(5),
		Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(200), MaxDelayMs: proto.Uint64(5000),
			Multiplier: proto.Float64(2), Jitter: retrydv1.Jitter_JITTER_FULL}}
	return []benchCase{
		{"default-policy", "deepseek", nil, &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429}, false},
		{"inline-schedule", "anthropic", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE},
			&retrydv1.Failure{Code: "HTTP_529", HttpStatus: 529}, false},
		{"inline-full-jitter", "openai", full, &retrydv1.Failure{Code: "TRANSPORT"}, false},
		{"delegated", "deepseek", nil, &retrydv1.Failure{Code: "INVALID_REQUEST", HttpStatus: 400}, false},
		{"inline-always", "openai", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS},
			&retrydv1.Failure{Code: "SERVER", HttpStatus: 500}, true},
	}
}

func benchFailedStep(b *testing.B, bc benchCase, deployed bool) {
	store := memory.New(memory.Config{})
	defer store.Close()
	opts := []service.Option{service.WithMeterProvider(
		sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))}
	if deployed {
		defaults := server.DefaultConfig()
		opts = append(opts, service.WithLimits(defaults.Limits()))
	}
	svc, err := service.New(store, opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if deployed {
		octx, stop := context.WithCancel(ctx)
		observed := make(chan error, 1)
		go func() { observed <- svc.Observe(octx) }()
		defer func() {
			stop()
			if err := <-observed; err != nil {
				b.Error(err)
			}
		}()
	}
	const sessions = 1024
	ids := make([]string, sessions)
	steps := make([]uint64, sessions)
	for i := range ids {
		ids[i] = "bench-session-" + strconv.Itoa(i)
	}
	report := func(i int, ds retrydv1.Downstream) {
		// A fresh request per call, as gRPC decodes one; its policy and
		// failure are shared (a decoded request's would be fresh too).
		req := &retrydv1.FailedStepRequest{SessionId: ids[i], Turn: 1, Step: steps[i],
			Provider: bc.provider, Failure: bc.failure, Downstream: ds}
		if bc.policy != nil {
			req.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: bc.policy}
		}
		resp, err := svc.FailedStep(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetDecision().GetSchedule() != nil {
			if _, err := svc.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
				Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: ids[i]}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	began := cpuTime(b)
	n := 0
	for ; b.Loop(); n++ {
		i := n % sessions
		steps[i]++
		report(i, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED)
		if bc.always {
			report(i, retrydv1.Downstream_DOWNSTREAM_DECLINED)
		}
	}
	if deployed && n > 0 {
		b.ReportMetric(float64(cpuTime(b)-began)/float64(n), "cpu-ns/op")
	}
}

// cpuTime is the process's CPU time so far (user and system).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFailedStepStorm measures the decision a provider outage asks
// for most, in process: each op is a new session's first failure (the
// default policy schedules retry 1), and nothing is cancelled, so the
// store holds every session until it expires, as in retryd-bench's
// --storm. allocs/op is the schedule path's allocations per FailedStep
// (docs/benchmarks.md names what each is for).
//
//	go test -run '^$' -bench FailedStepStorm -benchmem ./service/
func BenchmarkFailedStepStorm(b *testing.B) {
	store := memory.New(memory.Config{})
	defer store.Close()
	svc, err := service.New(store, service.WithMeterProvider(
		sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	failure := &retrydv1.Failure{Code: "SERVER", HttpStatus: 503}
	ids := make([]string, 0, 1<<20)
	b.ReportAllocs()
	n := 0
	for ; b.Loop(); n++ {
		if n == len(ids) {
			b.StopTimer()
			for i := range 4096 {
				ids = append(ids, "storm-"+strconv.Itoa(n+i))
			}
			b.StartTimer()
		}
		resp, err := svc.FailedStep(ctx, &retrydv1.FailedStepRequest{SessionId: ids[n], Turn: 1, Step: 1,
			Provider: "deepseek", Failure: failure})
		if err != nil || resp.GetDecision().GetSchedule() == nil {
			b.Fatalf("FailedStep: %v %v, want scheduled", resp.GetDecision(), err)
		}
	}
}
