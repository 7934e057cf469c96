package jaegertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/loopback"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

func TestJaegerReceivesOTLPSpans(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real Jaeger, whose first build takes minutes")
	}
	j := Start(t)
	t.Logf("jaeger: otlp grpc %s, otlp http %s, query %s", j.OTLPGRPCEndpoint, j.OTLPHTTPEndpoint, j.QueryURL)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	since := time.Now().Add(-time.Second)
	service := fmt.Sprintf("jaegertest-%d", time.Now().UnixNano())

	exporter, err := otlptracegrpc.New(ctx,
		otlptracegrpc.WithEndpoint(j.OTLPGRPCEndpoint),
		otlptracegrpc.WithInsecure(),
	)
	if err != nil {
		t.Fatalf("otlptracegrpc.New: %v", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(service))),
	)
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tracer := tp.Tracer("github.com/retryd/retryd/internal/jaegertest")

	linked := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0x0b, 0x0c, 0x0d, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
		SpanID:     trace.SpanID{0xfe, 0xed, 0xfa, 0xce, 1, 2, 3, 4},
		TraceFlags: trace.FlagsSampled,
	})

	parentCtx, parent := tracer.Start(ctx, "retryd.Decide",
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("retryd.policy", "exponential")),
	)
	_, child := tracer.Start(parentCtx, "retryd.evaluate",
		trace.WithLinks(trace.Link{SpanContext: linked}),
		trace.WithAttributes(attribute.Int("retryd.attempt", 3), attribute.Bool("retryd.retry", true)),
	)
	child.AddEvent("backoff.computed", trace.WithAttributes(attribute.Int64("backoff.ms", 250)))
	child.SetStatus(codes.Error, "budget exhausted")
	child.End()
	parent.End()
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
	wantTraceID := parent.SpanContext().TraceID().String()
	parentID := parent.SpanContext().SpanID().String()
	childID := child.SpanContext().SpanID().String()

	traces, err := j.WaitForSpans(ctx, service, since, func(ts []Trace) bool {
		return len(ts) == 1 && len(ts[0].Spans) == 2
	})
	if err != nil {
		t.Fatalf("WaitForSpans: %v (got %+v)", err, traces)
	}
	if traces[0].TraceID != wantTraceID {
		t.Fatalf("trace ID = %s, want %s", traces[0].TraceID, wantTraceID)
	}
	checkSpans(t, traces[0], wantTraceID, parentID, childID, service)

	got, err := j.GetTrace(ctx, wantTraceID)
	if err != nil {
		t.Fatalf("GetTrace: %v", err)
	}
	if got.TraceID != wantTraceID || len(got.Spans) != 2 {
		t.Fatalf("GetTrace = %+v, want trace %s with 2 spans", got, wantTraceID)
	}
	checkSpans(t, got, wantTraceID, parentID, childID, service)

	if _, err := j.GetTrace(ctx, "0123456789abcdef0123456789abcdef"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetTrace(unknown) error = %v, want ErrNotFound", err)
	}
	if other, err := j.FindTraces(ctx, service+"-other", since); err != nil || len(other) != 0 {
		t.Errorf("FindTraces(other service) = %v, %v; want no traces, no error", other, err)
	}

	checkMetricsEndpoint(t, j)
	checkListeners(t, j)
}

