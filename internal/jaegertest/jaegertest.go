// Package jaegertest runs a real Jaeger v2 backend (in-memory storage) as a
// child process for tests, and reads the traces it stored back through
// Jaeger's /api/v3 HTTP query API.
//
// The jaeger binary is built from the tools module in tools/jaeger with
// `go tool -modfile=tools/jaeger/go.mod jaeger`, so Go's build cache keeps it
// between runs. The first build on a clean cache takes several minutes;
// callers that run it inside `go test` on a fresh machine should warm the
// cache first (for example `go tool -modfile=tools/jaeger/go.mod jaeger --help`)
// or raise -timeout.
//
// Every listener the started Jaeger opens is bound to 127.0.0.1 on a port
// picked at start, so several instances can run side by side and nothing is
// reachable from outside the machine.
package jaegertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/loopback"
	"github.com/retryd/retryd/internal/retrydtest"
)

// modfile is the tools module that pins the Jaeger version, relative to
// the repository root.
const modfile = "tools/jaeger/go.mod"

// maxSearchTraces is the query.num_traces sent with every search. It must be
// positive and at most the memory store's max_traces.
const (
	maxSearchTraces = 1000
	memoryMaxTraces = 100000
)

const (
	startAttempts    = 3
	readyTimeout     = 60 * time.Second
	stopGracePeriod  = 10 * time.Second
	logTailOnFailure = 8 << 10
)

// ErrNotFound is returned by GetTrace when Jaeger has no trace with the ID.
var ErrNotFound = errors.New("jaegertest: trace not found")

// Jaeger is a running Jaeger instance started by Start.
type Jaeger struct {
	// OTLPGRPCEndpoint is "127.0.0.1:PORT" of the OTLP gRPC receiver, the
	// value for OTEL_EXPORTER_OTLP_ENDPOINT with the grpc protocol (plaintext).
	OTLPGRPCEndpoint string
	// OTLPHTTPEndpoint is "127.0.0.1:PORT" of the OTLP HTTP receiver
	// (traces are accepted at /v1/traces).
	OTLPHTTPEndpoint string
	// QueryURL is "http://127.0.0.1:PORT", the query service's HTTP base URL
	// (UI, /api/v3, /api/traces).
	QueryURL string

	pid       int
	ports     map[string]int
	healthURL string
	logPath   string
	client    *http.Client
}

// Trace is one trace as returned by the query API.
type Trace struct {
	TraceID string
	Spans   []Span
}

// Span is a decoded OTLP span. IDs are lower-case hex; ParentSpanID is empty
// for a root span. StatusCode is "Unset", "Ok" or "Error".
type Span struct {
	TraceID, SpanID, ParentSpanID, Name, ServiceName string
	Start, End                                       time.Time
	Attributes                                       map[string]any
	Links                                            []Link
	Events                                           []SpanEvent
	StatusCode                                       string
}

// Link is a span link.
type Link struct{ TraceID, SpanID string }

// SpanEvent is a span event.
type SpanEvent struct {
	Name       string
	Attributes map[string]any
}

// Start starts a Jaeger v2 process with in-memory storage on free loopback
// ports, waits until it is ready, and stops it (SIGTERM, then SIGKILL) when
// the test ends. It fails the test if Jaeger cannot be built or started.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	retrydtest.EndToEnd(t, "Jaeger, built from "+modfile)
	bin, err := binary()
	if err != nil {
		t.Fatalf("jaegertest: %v", err)
	}
	dir := t.TempDir()
	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		j, err := start(t, bin, dir, attempt)
		if err == nil {
			return j
		}
		lastErr = err
		t.Logf("jaegertest: start attempt %d failed: %v", attempt, err)
	}
	t.Fatalf("jaegertest: could not start jaeger: %v", lastErr)
	return nil
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary returns the path of the jaeger executable, built (or found in Go's
// build cache) by `go tool -n`.
func binary() (string, error) {
	binOnce.Do(func() {
		binPath, binErr = retrydtest.PinnedTool(modfile, "jaeger")
	})
	return binPath, binErr
}

// listeners names every socket the generated configuration opens.
var listeners = []string{
	"otlp_grpc",
	"otlp_http",
	"query_http",
	"query_grpc",
	"health_http",
	"metrics",
}

func start(t testing.TB, bin, dir string, attempt int) (*Jaeger, error) {
	ports, err := loopback.FreePorts(len(listeners))
	if err != nil {
		return nil, err
	}
	j := &Jaeger{
		ports:  make(map[string]int, len(listeners)),
		client: &http.Client{Timeout: 30 * time.Second},
	}
	for i, name := range listeners {
		j.ports[name] = ports[i]
	}
	j.OTLPGRPCEndpoint = loopback.HostPort(j.ports["otlp_grpc"])
	j.OTLPHTTPEndpoint = loopback.HostPort(j.ports["otlp_http"])
	j.QueryURL = "http://" + loopback.HostPort(j.ports["query_http"])
	j.healthURL = "http://" + loopback.HostPort(j.ports["health_http"]) + "/status"

	configPath := filepath.Join(dir, fmt.Sprintf("jaeger-%d.yaml", attempt))
	if err := os.WriteFile(configPath, []byte(config(j.ports)), 0o600); err != nil {
		return nil, err
	}
	j.logPath = filepath.Join(dir, fmt.Sprintf("jaeger-%d.log", attempt))
	logFile, err := os.Create(j.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()

	cmd := exec.Command(bin, "--config="+configPath)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	j.pid = cmd.Process.Pid
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()

	if err := j.waitReady(exited); err != nil {
		stop(cmd.Process, exited)
		<-exited
		return nil, fmt.Errorf("%w (exit: %v)\n%s", err, waitErr, tail(j.logPath))
	}
	t.Cleanup(func() {
		stop(cmd.Process, exited)
		if t.Failed() {
			t.Logf("jaegertest: jaeger log (%s):\n%s", j.logPath, tail(j.logPath))
		}
	})
	return j, nil
}

// childEnv is the test's environment without OTEL_* variables, so that a
// test's own exporter settings cannot redirect Jaeger's internal telemetry.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// stop sends SIGTERM to the process and SIGKILL if it has not exited after
// the grace period.
func stop(p *os.Process, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	default:
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(stopGracePeriod):
		_ = p.Kill()
		<-exited
	}
}

func (j *Jaeger) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	client := &http.Client{Timeout: 2 * time.Second}
	checks := []string{j.healthURL, j.QueryURL + "/api/v3/services"}
	for {
		ready := true
		for _, u := range checks {
			if !statusOK(client, u) {
				ready = false
				break
			}
		}
		if ready && dialable(j.OTLPGRPCEndpoint) && dialable(j.OTLPHTTPEndpoint) {
			return nil
		}
		select {
		case <-exited:
			return errors.New("jaeger exited before it was ready")
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("jaeger not ready after %v", readyTimeout)
		}
	}
}

