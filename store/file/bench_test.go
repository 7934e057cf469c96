package file_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/file"
	"github.com/retryd/retryd/store/memory"
)

// BenchmarkFailedStep measures decisions through the store (no gRPC), each
// a first failure of a fresh session, from 32 goroutines per CPU as a busy
// server's handlers would call it: file against memory, so
// docs/benchmarks.md can state what durability costs. Run it with
//
//	go test -run '^$' -bench FailedStep -benchtime 5s ./store/file/
func BenchmarkFailedStep(b *testing.B) {
	for _, backend := range []struct {
		name string
		open func(b *testing.B) store.Backend
	}{
		{"memory", func(b *testing.B) store.Backend {
			s := memory.New(memory.Config{})
			b.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"file", func(b *testing.B) store.Backend {
			s, err := file.Open(b.TempDir(), memory.Config{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
	} {
		b.Run(backend.name, func(b *testing.B) {
			s := backend.open(b)
			p, err := policy.Resolve(nil)
			if err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, err := store.New(s).FailedStep(context.Background(), engine.Failure{
						Request: &retrydv1.FailedStepRequest{SessionId: fmt.Sprintf("s-%d", n.Add(1)), Turn: 1, Step: 1,
							Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}},
						Policy: p,
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
