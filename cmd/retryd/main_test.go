package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/invariant"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
)

func policy(initialMs uint64) *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(initialMs), MaxDelayMs: proto.Uint64(60_000), JitterRatio: proto.Float64(0),
	}}
}

func TestHealthAndReflection(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	conn := srv.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"", "retryd.v1.RetryService"} {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v, want SERVING", name, resp, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, ","), "retryd.v1.RetryService") {
		t.Errorf("reflection lists %v, want retryd.v1.RetryService", names)
	}
}

// TestShutdownFailsClosed: on SIGTERM every pending awaiter receives
// Cancelled (reason shutdown) and the process exits 0 within its bound.
func TestShutdownFailsClosed(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t, "--shutdown-timeout", "5s")
	conn := srv.Conn(t)
	client := retrydv1.NewRetryServiceClient(conn)
	ctx := context.Background()
	resp, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: "s", Turn: 1, Step: 1, Provider: "p",
		Failure:      &retrydv1.Failure{Code: "SERVER"},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: policy(30_000)},
	})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: resp.GetDecision().GetSchedule().GetRetryId()})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := stream.Recv(); err != nil || first.GetState() == nil {
		t.Fatalf("first message: %v %v", first, err)
	}
	// Make sure the log we verify is the one before shutdown.
	evs := retrydtest.Verify(t, conn)
	if len(evs) != 1 {
		t.Fatalf("%d events before shutdown, want 1", len(evs))
	}
	start := time.Now()
	if err := srv.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	term, err := stream.Recv()
	if err != nil {
		t.Fatalf("awaiter got %v, want a Cancelled message", err)
	}
	if c := term.GetCancelled(); c.GetReason() != retrydv1.CancelReason_CANCEL_REASON_SHUTDOWN {
		t.Errorf("awaiter got %v, want cancelled(shutdown)", term)
	}
	if err := srv.Wait(10 * time.Second); err != nil {
		t.Errorf("exit: %v\n%s", err, srv.Logs())
	}
	t.Logf("shutdown took %v", time.Since(start))
	if !strings.Contains(srv.Logs(), `"msg":"stopped"`) {
		t.Errorf("no stopped log line:\n%s", srv.Logs())
	}
}

func TestCheckConfig(t *testing.T) {
	t.Parallel()
	bin := retrydtest.Binary(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	// A provider's retryPolicy block from the harness pastes in unchanged.
	writeFile(t, good, `
policies:
  relay:
    mode: schedule
    schedule: [2000, 5000, 5000, 5000, 10000]
    tailDelayMs: 20000
providers:
  deepseek:
    retryPolicy:
      mode: always
      backoff:
        initialDelayMs: 1000
        maxDelayMs: 30000
        jitterRatio: 0.2
`)
	out, err := exec.Command(bin, "check-config", "--config", good).CombinedOutput()
	if err != nil {
		t.Fatalf("check-config good: %v\n%s", err, out)
	}
	for _, want := range []string{
		"policy relay: schedule;max=inf;",
		"provider deepseek: always;max=inf;backoff=1000..30000*2;jitter=symmetric:0.2;over_cap=local;min_attempt=100",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check-config output lacks %q:\n%s", want, out)
		}
	}
	bad := []struct{ name, yaml, want string }{
		{"negative-like zero initial", "providers:\n  p:\n    retryPolicy:\n      backoff: {initialDelayMs: 0}\n", "providers.p.retryPolicy.backoff.initialDelayMs"},
		{"unknown key", "policies:\n  x:\n    maxRetrys: 3\n", "policies.x"},
		{"unknown mode", "policies:\n  x:\n    mode: sometimes\n", "policies.x"},
		{"bare star", "policies:\n  x:\n    retryableCodes: ['*']\n", "policies.x.retryableCodes[0]"},
		{"unknown top-level", "polices: {}\n", "polices"},
	}
	for _, b := range bad {
		path := filepath.Join(dir, strings.ReplaceAll(b.name, " ", "-")+".yaml")
		writeFile(t, path, b.yaml)
		out, err := exec.Command(bin, "check-config", "--config", path).CombinedOutput()
		if err == nil || !strings.Contains(string(out), b.want) {
			t.Errorf("check-config %s: err %v, output %q; want failure naming %s", b.name, err, out, b.want)
		}
	}
}

func TestBadFlagsAndEnv(t *testing.T) {
	t.Parallel()
	bin := retrydtest.Binary(t)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "RETRYD_CHAIN_TTL=forever")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "RETRYD_CHAIN_TTL") {
		t.Errorf("bad env: %v %q, want an error naming RETRYD_CHAIN_TTL", err, out)
	}
	out, err = exec.Command(bin, "serve", "--listen", "nowhere", "--log-format", "xml").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "listen") || !strings.Contains(string(out), "log-format") {
		t.Errorf("bad flags: %v %q, want errors naming listen and log-format", err, out)
	}
}