func statusOK(client *http.Client, u string) bool {
	resp, err := client.Get(u)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// config renders the Jaeger v2 (OpenTelemetry Collector) configuration.
// It enables only the components needed to receive OTLP and answer
// queries, and gives every one of their listeners an explicit loopback
// address, so no default port (4317, 4318, 16685, 16686, 13133, 8888, ...)
// is opened. Jaeger's self-tracing is off so it makes no outbound calls.
func config(p map[string]int) string {
	return fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: basic
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: %[6]d
    logs:
      level: info

extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: %[7]d
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    http:
      endpoint: %[3]s
    grpc:
      endpoint: %[4]s
  healthcheckv2:
    use_v2: true
    http:
      endpoint: %[5]s

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %[1]s
      http:
        endpoint: %[2]s

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`,
		loopback.HostPort(p["otlp_grpc"]),
		loopback.HostPort(p["otlp_http"]),
		loopback.HostPort(p["query_http"]),
		loopback.HostPort(p["query_grpc"]),
		loopback.HostPort(p["health_http"]),
		p["metrics"],
		memoryMaxTraces,
	)
}

func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(data) > logTailOnFailure {
		data = data[len(data)-logTailOnFailure:]
	}
	return string(data)
}

// FindTraces returns the traces that have a span of service starting at or
// after since. It returns an empty slice, not an error, when none match.
func (j *Jaeger) FindTraces(ctx context.Context, service string, since time.Time) ([]Trace, error) {
	q := url.Values{}
	q.Set("query.service_name", service)
	q.Set("query.start_time_min", since.UTC().Format(time.RFC3339Nano))
	q.Set("query.start_time_max", time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano))
	q.Set("query.num_traces", strconv.Itoa(maxSearchTraces))
	traces, err := j.query(ctx, "/api/v3/traces?"+q.Encode())
	if errors.Is(err, ErrNotFound) {
		return []Trace{}, nil
	}
	return traces, err
}

// GetTrace returns the trace with the given hex trace ID, or an error
// wrapping ErrNotFound if Jaeger does not have it.
func (j *Jaeger) GetTrace(ctx context.Context, traceID string) (Trace, error) {
	traces, err := j.query(ctx, "/api/v3/traces/"+url.PathEscape(traceID))
	if err != nil {
		return Trace{}, err
	}
	for _, tr := range traces {
		if tr.TraceID == strings.ToLower(traceID) {
			return tr, nil
		}
	}
	if len(traces) == 1 {
		return traces[0], nil
	}
	return Trace{}, fmt.Errorf("%w: %s (response had %d traces)", ErrNotFound, traceID, len(traces))
}

// WaitForSpans polls FindTraces until want returns true for its result, and
// returns that result. If ctx ends first it returns the last result and an
// error.
func (j *Jaeger) WaitForSpans(ctx context.Context, service string, since time.Time, want func([]Trace) bool) ([]Trace, error) {
	var last []Trace
	var lastErr error
	for {
		traces, err := j.FindTraces(ctx, service, since)
		if err == nil {
			last = traces
			if want(traces) {
				return traces, nil
			}
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return last, fmt.Errorf("jaegertest: waiting for spans of %q: %w (last query error: %v)", service, ctx.Err(), lastErr)
			}
			return last, fmt.Errorf("jaegertest: waiting for spans of %q: %w (%d traces seen)", service, ctx.Err(), len(last))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (j *Jaeger) query(ctx context.Context, pathAndQuery string) ([]Trace, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+pathAndQuery, nil)
	if err != nil {
		return nil, err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return decodeTraces(body)
	case http.StatusNotFound:
		return nil, fmt.Errorf("%w: GET %s: %s", ErrNotFound, pathAndQuery, strings.TrimSpace(string(body)))
	default:
		return nil, fmt.Errorf("jaegertest: GET %s: %s: %s", pathAndQuery, resp.Status, strings.TrimSpace(string(body)))
	}
}
