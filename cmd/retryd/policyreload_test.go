package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// configMapDir lays a policy file out as the kubelet mounts a ConfigMap
// key: DIR/config.yaml → ..data/config.yaml, ..data → a timestamped
// directory; swap replaces the content the kubelet's way (a new directory,
// then an atomic rename of the ..data symlink), so the path never changes.
type configMapDir struct {
	t   *testing.T
	dir string
	n   int
}

func newConfigMapDir(t *testing.T, content string) *configMapDir {
	d := &configMapDir{t: t, dir: t.TempDir()}
	d.swap(content)
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), d.path()); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *configMapDir) path() string { return filepath.Join(d.dir, "config.yaml") }

func (d *configMapDir) swap(content string) {
	d.t.Helper()
	d.n++
	ts := filepath.Join(d.dir, "..2026_12_01_00_00_0"+string(rune('0'+d.n)))
	if err := os.Mkdir(ts, 0o755); err != nil {
		d.t.Fatal(err)
	}
	writeFile(d.t, filepath.Join(ts, "config.yaml"), content)
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
}

func openaiPolicy(initialMs int) string {
	return "providers:\n  openai:\n    retryPolicy:\n      maxRetries: 5\n" +
		"      backoff: {initialDelayMs: " + itoa(initialMs) + ", maxDelayMs: 60000, jitterRatio: 0}\n"
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestPolicyReload: the policy file is reloaded while serving, through a
// ConfigMap-style symlink swap: new failures are decided with the new
// policy (a new policy key, so a chain of its own), a retry decided
// before keeps the policy it was decided with, and a file that does not
// validate is refused — logged with its field, counted, and reported by
// the health service retryd.config — while the last good policies keep
// deciding and the server stays SERVING; fixing the file recovers.
func TestPolicyReload(t *testing.T) {
	t.Parallel()
	cm := newConfigMapDir(t, openaiPolicy(1500))
	srv := retrydtest.Start(t, "--config", cm.path(), "--config-reload-interval", "100ms", "--metrics-listen", "127.0.0.1:0")
	client := retrydv1.NewRetryServiceClient(srv.Conn(t))
	health := healthpb.NewHealthClient(srv.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	healthOf := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health of %q: %v", service, err)
		}
		return resp.GetStatus()
	}
	metrics := func() string {
		t.Helper()
		resp, err := http.Get("http://" + srv.MetricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := healthOf("retryd.config"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of retryd.config at start: %v, want SERVING", got)
	}
	fail := func(session string, step uint64) *retrydv1.Schedule {
		t.Helper()
		resp, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 1, Step: step, Provider: "openai", Failure: &retrydv1.Failure{Code: "SERVER"}})
		if err != nil {
			t.Fatal(err)
		}
		s := resp.GetDecision().GetSchedule()
		if s == nil {
			t.Fatalf("%s step %d: %v, want a schedule", session, step, resp)
		}
		return s
	}

	a := fail("s1", 1)
	keyA := a.GetPolicyKey()
	if a.GetDelayMs() != 1500 || keyA == "" {
		t.Fatalf("before the reload: delay %d ms, key %q; want 1500 ms from the file", a.GetDelayMs(), keyA)
	}

	cm.swap(openaiPolicy(200))
	waitFor(t, 10*time.Second, "the swapped file to be reloaded", func() bool {
		return strings.Contains(srv.Logs(), "policy file reloaded")
	})
	b := fail("s2", 1)
	keyB := b.GetPolicyKey()
	if b.GetDelayMs() != 200 || keyB == keyA {
		t.Fatalf("after the reload: delay %d ms, key %q (before: %q); want 200 ms under a new key", b.GetDelayMs(), keyB, keyA)
	}

	// The retry decided before the reload starts when its own policy said.
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: a.GetRetryId()})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	sched := first.GetState().GetScheduled()
	if sched.GetPolicyKey() != keyA || sched.GetDelayMs() != 1500 ||
		sched.GetPolicy().GetBackoff().GetInitialDelayMs() != 1500 {
		t.Errorf("the pending retry after the reload: key %q, delay %d, policy %v; want its own (%q, 1500 ms)",
			sched.GetPolicyKey(), sched.GetDelayMs(), sched.GetPolicy(), keyA)
	}
	var started *retrydv1.RetryStarted
	for started == nil {
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		started = m.GetStarted()
	}
	if due := a.GetDueAt().AsTime(); started.GetStartedAt().AsTime().Before(due) {
		t.Errorf("the old retry started at %v, before its due time %v", started.GetStartedAt().AsTime(), due)
	}

	// The next failure of that session is decided with the new policy, in
	// a chain of its own: retry 1 under key B beside retry 1 under key A.
	next := fail("s1", 2)
	if next.GetPolicyKey() != keyB || next.GetRetryNumber() != 1 {
		t.Errorf("s1's next failure: key %q retry %d, want %q retry 1", next.GetPolicyKey(), next.GetRetryNumber(), keyB)
	}
	chains, err := client.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]uint32{}
	for _, c := range chains.GetChains() {
		keys[c.GetPolicyKey()] = c.GetRetries()
	}
	if len(keys) != 2 || keys[keyA] != 1 || keys[keyB] != 1 {
		t.Errorf("s1's chains: %v, want one retry under each of %q and %q", keys, keyA, keyB)
	}

	// A file that does not validate is refused, naming the field.
	writeFile(t, cm.path(), strings.Replace(openaiPolicy(300), "jitterRatio: 0", "jitterRatio: 7", 1))
	waitFor(t, 10*time.Second, "the bad file to be refused", func() bool {
		return strings.Contains(srv.Logs(), "policy file reload refused")
	})
	if logs := srv.Logs(); !strings.Contains(logs, `"field":"providers.openai.retryPolicy.backoff.jitterRatio"`) {
		t.Errorf("the refusal does not name the field:\n%s", logs)
	}
	if c := fail("s3", 1); c.GetPolicyKey() != keyB || c.GetDelayMs() != 200 {
		t.Errorf("after the refused file: key %q delay %d, want the last good policy's %q, 200 ms", c.GetPolicyKey(), c.GetDelayMs(), keyB)
	}
	// The health of the policy file says the change did not apply; the
	// server keeps serving the last good policies.
	if got := healthOf("retryd.config"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health of retryd.config after the refused file: %v, want NOT_SERVING", got)
	}
	for _, service := range []string{"", "retryd.v1.RetryService"} {
		if got := healthOf(service); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q after the refused file: %v, want SERVING (the last good policies decide)", service, got)
		}
	}

	body := metrics()
	for _, want := range []string{`result="applied"} 1`, `result="refused"} 1`} {
		if !strings.Contains(body, want) || metricValue(body, "retryd_config_reload_total") != 2 {
			t.Errorf("retryd_config_reload_total lacks %s:\n%s", want, grepLines(body, "retryd_config"))
		}
	}
	if !strings.Contains(body, "retryd_config_loaded_seconds{retryd_config_sha256=") {
		t.Errorf("no retryd_config_loaded_seconds with the file's hash:\n%s", grepLines(body, "retryd_config"))
	}
	if !strings.Contains(body, "\nretryd_config_last_reload_successful 0\n") {
		t.Errorf("retryd_config_last_reload_successful is not 0 after the refused file:\n%s", grepLines(body, "retryd_config"))
	}

	// Fixing the file recovers: the fixed content applies, the health of
	// the policy file is SERVING again, and so is the gauge.
	cm.swap(openaiPolicy(300))
	waitFor(t, 10*time.Second, "the fixed file to be reloaded", func() bool {
		return healthOf("retryd.config") == healthpb.HealthCheckResponse_SERVING
	})
	if c := fail("s4", 1); c.GetDelayMs() != 300 {
		t.Errorf("after the fixed file: delay %d, want its 300 ms", c.GetDelayMs())
	}
	body = metrics()
	if !strings.Contains(body, "\nretryd_config_last_reload_successful 1\n") || !strings.Contains(body, `result="applied"} 2`) {
		t.Errorf("after the fixed file, want retryd_config_last_reload_successful 1 and 2 applied reloads:\n%s", grepLines(body, "retryd_config"))
	}
}

func grepLines(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
