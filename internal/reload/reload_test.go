package reload_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/retryd/retryd/internal/reload"
)

// TestSource: a reload builds only changed content, keeps the last good
// value when content does not build or cannot be read, and logs each
// distinct failure once.
func TestSource(t *testing.T) {
	content, readErr := "1", error(nil)
	builds := 0
	var results []string
	var logs bytes.Buffer
	src, err := reload.New(reload.Config[string, int]{
		Read: func() (string, [sha256.Size]byte, error) {
			return content, sha256.Sum256([]byte(content)), readErr
		},
		Build: func(s string) (*int, []any, error) {
			builds++
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, nil, err
			}
			return &n, []any{"n", n}, nil
		},
		Log:    slog.New(slog.NewTextHandler(&logs, nil)),
		Loaded: "loaded", Reloaded: "reloaded", Failed: "reload failed", Attrs: []any{"file", "f"},
		Describe: func(error) []any { return []any{"described", true} },
		Result: func(err error) {
			r := "ok"
			if err != nil {
				r = err.Error()
			}
			results = append(results, r)
		},
	})
	if err != nil || *src.Current() != 1 {
		t.Fatalf("New: %v %v", src, err)
	}
	if src.Reload() || builds != 1 {
		t.Errorf("unchanged content: reloaded, %d builds", builds)
	}
	content = "two"
	for range 3 {
		if src.Reload() || *src.Current() != 1 {
			t.Errorf("content that does not build: serving %d", *src.Current())
		}
	}
	readErr = errors.New("gone")
	for range 3 {
		if src.Reload() || *src.Current() != 1 {
			t.Errorf("unreadable: serving %d", *src.Current())
		}
	}
	readErr, content = nil, "3"
	if !src.Reload() || *src.Current() != 3 {
		t.Errorf("new content: serving %d", *src.Current())
	}
	if n := strings.Count(logs.String(), "reload failed"); n != 2 || !strings.Contains(logs.String(), "file=f") {
		t.Errorf("%d failure lines, want 2 (one per distinct failure) naming the file:\n%s", n, &logs)
	}
	if n := strings.Count(logs.String(), "described=true"); n != 2 {
		t.Errorf("%d failure lines carry Describe's attributes, want 2:\n%s", n, &logs)
	}
	if want := []string{`strconv.Atoi: parsing "two": invalid syntax`, "gone", "ok"}; !slices.Equal(results, want) {
		t.Errorf("Result saw %q, want %q (each tried content or new read error once)", results, want)
	}
	if builds != 3 {
		t.Errorf("%d builds, want 3 (the first, the bad content once, the new content)", builds)
	}
}

// TestNewRefuses: a first read or build that fails is New's error.
func TestNewRefuses(t *testing.T) {
	want := errors.New("no file")
	_, err := reload.New(reload.Config[string, int]{
		Read:  func() (string, [sha256.Size]byte, error) { return "", [sha256.Size]byte{}, want },
		Build: func(string) (*int, []any, error) { t.Fatal("built unread content"); return nil, nil, nil },
	})
	if !errors.Is(err, want) {
		t.Errorf("New: %v, want %v", err, want)
	}
}
