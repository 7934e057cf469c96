package observability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// storeGauges are the population gauges whose value is the whole store's:
// on Redis every replica reports the same number, so a dashboard that adds
// the replicas' series up shows that number times the replica count.
var storeGauges = []string{"retryd_retries_pending", "retryd_chains_open", "retryd_sessions"}

// TestDashboardOnReplicas runs two retryd replicas on one redis-server,
// both scraped by a real Prometheus, leaves a known population in the
// store (sessions with a pending retry, with a started retry whose chain
// is still open, and with a cancelled retry whose chain closed) and held
// AwaitRetry streams on each replica, then evaluates each panel's query
// over those metrics: a store-wide panel must show the store's count
// (which the test also reads back through GetChains), the awaiters panel
// each replica's own streams.
func TestDashboardOnReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus, Redis and two retryd replicas; skipped in -short")
	}
	t.Parallel()
	prometheus := lookPath(t, "prometheus")
	redis := redistest.Start(t)
	dir := t.TempDir()
	replicas := []*retrydtest.Server{
		retrydtest.Start(t, "--store", redis.URL(0), "--metrics-listen", "127.0.0.1:0"),
		retrydtest.Start(t, "--store", redis.URL(0), "--metrics-listen", "127.0.0.1:0"),
	}
	prom := startPrometheus(t, prometheus, dir, replicas[0].MetricsAddr, replicas[1].MetricsAddr)
	apis := []retrydv1.RetryServiceClient{
		retrydv1.NewRetryServiceClient(replicas[0].Conn(t)),
		retrydv1.NewRetryServiceClient(replicas[1].Conn(t)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// slow retries stay pending for the whole test.
	slow := &retrydv1.RetryPolicy{
		Mode:       retrydv1.Mode_MODE_NORMAL,
		MaxRetries: ptr[uint32](2),
		Backoff:    &retrydv1.Backoff{InitialDelayMs: ptr[uint64](600_000), MaxDelayMs: ptr[uint64](600_000), JitterRatio: ptr(0.0)},
	}
	fail := func(api retrydv1.RetryServiceClient, session string, p *retrydv1.RetryPolicy) string {
		t.Helper()
		resp, err := api.FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 1, Step: 1, Provider: "openai",
			Failure:      &retrydv1.Failure{Code: "SERVER"},
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: p},
		})
		if err != nil {
			t.Fatalf("FailedStep %s: %v", session, err)
		}
		id := resp.GetDecision().GetSchedule().GetRetryId()
		if id == "" {
			t.Fatalf("FailedStep %s: %v, want a schedule", session, resp)
		}
		return id
	}

	// The load, spread over both replicas (replica i%2):
	//   pending:   a retry due in 10 minutes      session, open chain, pending retry
	//   started:   a retry awaited until Started  session, open chain
	//   cancelled: a retry cancelled              session
	const nPending, nStarted, nCancelled = 5, 2, 3
	var sessions []string
	pendingIDs := map[int][]string{} // replica -> its pending retries
	for i := range nPending {
		session := fmt.Sprintf("pending-%d", i)
		pendingIDs[i%2] = append(pendingIDs[i%2], fail(apis[i%2], session, slow))
		sessions = append(sessions, session)
	}
	for i := range nStarted {
		session := fmt.Sprintf("started-%d", i)
		id := fail(apis[i%2], session, fast)
		stream, err := apis[i%2].AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id})
		if err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("AwaitRetry %s: %v", session, err)
			}
			if msg.GetStarted() != nil {
				break
			}
		}
		sessions = append(sessions, session)
	}
	for i := range nCancelled {
		session := fmt.Sprintf("cancelled-%d", i)
		fail(apis[i%2], session, slow)
		if _, err := apis[(i+1)%2].CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: session}}); err != nil {
			t.Fatalf("CancelRetries %s: %v", session, err)
		}
		sessions = append(sessions, session)
	}
	truth := map[string]float64{
		"retryd_sessions":        nPending + nStarted + nCancelled,
		"retryd_chains_open":     nPending + nStarted,
		"retryd_retries_pending": nPending,
	}

	// What the store holds, read back through the API on either replica:
	// the load must have left exactly the population above.
	read := map[string]float64{}
	for i, session := range sessions {
		resp, err := apis[(i+1)%2].GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: session})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			t.Fatalf("GetChains %s: %v", session, err)
		}
		read["retryd_sessions"]++
		for _, c := range resp.GetChains() {
			if c.GetOpen() {
				read["retryd_chains_open"]++
			}
			if c.GetLatest().GetStatus() == retrydv1.RetryStatus_RETRY_STATUS_PENDING {
				read["retryd_retries_pending"]++
			}
		}
	}
	for _, m := range storeGauges {
		if read[m] != truth[m] {
			t.Fatalf("GetChains shows %s = %v, the load left %v", m, read[m], truth[m])
		}
	}

	// Awaiters are each replica's own streams: two on replica 0, one on
	// replica 1, held until the test ends.
	wantAwaiters := map[string]float64{}
	for r, n := range []int{2, 1} {
		for i := range n {
			stream, err := apis[r].AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: pendingIDs[r][i]})
			if err != nil {
				t.Fatal(err)
			}
			if msg, err := stream.Recv(); err != nil || msg.GetState() == nil {
				t.Fatalf("AwaitRetry %s: %v, %v; want its state first", pendingIDs[r][i], msg, err)
			}
		}
		wantAwaiters[replicas[r].MetricsAddr] = float64(n)
	}

	// Both replicas scraped after the load: every sample from now on
	// reports it.
	after := time.Now().Add(time.Second).Unix()
	prom.waitFor(t, fmt.Sprintf(`count(timestamp(retryd_sessions{job="retryd"}) > %d) == 2`, after))

	checked := map[string]int{}
	for _, p := range dashboardQueries(t) {
		expr := strings.NewReplacer(`$job`, "retryd", `$__rate_interval`, "1m").Replace(p.expr)
		for _, m := range storeGauges {
			if !strings.Contains(p.expr, m+"{") {
				continue
			}
			checked[m]++
			got := prom.instant(t, expr)
			if len(got) != 1 {
				t.Errorf("panel %q: %s returned %d series, want one: the store's %s", p.title, expr, len(got), m)
				continue
			}
			for _, v := range got {
				if v != truth[m] {
					t.Errorf("panel %q: %s = %v with %d replicas; the store holds %v", p.title, expr, v, len(replicas), truth[m])
				}
			}
		}
		if strings.Contains(p.expr, "retryd_awaiters{") {
			checked["retryd_awaiters"]++
			got := prom.instant(t, expr)
			byInstance := map[string]float64{}
			for labels, v := range got {
				byInstance[labels.get("instance")] = v
			}
			if fmt.Sprint(byInstance) != fmt.Sprint(wantAwaiters) {
				t.Errorf("panel %q: %s = %v; each replica holds %v", p.title, expr, byInstance, wantAwaiters)
			}
		}
	}
	for _, m := range append(storeGauges, "retryd_awaiters") {
		if checked[m] == 0 {
			t.Errorf("no panel queries %s", m)
		}
	}
}

// seriesLabels is a series' label set, as Prometheus' API prints it.
type seriesLabels string

func (l seriesLabels) get(name string) string {
	var m map[string]string
	_ = json.Unmarshal([]byte(l), &m)
	return m[name]
}

// instant evaluates expr now and returns each series' value by its labels.
func (p *prometheusServer) instant(t *testing.T, expr string) map[seriesLabels]float64 {
	t.Helper()
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric json.RawMessage `json:"metric"`
			Value  [2]any          `json:"value"`
		} `json:"result"`
	}
	p.get(t, "/api/v1/query", url.Values{"query": {expr}}, &data)
	if data.ResultType != "vector" {
		t.Fatalf("%s: a %s, want a vector", expr, data.ResultType)
	}
	out := map[seriesLabels]float64{}
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%s: value %v: %v", expr, r.Value[1], err)
		}
		out[seriesLabels(r.Metric)] = v
	}
	return out
}
