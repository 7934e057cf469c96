package observability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/loopback"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// lookPath finds a tool of Debian's prometheus package, or skips the test
// with a one-line reason (fails it where RETRYD_REQUIRE_TOOLS=1 says every
// tool is installed).
func lookPath(t *testing.T, name string) string {
	t.Helper()
	return retrydtest.NeedProgram(t, name, "apt-get install -y prometheus")
}

// TestRulesUnderPromtool checks the rule file and runs its unit tests,
// one per alert, with the promtool of the Prometheus the tests run.
func TestRulesUnderPromtool(t *testing.T) {
	t.Parallel()
	promtool := lookPath(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"test", "rules", "alerts_test.yaml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDashboardAndAlertsAgainstPrometheus runs a real Prometheus that
// scrapes a real retryd (on a real redis-server) through a scripted
// scenario, then asks Prometheus' HTTP API for every dashboard query and
// for the alerts: each query must return series, every metric a panel
// names must exist, and the scenario must make every alert fire.
func TestDashboardAndAlertsAgainstPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus, Redis and retryd; skipped in -short")
	}
	t.Parallel()
	prometheus := lookPath(t, "prometheus")
	redis := redistest.Start(t)

	dir := t.TempDir()
	policies := filepath.Join(dir, "policies.yaml")
	const goodPolicies = `providers:
  flaky:
    fleet: {disableBudget: true, minSamples: 2, failureThreshold: 0.5, openForMs: 600000, spreadWindowMs: 0, maxFleetRetryAfterMs: 0}
`
	writeFile(t, policies, goodPolicies)
	srv := retrydtest.Start(t, "--store", redis.URL(0), "--config", policies, "--config-reload-interval", "200ms",
		"--metrics-listen", "127.0.0.1:0", "--max-pending-retries", "3")
	prom := startPrometheus(t, prometheus, dir, srv.MetricsAddr)

	api := retrydv1.NewRetryServiceClient(srv.Conn(t))
	s := &scenario{t: t, api: api}
	// Twice, with a scrape between: a counter's first sample is its
	// baseline, so rate() sees only what the second round adds. Each wait
	// is on what Prometheus has stored, not on a clock, so a loaded
	// machine's slow scrapes only make the test slower.
	prom.waitFor(t, `up{job="retryd"} == 1`)
	s.round("a")
	prom.waitFor(t, `retryd_retries_started_total{job="retryd"} >= 1`)
	s.round("b")
	prom.waitFor(t, `retryd_retries_started_total{job="retryd"} >= 2`)

	t.Run("panels", func(t *testing.T) {
		names := prom.metricNames(t)
		for _, p := range dashboardQueries(t) {
			for _, m := range metricRef.FindAllString(labelRefs.ReplaceAllString(p.expr, ""), -1) {
				if !slices.Contains(names, m) {
					t.Errorf("panel %q queries %s, which retryd does not export", p.title, m)
				}
			}
			expr := strings.NewReplacer(`$job`, "retryd", `$__rate_interval`, "1m").Replace(p.expr)
			if !prom.eventuallyHasSeries(expr, 30*time.Second) {
				t.Errorf("panel %q: %s returned no series", p.title, expr)
			}
		}
	})

	// A policy file that does not validate is refused while the replica
	// serves: the alert fires until the file is fixed. (It is the one
	// alert that ends with the replica: its gauge goes stale then.)
	writeFile(t, policies, goodPolicies+"defaultPolicy: {mode: sometimes}\n")
	prom.waitFor(t, `ALERTS{alertname="RetrydPolicyFileRefused", alertstate="firing"}`)
	writeFile(t, policies, goodPolicies)
	prom.waitFor(t, `retryd_config_last_reload_successful{job="retryd"} == 1`)

	// The store goes away: calls answer UNAVAILABLE while agents keep
	// reporting, then the replica itself stops.
	redis.Kill(syscall.SIGKILL)
	unavailable := s.reportUntil(prom, "RetrydStoreUnavailable", 90*time.Second)
	if unavailable == 0 {
		t.Errorf("no FailedStep answered UNAVAILABLE while Redis was away")
	}
	srv.Stop(t)

	want := []string{"RetrydAdmissionRefusals", "RetrydCircuitOpen", "RetrydDown",
		"RetrydHighDelegationRatio", "RetrydStartLatenessHigh", "RetrydStoreUnavailable"}
	deadline := time.Now().Add(30 * time.Second)
	var firing []string
	for {
		firing = prom.firing(t)
		if slices.Equal(firing, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !slices.Equal(firing, want) {
		t.Errorf("firing alerts\n got %v\nwant %v", firing, want)
	}
	if names, all := alertNames(t), slices.Sorted(slices.Values(append(want, "RetrydPolicyFileRefused"))); !slices.Equal(names, all) {
		t.Errorf("alerts.yaml defines %v; the scenario is written for %v", names, all)
	}
}

// scenario drives retryd as agents do.
type scenario struct {
	t   *testing.T
	api retrydv1.RetryServiceClient
}

// fast is a policy whose retries are due 50 ms after the failure.
var fast = &retrydv1.RetryPolicy{
	Mode:       retrydv1.Mode_MODE_NORMAL,
	MaxRetries: ptr[uint32](2),
	Backoff:    &retrydv1.Backoff{InitialDelayMs: ptr[uint64](50), MaxDelayMs: ptr[uint64](100), JitterRatio: ptr(0.0)},
}

func ptr[T any](v T) *T { return &v }

func (s *scenario) failed(session, provider, code string, p *retrydv1.RetryPolicy) (*retrydv1.FailedStepResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &retrydv1.FailedStepRequest{
		SessionId: session, Turn: 1, Step: 1, Provider: provider,
		Failure: &retrydv1.Failure{Code: code},
	}
	if p != nil {
		req.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: p}
	}
	return s.api.FailedStep(ctx, req)
}

func (s *scenario) mustFail(session, provider, code string, p *retrydv1.RetryPolicy) *retrydv1.FailedStepResponse {
	s.t.Helper()
	resp, err := s.failed(session, provider, code, p)
	if err != nil {
		s.t.Fatalf("FailedStep %s: %v", session, err)
	}
	return resp
}

// round makes every panel's metric move and every alert's condition hold:
// a retry started 1.2 s after its due time and its step then succeeding,
// delegations outnumbering schedules, an open fleet circuit, a cancelled
// retry and admission refusals at --max-pending-retries.
func (s *scenario) round(name string) {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	late := "late-" + name
	resp := s.mustFail(late, "openai", "SERVER", fast)
	id := resp.GetDecision().GetSchedule().GetRetryId()
	if id == "" {
		t.Fatalf("FailedStep %s: %v, want a schedule", late, resp)
	}
	time.Sleep(1200 * time.Millisecond) // the agent comes back late
	stream, err := s.api.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("AwaitRetry %s: %v", late, err)
		}
		if msg.GetStarted() != nil {
			break
		}
	}
	if _, err := s.api.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: late, Turn: 1, Step: 2, Provider: "openai"}); err != nil {
		t.Fatal(err)
	}

	for i := range 8 { // AUTH is not retryable in normal mode
		s.mustFail(fmt.Sprintf("auth-%s-%d", name, i), "openai", "AUTH", nil)
	}
	for i := range 3 { // the second failure opens the circuit
		s.mustFail(fmt.Sprintf("circuit-%s-%d", name, i), "flaky", "SERVER", fast)
	}
	// Drain what the circuit's rounds left pending, then fill the
	// server's three pending retries and meet the bound.
	cancelled := []string{}
	for i := range 5 {
		session := fmt.Sprintf("pending-%s-%d", name, i)
		_, err := s.failed(session, "openai", "SERVER", nil)
		if status.Code(err) == codes.ResourceExhausted {
			continue
		}
		if err != nil {
			t.Fatalf("FailedStep %s: %v", session, err)
		}
		cancelled = append(cancelled, session)
	}
	for i := range 3 {
		cancelled = append(cancelled, fmt.Sprintf("circuit-%s-%d", name, i))
	}
	for _, session := range cancelled {
		if _, err := s.api.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: session}}); err != nil {
			t.Fatalf("CancelRetries %s: %v", session, err)
		}
	}
}