func checkSpans(t *testing.T, tr Trace, traceID, parentID, childID, service string) {
	t.Helper()
	var parent, child *Span
	for i := range tr.Spans {
		switch tr.Spans[i].SpanID {
		case parentID:
			parent = &tr.Spans[i]
		case childID:
			child = &tr.Spans[i]
		}
	}
	if parent == nil || child == nil {
		t.Fatalf("spans %+v: want parent %s and child %s", tr.Spans, parentID, childID)
	}
	for _, s := range []*Span{parent, child} {
		if s.TraceID != traceID {
			t.Errorf("span %s trace ID = %s, want %s", s.Name, s.TraceID, traceID)
		}
		if s.ServiceName != service {
			t.Errorf("span %s service = %q, want %q", s.Name, s.ServiceName, service)
		}
		if s.Start.IsZero() || s.End.Before(s.Start) {
			t.Errorf("span %s times = %v..%v", s.Name, s.Start, s.End)
		}
	}
	if parent.Name != "retryd.Decide" || parent.ParentSpanID != "" {
		t.Errorf("parent = %q with parent %q, want retryd.Decide as root", parent.Name, parent.ParentSpanID)
	}
	if got := parent.Attributes["retryd.policy"]; got != "exponential" {
		t.Errorf("parent retryd.policy = %#v, want \"exponential\"", got)
	}
	if child.Name != "retryd.evaluate" || child.ParentSpanID != parentID {
		t.Errorf("child = %q with parent %q, want retryd.evaluate under %s", child.Name, child.ParentSpanID, parentID)
	}
	if got := child.Attributes["retryd.attempt"]; got != int64(3) {
		t.Errorf("child retryd.attempt = %#v, want int64(3)", got)
	}
	if got := child.Attributes["retryd.retry"]; got != true {
		t.Errorf("child retryd.retry = %#v, want true", got)
	}
	wantLink := Link{TraceID: "0a0b0c0d0102030405060708090a0b0c", SpanID: "feedface01020304"}
	if len(child.Links) != 1 || child.Links[0] != wantLink {
		t.Errorf("child links = %+v, want [%+v]", child.Links, wantLink)
	}
	if len(child.Events) != 1 || child.Events[0].Name != "backoff.computed" || child.Events[0].Attributes["backoff.ms"] != int64(250) {
		t.Errorf("child events = %+v, want backoff.computed with backoff.ms=250", child.Events)
	}
	if child.StatusCode != "Error" || parent.StatusCode != "Unset" {
		t.Errorf("status codes parent=%q child=%q, want Unset and Error", parent.StatusCode, child.StatusCode)
	}
}

// checkMetricsEndpoint shows that the collector's own telemetry moved off
// its default port 8888 to the assigned one.
func checkMetricsEndpoint(t *testing.T, j *Jaeger) {
	t.Helper()
	resp, err := http.Get("http://" + loopback.HostPort(j.ports["metrics"]) + "/metrics")
	if err != nil {
		t.Errorf("metrics endpoint: %v", err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("metrics endpoint status = %s", resp.Status)
	}
}

// checkListeners reads the Jaeger process's sockets from /proc and requires
// that every listening socket is on 127.0.0.1 at one of the assigned ports,
// each assigned port is listened on, and no socket leads off loopback.
func checkListeners(t *testing.T, j *Jaeger) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Logf("skipping listener check on %s", runtime.GOOS)
		return
	}
	inodes := map[string]bool{}
	fdDir := fmt.Sprintf("/proc/%d/fd", j.pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatalf("read %s: %v", fdDir, err)
	}
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	allowed := map[int]bool{}
	for _, p := range j.ports {
		allowed[p] = true
	}
	var listening []int
	for _, table := range []string{"tcp", "tcp6", "udp", "udp6"} {
		for _, s := range procSockets(t, fmt.Sprintf("/proc/%d/net/%s", j.pid, table)) {
			if !inodes[s.inode] {
				continue
			}
			if !isLoopbackOrUnset(s.remote) {
				t.Errorf("jaeger has a %s socket to %s:%d, off loopback", table, s.remote, s.remotePort)
			}
			isListen := (strings.HasPrefix(table, "tcp") && s.state == "0A") || (strings.HasPrefix(table, "udp") && s.state == "07")
			if !isListen {
				continue
			}
			listening = append(listening, s.port)
			if !allowed[s.port] || s.addr != "0100007F" {
				t.Errorf("jaeger listens on %s %s:%d, not an assigned loopback port (assigned: %v)", table, s.addr, s.port, j.ports)
			}
		}
	}
	slices.Sort(listening)
	if len(listening) != len(j.ports) {
		t.Errorf("jaeger listens on ports %v, want exactly the assigned %v", listening, j.ports)
	}
}

type procSocket struct {
	addr       string
	port       int
	remote     string
	remotePort int
	state      string
	inode      string
}

