package invariant_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
)

var update = flag.Bool("update", false, "rewrite testdata/valid.jsonl from the valid log")

const validFile = "testdata/valid.jsonl"

func equalEvents(t *testing.T, got, want []*retrydv1.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("event %d = %v, want %v", i, got[i], want[i])
		}
	}
}

// TestValidFile reads the valid log from testdata, as `retryd verify` would,
// and wants the same events and no violation. Run with -update to rewrite
// the file after changing validEvents.
func TestValidFile(t *testing.T) {
	if *update {
		var buf bytes.Buffer
		if err := invariant.WriteJSONLines(&buf, validEvents()); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(validFile, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Parallel()
	f, err := os.Open(validFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := invariant.ReadJSONLines(f)
	if err != nil {
		t.Fatal(err)
	}
	equalEvents(t, events, validEvents())
	for _, v := range invariant.Check(events) {
		t.Error(v)
	}
}

func TestJSONLinesRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		events []*retrydv1.Event
	}{
		{"valid log", validEvents()},
		{"no events", nil},
		{"empty event", []*retrydv1.Event{{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			if err := invariant.WriteJSONLines(&buf, tt.events); err != nil {
				t.Fatal(err)
			}
			if got, want := strings.Count(buf.String(), "\n"), len(tt.events); got != want {
				t.Errorf("wrote %d lines, want %d:\n%s", got, want, buf.String())
			}
			got, err := invariant.ReadJSONLines(&buf)
			if err != nil {
				t.Fatal(err)
			}
			equalEvents(t, got, tt.events)
		})
	}
}

func TestReadJSONLines(t *testing.T) {
	t.Parallel()
	first := `{"sequence":"1","sessionId":"s-1","started":{"retryId":"r-1","turn":"1","step":"1","retryNumber":1}}`
	second := `{"sequence": "2", "session_id": "s-1", "cancelled": {"retry_id": "", "reason": "CANCEL_REASON_REQUESTED"}}`
	tests := []struct {
		name    string
		input   string
		want    int    // events, when no error
		wantErr string // substring of the error
	}{
		{name: "empty input", input: "", want: 0},
		{name: "only blank lines", input: "\n  \n\t\n", want: 0},
		{name: "one line without newline", input: first, want: 1},
		{name: "blank lines and CRLF", input: "\r\n" + first + "\r\n\r\n" + second + "\r\n", want: 2},
		{name: "proto field names accepted", input: second + "\n", want: 1},
		{name: "not JSON on line 3", input: first + "\n\n{bad\n" + second + "\n", wantErr: "line 3"},
		{name: "unknown field on line 2", input: first + "\n" + `{"sequence":"2","surprise":true}` + "\n", wantErr: "line 2"},
		{name: "two kinds on line 1", input: `{"started":{},"closed":{}}`, wantErr: "line 1"},
		{name: "bad enum on last line", input: first + "\n" + `{"closed":{"reason":"CLOSE_REASON_NOPE"}}`, wantErr: "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			events, err := invariant.ReadJSONLines(strings.NewReader(tt.input))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ReadJSONLines error = %v, want one naming %q", err, tt.wantErr)
				}
				if events != nil {
					t.Errorf("ReadJSONLines returned %d events with an error", len(events))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(events) != tt.want {
				t.Errorf("got %d events, want %d", len(events), tt.want)
			}
		})
	}
}

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestJSONLinesIOErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	if _, err := invariant.ReadJSONLines(failingReader{boom}); !errors.Is(err, boom) || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("ReadJSONLines error = %v, want %v on line 1", err, boom)
	}
	if err := invariant.WriteJSONLines(failingWriter{boom}, validEvents()); !errors.Is(err, boom) {
		t.Errorf("WriteJSONLines error = %v, want %v", err, boom)
	}
}

// FuzzReadJSONLines wants ReadJSONLines, and the checker over what it reads,
// never to panic, and a log it reads to survive a write and read unchanged.
func FuzzReadJSONLines(f *testing.F) {
	seeds, err := filepath.Glob("testdata/*.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range seeds {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(""))
	f.Add([]byte("{}\n\n{}"))
	f.Add([]byte("{bad\n"))
	f.Add([]byte(`{"scheduled":{"retryNumber":0,"delaySource":"DELAY_SOURCE_SCHEDULE","policy":{"mode":"MODE_SCHEDULE"},"mode":"MODE_SCHEDULE"}}`))
	f.Add([]byte(`{"scheduled":{"retryNumber":4294967295,"delaySource":"DELAY_SOURCE_BACKOFF","policy":{"backoff":{"multiplier":"NaN","jitterRatio":"-Infinity"}}}}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		events, err := invariant.ReadJSONLines(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, v := range invariant.Check(events) {
			_ = v.String()
		}
		var buf bytes.Buffer
		if err := invariant.WriteJSONLines(&buf, events); err != nil {
			t.Fatalf("WriteJSONLines of events ReadJSONLines accepted: %v", err)
		}
		again, err := invariant.ReadJSONLines(&buf)
		if err != nil {
			t.Fatalf("ReadJSONLines of WriteJSONLines output: %v\n%s", err, buf.String())
		}
		equalEvents(t, again, events)
	})
}
