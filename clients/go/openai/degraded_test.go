package retrydopenai_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	retryd "github.com/retryd/retryd/clients/go"
	retrydopenai "github.com/retryd/retryd/clients/go/openai"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"
)

// flakyProvider fails the first attempt of every distinct prompt with 503
// and answers the second.
func flakyProvider(t *testing.T) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &req)
		key := ""
		if len(req.Messages) > 0 {
			key = req.Messages[0].Content
		}
		mu.Lock()
		seen[key]++
		n := seen[key]
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, serverError)
			return
		}
		_, _ = io.WriteString(w, completion("ok"))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// decisionCounts reads retryd.client.decisions as (server, local) totals.
func decisionCounts(t *testing.T, reader *sdkmetric.ManualReader) (server, local int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "retryd.client.decisions" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(attribute.Key("retryd.decision.local")); v.AsBool() {
					local += dp.Value
				} else {
					server += dp.Value
				}
			}
		}
	}
	return server, local
}

// TestDegradedEndToEnd runs agents through the openai-go middleware while
// retryd is SIGKILLed and, later, restarted on the same address: no model
// call fails for want of a decision; while retryd is down the decisions
// are local; after the restart they are the server's again.
func TestDegradedEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 10 s")
	}
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	first := retrydtest.Start(t, "--listen", addr)

	reader := sdkmetric.NewManualReader()
	client, err := retryd.New(addr, retryd.WithInsecure(),
		retryd.WithDecisionTimeout(time.Second),
		retryd.WithReattachBackoff(20*time.Millisecond, 200*time.Millisecond),
		retryd.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	policy := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(3),
		Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(100), JitterRatio: proto.Float64(0)}}
	r := retrydopenai.New(client, retrydopenai.WithPolicy(policy))
	provider := flakyProvider(t)
	sdk := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(provider.URL + "/v1/"), option.WithAPIKey("sk-test")},
		r.RequestOptions()...)...)

	const agents = 6
	var calls, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, agents)
	for a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := retrydopenai.ContextWithSession(t.Context(), fmt.Sprintf("degraded-agent-%d", a))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				_, err := sdk.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
					Model:    openai.ChatModelGPT4o,
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("agent %d call %d", a, n))},
				})
				if err != nil {
					failed.Add(1)
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}

	time.Sleep(2 * time.Second)
	serverBefore, localBefore := decisionCounts(t, reader)
	if err := first.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	serverDown, localDown := decisionCounts(t, reader)
	second := retrydtest.Start(t, "--listen", addr)
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	serverEnd, localEnd := decisionCounts(t, reader)

	events, err := retrydtest.Events(t.Context(), second.Conn(t), "")
	if err != nil {
		t.Fatal(err)
	}
	scheduledAfter := 0
	for _, ev := range events {
		if ev.GetScheduled() != nil {
			scheduledAfter++
		}
	}
	t.Logf("model calls %d, failed %d; decisions before the kill: %d server, %d local; while retryd was down: %d server, %d local; after the restart: %d server, %d local; retries the restarted retryd scheduled: %d",
		calls.Load(), failed.Load(), serverBefore, localBefore, serverDown-serverBefore, localDown-localBefore,
		serverEnd-serverDown, localEnd-localDown, scheduledAfter)

	if failed.Load() != 0 {
		t.Errorf("%d of %d model calls failed, e.g. %v", failed.Load(), calls.Load(), <-errs)
	}
	if serverBefore == 0 || localBefore != 0 {
		t.Errorf("before the kill: %d server and %d local decisions; want only server decisions", serverBefore, localBefore)
	}
	if localDown-localBefore == 0 {
		t.Error("no local decision while retryd was down")
	}
	if serverEnd-serverDown == 0 || scheduledAfter == 0 {
		t.Errorf("after the restart: %d server decisions, %d retries in retryd's log; want decisions from the server again", serverEnd-serverDown, scheduledAfter)
	}
	if out, err := exec.Command(retrydtest.Binary(t), "verify", "--server", second.Addr).CombinedOutput(); err != nil {
		t.Errorf("retryd verify --server on the restarted retryd: %v\n%s", err, out)
	}
}
