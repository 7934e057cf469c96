package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/jaegertest"
	"github.com/retryd/retryd/internal/retrydtest"
)

// TestTracesInJaeger runs a real Jaeger, a real retryd and this example
// agent loop (503, then 429 with a 1.5 s Retry-After, then success, for
// two logical turns), and reads the traces back from Jaeger's query API.
func TestTracesInJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Jaeger; slow")
	}
	j := jaegertest.Start(t)
	since := time.Now().Add(-time.Minute)
	otel := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + j.OTLPGRPCEndpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
	srv := retrydtest.StartWithEnv(t, append(otel, "OTEL_SERVICE_NAME=retryd"))
	if !strings.Contains(srv.Logs(), `"tracing":true`) {
		t.Fatalf("retryd did not enable tracing:\n%s", srv.Logs())
	}

	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "agentloop")
	if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(root, "examples", "agentloop")).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--retryd", srv.Addr, "--turns", "2", "--session", "jaeger-e2e",
		"--script", "503,429@1500,ok")
	cmd.Env = append(append(os.Environ(), otel...), "OTEL_SERVICE_NAME=agentloop")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agentloop: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "succeeded"); n != 2 {
		t.Fatalf("agentloop output:\n%s", out)
	}
	retrydtest.Verify(t, srv.Conn(t))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	count := func(tr jaegertest.Trace, service, name string) []jaegertest.Span {
		var out []jaegertest.Span
		for _, s := range tr.Spans {
			if s.ServiceName == service && s.Name == name {
				out = append(out, s)
			}
		}
		return out
	}
	traces, err := j.WaitForSpans(ctx, "agentloop", since, func(ts []jaegertest.Trace) bool {
		if len(ts) != 2 {
			return false
		}
		for _, tr := range ts {
			if len(count(tr, "retryd", "retryd.backoff")) != 2 || len(count(tr, "agentloop", "attempt")) != 3 {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("waiting for two complete traces: %v (got %d)", err, len(traces))
	}
	byID := func(tr jaegertest.Trace) map[string]jaegertest.Span {
		m := map[string]jaegertest.Span{}
		for _, s := range tr.Spans {
			m[s.SpanID] = s
		}
		return m
	}
	turns := map[string]bool{}
	for _, tr := range traces {
		spans := byID(tr)
		roots := count(tr, "agentloop", "logical turn")
		if len(roots) != 1 {
			t.Fatalf("trace %s: %d logical-turn spans, want 1", tr.TraceID, len(roots))
		}
		turn := roots[0]
		turns[turn.Attributes["retryd.logical_turn.id"].(string)] = true
		attempts := count(tr, "agentloop", "attempt")
		for _, a := range attempts {
			if a.ParentSpanID != turn.SpanID {
				t.Errorf("attempt %s is not a child of its logical turn", a.SpanID)
			}
		}
		decisions := count(tr, "retryd", "retryd.decide")
		if len(decisions) != 2 {
			t.Fatalf("trace %s: %d decision spans, want 2", tr.TraceID, len(decisions))
		}
		wantDelay := []struct{ min, max time.Duration }{
			{450 * time.Millisecond, 550 * time.Millisecond}, // 500 ms ± 10 % backoff
			{1500 * time.Millisecond, 1500 * time.Millisecond},
		}
		backoffs := count(tr, "retryd", "retryd.backoff")
		for i, d := range decisions {
			if d.Attributes["retryd.decision"] != "schedule" || d.Attributes["gen_ai.provider.name"] != "flaky" ||
				d.Attributes["retryd.retry.number"] != int64(i+1) || d.Attributes["retryd.session.id"] != "jaeger-e2e" {
				t.Errorf("decision %d attributes: %v", i, d.Attributes)
			}
			// The decision descends from the failed attempt's RPC span.
			if p, ok := spans[d.ParentSpanID]; !ok || p.ServiceName != "retryd" {
				t.Errorf("decision %d's parent is not retryd's server span", i)
			}
			// The provider's failure code is retryd.failure.code; error.type
			// marks only a decision that itself failed.
			if want := []string{"RATE_LIMIT", "SERVER"}[1-i]; d.Attributes["retryd.failure.code"] != want {
				t.Errorf("decision %d retryd.failure.code %v, want %s", i, d.Attributes["retryd.failure.code"], want)
			}
			if et, ok := d.Attributes["error.type"]; ok {
				t.Errorf("decision %d succeeded but carries error.type %v", i, et)
			}
			// Each decision links to every earlier attempt of the chain.
			if len(d.Links) != i+1 {
				t.Errorf("decision %d has %d links, want %d", i, len(d.Links), i+1)
			}
			for _, l := range d.Links {
				rpc, ok := spans[l.SpanID]
				if !ok || rpc.ServiceName != "agentloop" || spans[rpc.ParentSpanID].Name != "attempt" {
					t.Errorf("decision %d links to %v, not an attempt's call", i, l)
				}
			}
		}
		for i, b := range backoffs {
			delay := time.Duration(b.Attributes["retryd.delay_ms"].(int64)) * time.Millisecond
			if delay < wantDelay[i].min || delay > wantDelay[i].max {
				t.Errorf("backoff %d scheduled %v, want within [%v, %v]", i, delay, wantDelay[i].min, wantDelay[i].max)
			}
			if got := b.End.Sub(b.Start); got < delay || got > delay+time.Second {
				t.Errorf("backoff %d lasted %v for a %v delay", i, got, delay)
			}
			if len(b.Events) != 1 || b.Events[0].Name != "started" {
				t.Errorf("backoff %d events %v, want one started event", i, b.Events)
			}
		}
		// The retry attempts link to the backoff span their Started ended.
		linked := 0
		for _, a := range attempts {
			for _, l := range a.Links {
				if s, ok := spans[l.SpanID]; ok && s.Name == "retryd.backoff" {
					linked++
				}
			}
		}
		if linked != 2 {
			t.Errorf("trace %s: %d attempts link to a backoff span, want 2", tr.TraceID, linked)
		}
	}
	if !turns["jaeger-e2e/turn-1"] || !turns["jaeger-e2e/turn-2"] {
		t.Errorf("logical turns %v, want jaeger-e2e/turn-1 and turn-2", turns)
	}
}

func TestParseScript(t *testing.T) {
	t.Parallel()
	got, err := parseScript("503, 429@1500 ,ok")
	if err != nil {
		t.Fatal(err)
	}
	want := []answer{{503, -1}, {429, 1500}, {0, -1}}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %v, want %v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"", "200", "429@-1", "abc", "503@x"} {
		if _, err := parseScript(bad); err == nil {
			t.Errorf("parseScript(%q) accepted", bad)
		}
	}
}