// TestVerify drives a server, saves its event log as JSON lines, and checks
// that `retryd verify` accepts it (from the file and from the live server)
// and rejects a log with a duplicated Started.
func TestVerify(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	conn := srv.Conn(t)
	client := retrydv1.NewRetryServiceClient(conn)
	ctx := context.Background()
	resp, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: "s", Turn: 1, Step: 1, Provider: "p",
		Failure:      &retrydv1.Failure{Code: "SERVER"},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: policy(5)},
	})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: resp.GetDecision().GetSchedule().GetRetryId()})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	events := retrydtest.Verify(t, conn)
	bin := retrydtest.Binary(t)
	if out, err := exec.Command(bin, "verify", "--server", srv.Addr).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "2 events, 0 violations") {
		t.Errorf("verify --server: %v\n%s", err, out)
	}
	good := filepath.Join(t.TempDir(), "good.jsonl")
	writeEvents(t, good, events)
	if out, err := exec.Command(bin, "verify", "--file", good).CombinedOutput(); err != nil {
		t.Errorf("verify good log: %v\n%s", err, out)
	}
	dup := proto.Clone(events[1]).(*retrydv1.Event)
	dup.Sequence = 3
	badPath := filepath.Join(t.TempDir(), "bad.jsonl")
	writeEvents(t, badPath, append(events, dup))
	out, err := exec.Command(bin, "verify", "--file", badPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "1 violations") {
		t.Errorf("verify log with a repeated Started: %v\n%s", err, out)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeEvents(t *testing.T, path string, events []*retrydv1.Event) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := invariant.WriteJSONLines(f, events); err != nil {
		t.Fatal(err)
	}
}

// TestMetrics scrapes /metrics of the real binary after a scripted
// sequence: one retry scheduled and started, one delegation, one cancel.
func TestMetrics(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t, "--metrics-listen", "127.0.0.1:0")
	conn := srv.Conn(t)
	client := retrydv1.NewRetryServiceClient(conn)
	ctx := context.Background()
	fail := func(session string, p *retrydv1.RetryPolicy, provider string) *retrydv1.FailedStepResponse {
		t.Helper()
		resp, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 1, Step: 1, Provider: provider,
			Failure: &retrydv1.Failure{Code: "SERVER"}, PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: p},
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	s := fail("a", policy(5), "deepseek").GetDecision().GetSchedule()
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: s.GetRetryId()})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	fail("b", policy(5), "")
	c := fail("c", policy(60_000), "openai").GetDecision().GetSchedule()
	if _, err := client.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
		Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: c.GetRetryId()}}); err != nil {
		t.Fatal(err)
	}
	retrydtest.Verify(t, conn)

	want := []string{
		// The attributes the spans use, dots as underscores.
		`retryd_attempts_failed_total{gen_ai_provider_name="deepseek"} 1`,
		`retryd_decisions_total{gen_ai_provider_name="deepseek",retryd_decision="schedule",retryd_delay_source="backoff",retryd_mode="normal"} 1`,
		`retryd_decisions_total{gen_ai_provider_name="none",retryd_decision="delegate",retryd_delegate_reason="no_provider",retryd_mode="none"} 1`,
		`retryd_retries_started_total`,
		`retryd_retries_cancelled_total{retryd_cancel_reason="requested"} 1`,
		`retryd_decision_duration_seconds_bucket`,
		`retryd_retry_start_lateness_seconds_count`,
		"# TYPE retryd_sessions gauge",
		`rpc_server_call_duration_seconds_bucket`,
	}
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + srv.MetricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		if metricValue(body, "retryd_retries_cancelled_total") == 1 {
			break
		}
	}
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("/metrics lacks %s", w)
		}
	}
	for name, v := range map[string]float64{
		"retryd_attempts_failed_total": 3, "retryd_decisions_total": 3, "retryd_retries_started_total": 1,
		"retryd_retries_cancelled_total": 1, "retryd_retry_start_lateness_seconds_count": 1, "retryd_sessions": 3,
		"retryd_retries_pending": 0, "retryd_chains_open": 1,
	} {
		if got := metricValue(body, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(line, "session") && strings.Contains(line, `="a"`) {
			t.Errorf("a session id leaked into a label: %s", line)
		}
	}
}

// metricValue sums the samples of one metric name in a Prometheus text
// exposition.
func metricValue(body, name string) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}