// reportUntil keeps reporting failures, as agents would while the store is
// away, until the alert fires or the time is up; it returns how many
// answered UNAVAILABLE.
func (s *scenario) reportUntil(prom *prometheusServer, alert string, limit time.Duration) int {
	var (
		mu          sync.Mutex
		unavailable int
		wg          sync.WaitGroup
	)
	done := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				_, err := s.failed(fmt.Sprintf("away-%d-%d", w, i), "openai", "SERVER", nil)
				if status.Code(err) == codes.Unavailable {
					mu.Lock()
					unavailable++
					mu.Unlock()
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && !slices.Contains(prom.firing(s.t), alert) {
		time.Sleep(500 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	return unavailable
}

// prometheusServer is a prometheus process of the test's own.
type prometheusServer struct {
	base string
}

// startPrometheus runs Prometheus scraping targets every second, with the
// shipped rules made to fire at once (every `for:` set to 0s: the
// scenario lasts seconds, not the minutes the rules wait for).
func startPrometheus(t *testing.T, bin, dir string, targets ...string) *prometheusServer {
	t.Helper()
	rules, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	immediate := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(rules, []byte("$1 0s"))
	writeFile(t, filepath.Join(dir, "alerts.yaml"), string(immediate))
	var quoted []string
	for _, target := range targets {
		quoted = append(quoted, strconv.Quote(target))
	}
	writeFile(t, filepath.Join(dir, "prometheus.yml"), fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [alerts.yaml]
scrape_configs:
  - job_name: retryd
    static_configs:
      - targets: [%s]
`, strings.Join(quoted, ", ")))
	// Prometheus cannot report a port it picked itself, so it gets one
	// picked free beforehand, on a loopback address of its own, where no
	// other test's server binds it in between.
	host := loopback.Host()
	port, err := loopback.FreePortOn(host)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+addr)
	logs, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logs.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logs.Name())
			t.Logf("prometheus log:\n%s", out)
		}
	})
	p := &prometheusServer{base: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// get decodes the data field of one Prometheus API answer.
func (p *prometheusServer) get(t *testing.T, path string, q url.Values, data any) {
	t.Helper()
	resp, err := http.Get(p.base + path + "?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if body.Status != "success" {
		t.Fatalf("%s %v: %s", path, q, body.Error)
	}
	if err := json.Unmarshal(body.Data, data); err != nil {
		t.Fatal(err)
	}
}

func (p *prometheusServer) metricNames(t *testing.T) []string {
	var names []string
	p.get(t, "/api/v1/label/__name__/values", nil, &names)
	return names
}

// eventuallyHasSeries reports whether the instant query expr returns at
// least one series before limit passes.
func (p *prometheusServer) eventuallyHasSeries(expr string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get(p.base + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
		if err == nil {
			var body struct {
				Data struct {
					Result []json.RawMessage `json:"result"`
				} `json:"data"`
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if err == nil && len(body.Data.Result) > 0 {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitFor waits until the instant query expr returns a series.
func (p *prometheusServer) waitFor(t *testing.T, expr string) {
	t.Helper()
	if !p.eventuallyHasSeries(expr, time.Minute) {
		t.Fatalf("prometheus: %s returned no series within a minute", expr)
	}
}

// firing lists the names of the alerts that fire, sorted and unique.
func (p *prometheusServer) firing(t *testing.T) []string {
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	p.get(t, "/api/v1/alerts", nil, &data)
	var out []string
	for _, a := range data.Alerts {
		if a.State == "firing" {
			out = append(out, a.Labels["alertname"])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// metricRef matches the metric names a PromQL expression of the dashboard
// refers to.
var metricRef = regexp.MustCompile(`\b(?:retryd|rpc_server)_[a-z_]+\b`)

// labelRefs matches the parts of a PromQL expression that name labels, not
// metrics (retryd's labels start with retryd_ too): label matchers and
// by/without lists.
var labelRefs = regexp.MustCompile(`\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)`)

type panelQuery struct{ title, expr string }

func dashboardQueries(t *testing.T) []panelQuery {
	t.Helper()
	data, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	var out []panelQuery
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, panelQuery{p.Title, tg.Expr})
		}
	}
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

// alertNames lists the alerts alerts.yaml defines, sorted.
func alertNames(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s+- alert: (\S+)$`).FindAllSubmatch(data, -1) {
		out = append(out, string(m[1]))
	}
	slices.Sort(out)
	return out
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