// isLoopbackOrUnset reports whether a /proc/net address (hex, host byte
// order on little-endian machines) is unset or in 127.0.0.0/8, as IPv4 or
// IPv4-mapped IPv6, or is ::1.
func isLoopbackOrUnset(addr string) bool {
	switch {
	case strings.Trim(addr, "0") == "":
		return true
	case len(addr) == 8:
		return strings.HasSuffix(addr, "7F")
	case len(addr) == 32:
		return addr == "00000000000000000000000001000000" ||
			(strings.HasPrefix(addr, "0000000000000000FFFF0000") && strings.HasSuffix(addr, "7F"))
	}
	return false
}

func procSockets(t *testing.T, path string) []procSocket {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	var out []procSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		addr, portHex, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil {
			continue
		}
		remote, remotePortHex, _ := strings.Cut(fields[2], ":")
		remotePort, _ := strconv.ParseUint(remotePortHex, 16, 16)
		out = append(out, procSocket{
			addr: addr, port: int(port),
			remote: remote, remotePort: int(remotePort),
			state: fields[3], inode: fields[9],
		})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return out
}

// TestDecodeTraces checks the decoder on the shape /api/v3 returns (hex
// IDs, string integers, numeric enums) and on the other OTLP/JSON forms
// (base64 IDs, JSON numbers, enum names).
func TestDecodeTraces(t *testing.T) {
	body := `{"result":{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},
	"scopeSpans":[{"scope":{},"spans":[
	{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0000000000000002","parentSpanId":"0000000000000001","name":"child",
	 "startTimeUnixNano":"1700000000000000002","endTimeUnixNano":1700000000000000003,
	 "attributes":[{"key":"i","value":{"intValue":"7"}},{"key":"d","value":{"doubleValue":1.5}},
	   {"key":"a","value":{"arrayValue":{"values":[{"stringValue":"x"},{"intValue":8}]}}},
	   {"key":"m","value":{"kvlistValue":{"values":[{"key":"k","value":{"boolValue":false}}]}}},
	   {"key":"b","value":{"bytesValue":"AQI="}}],
	 "links":[{"traceId":"AQIDBAUGBwgJCgsMDQ4PEA==","spanId":"AAAAAAAAAAk="}],
	 "events":[{"name":"e","attributes":[{"key":"x","value":{"stringValue":"y"}}]}],
	 "status":{"code":"STATUS_CODE_ERROR"}},
	{"traceId":"AQIDBAUGBwgJCgsMDQ4PEA==","spanId":"AAAAAAAAAAE=","parentSpanId":"","name":"root",
	 "startTimeUnixNano":"1700000000000000001","endTimeUnixNano":"1700000000000000009","status":{}}
	]}]}]}}`
	traces, err := decodeTraces([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(traces) != 1 || len(traces[0].Spans) != 2 {
		t.Fatalf("traces = %+v, want one trace with two spans", traces)
	}
	tr := traces[0]
	if tr.TraceID != "0102030405060708090a0b0c0d0e0f10" {
		t.Errorf("trace ID = %s", tr.TraceID)
	}
	root, child := tr.Spans[0], tr.Spans[1]
	if root.Name != "root" || root.SpanID != "0000000000000001" || root.ParentSpanID != "" || root.StatusCode != "Unset" {
		t.Errorf("root = %+v", root)
	}
	if child.Name != "child" || child.ParentSpanID != root.SpanID || child.StatusCode != "Error" || child.ServiceName != "svc" {
		t.Errorf("child = %+v", child)
	}
	if child.Start.UnixNano() != 1700000000000000002 || child.End.UnixNano() != 1700000000000000003 {
		t.Errorf("child times = %v..%v", child.Start, child.End)
	}
	want := map[string]any{"i": int64(7), "d": 1.5, "a": []any{"x", int64(8)}, "m": map[string]any{"k": false}, "b": []byte{1, 2}}
	if fmt.Sprint(child.Attributes) != fmt.Sprint(want) {
		t.Errorf("attributes = %#v, want %#v", child.Attributes, want)
	}
	if len(child.Links) != 1 || child.Links[0] != (Link{TraceID: tr.TraceID, SpanID: "0000000000000009"}) {
		t.Errorf("links = %+v", child.Links)
	}
	if len(child.Events) != 1 || child.Events[0].Name != "e" || child.Events[0].Attributes["x"] != "y" {
		t.Errorf("events = %+v", child.Events)
	}
}
