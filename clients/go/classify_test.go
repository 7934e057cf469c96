package retryd_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// classifyFile is one file of testdata/classify (schema in its README).
type classifyFile struct {
	Description string           `json:"description"`
	Vectors     []classifyVector `json:"vectors"`
}

type classifyVector struct {
	Name    string `json:"name"`
	Comment string `json:"comment"`
	Input   struct {
		HTTPStatus      int               `json:"httpStatus"`
		Headers         map[string]string `json:"headers"`
		Body            json.RawMessage   `json:"body"`
		ErrorKind       string            `json:"errorKind"`
		OutputShown     bool              `json:"outputShown"`
		EmptyCompletion bool              `json:"emptyCompletion"`
	} `json:"input"`
	Expect struct {
		Failure         json.RawMessage `json:"failure"`
		Replay          string          `json:"replay"`
		DefaultDecision string          `json:"defaultDecision"`
	} `json:"expect"`
}

func loadClassifyVectors(t *testing.T) []classifyVector {
	t.Helper()
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "testdata", "classify", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	var out []classifyVector
	names := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var file classifyFile
		if err := dec.Decode(&file); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		for _, v := range file.Vectors {
			if v.Name == "" || names[v.Name] {
				t.Fatalf("%s: vector name %q is empty or not unique", filepath.Base(f), v.Name)
			}
			names[v.Name] = true
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		t.Fatal("no classification vectors in testdata/classify")
	}
	return out
}

// body returns the vector's body bytes: a JSON string is the raw text, any
// other JSON value stands for its serialization.
func (v classifyVector) body(t *testing.T) []byte {
	t.Helper()
	raw := v.Input.Body
	if len(raw) == 0 {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		return []byte(s)
	}
	return raw
}

// errorOfKind builds the Go error an HTTP client returns for a vector's
// errorKind, wrapped the way net/http wraps it, so that the test goes
// through ErrorKindOf.
func errorOfKind(t *testing.T, kind string) error {
	t.Helper()
	wrap := func(err error) error { return &url.Error{Op: "Post", URL: "https://api.example/v1", Err: err} }
	switch kind {
	case "":
		return nil
	case "connection_refused":
		return wrap(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	case "connection_reset":
		return wrap(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	case "dns":
		return wrap(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "api.example", IsNotFound: true}})
	case "tls":
		return wrap(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"})
	case "timeout":
		return wrap(fmt.Errorf("net/http: request canceled (Client.Timeout exceeded): %w", context.DeadlineExceeded))
	case "stream_truncated":
		return fmt.Errorf("reading the stream: %w", io.ErrUnexpectedEOF)
	case "aborted":
		return wrap(context.Canceled)
	}
	t.Fatalf("unknown errorKind %q", kind)
	return nil
}

// fixedRand is a jitter source that always returns one value.
type fixedRand float64

func (r fixedRand) Float64() float64 { return float64(r) }

// TestClassifyVectors runs every shared classification vector through
// Classify and checks the failure, the replay, and what retryd's default
// policy decides for them.
func TestClassifyVectors(t *testing.T) {
	t.Parallel()
	def, err := policy.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range loadClassifyVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			header := http.Header{}
			for k, val := range v.Input.Headers {
				if k != strings.ToLower(k) {
					t.Fatalf("header name %q is not lower case", k)
				}
				header.Set(k, val)
			}
			got := retryd.Classify(retryd.ProviderFailure{
				Status:          v.Input.HTTPStatus,
				Header:          header,
				Body:            v.body(t),
				Err:             errorOfKind(t, v.Input.ErrorKind),
				OutputShown:     v.Input.OutputShown,
				EmptyCompletion: v.Input.EmptyCompletion,
			})
			want := &retrydv1.Failure{}
			if err := protojson.Unmarshal(v.Expect.Failure, want); err != nil {
				t.Fatalf("expect.failure: %v", err)
			}
			if got.Failure.GetMessage() == "" {
				t.Error("Failure.message is empty")
			}
			gotNoMsg := proto.CloneOf(got.Failure)
			gotNoMsg.Message = ""
			if !proto.Equal(want, gotNoMsg) {
				t.Errorf("%s\nfailure = %v\nwant      %v", v.Comment, gotNoMsg, want)
			}
			if got.Replay.String() != v.Expect.Replay {
				t.Errorf("%s\nreplay = %s, want %s", v.Comment, got.Replay, v.Expect.Replay)
			}
			now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
			d := def.Decide(policy.Attempt{
				Code:       got.Failure.GetCode(),
				RetryAfter: policy.ProviderRetryAfter(got.Failure.ProviderRetryAfterMs, got.Failure.RetryAfter, now),
				Replay:     got.Replay,
			}, now, fixedRand(0.5))
			decision := "SCHEDULE"
			if !d.Schedule {
				decision = d.Reason.String()
			}
			if decision != v.Expect.DefaultDecision {
				t.Errorf("%s\nthe default policy decides %s (%s), want %s", v.Comment, decision, d.Detail, v.Expect.DefaultDecision)
			}
		})
	}
}

// TestErrorKindOfRealErrors checks ErrorKindOf on the errors net/http
// really returns, from servers on loopback.
func TestErrorKindOfRealErrors(t *testing.T) {
	t.Parallel()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + closed.Addr().String()
	closed.Close()

	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(tlsSrv.Close)

	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	t.Cleanup(slow.Close)

	// truncated announces a body longer than it sends, then hangs up.
	truncated := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: {\"choices\":[]}\n\n"))
	}))
	t.Cleanup(truncated.Close)

	get := func(ctx context.Context, client *http.Client, u string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	tests := []struct {
		name string
		err  error
		want retryd.ErrorKind
	}{
		{"refused", get(t.Context(), http.DefaultClient, refusedURL), retryd.ErrorKindConnectionRefused},
		{"tls", get(t.Context(), &http.Client{}, tlsSrv.URL), retryd.ErrorKindTLS},
		{"timeout", get(t.Context(), &http.Client{Timeout: 50 * time.Millisecond}, slow.URL), retryd.ErrorKindTimeout},
		{"aborted", get(cancelled, http.DefaultClient, slow.URL), retryd.ErrorKindAborted},
		{"truncated", get(t.Context(), http.DefaultClient, truncated.URL), retryd.ErrorKindStreamTruncated},
		{"dns", get(t.Context(), http.DefaultClient, "http://retryd-test.invalid/"), retryd.ErrorKindDNS},
		{"none", nil, retryd.ErrorKindNone},
	}
	for _, tt := range tests {
		if got := retryd.ErrorKindOf(tt.err); got != tt.want {
			t.Errorf("%s: ErrorKindOf(%v) = %q, want %q", tt.name, tt.err, got, tt.want)
		}
	}
	if !errors.Is(tests[0].err, syscall.ECONNREFUSED) {
		t.Fatalf("the refused request failed otherwise: %v", tests[0].err)
	}
}
