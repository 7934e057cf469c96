package auth_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retryd/retryd/auth"
)

// secretVolume mimics how the kubelet updates a mounted Secret: every
// version is a new timestamped directory, "..data" is a symlink to the
// current one, and the file the server reads is a symlink through it.
// An update swaps "..data" atomically with a rename.
type secretVolume struct {
	t       *testing.T
	dir     string
	version int
}

func newSecretVolume(t *testing.T, content string) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	v.update(content)
	if err := os.Symlink(filepath.Join("..data", "credentials.yaml"), v.path()); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *secretVolume) path() string { return filepath.Join(v.dir, "credentials.yaml") }

func (v *secretVolume) update(content string) {
	v.t.Helper()
	v.version++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", v.version, v.version)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		v.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, ts, "credentials.yaml"), []byte(content), 0o600); err != nil {
		v.t.Fatal(err)
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}

// logBuffer collects a logger's output for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func fileWith(id string, hashes ...string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "tenants:\n  - id: %s\n    tokens:\n", id)
	for _, h := range hashes {
		fmt.Fprintf(&sb, "      - sha256: %q\n", h)
	}
	return sb.String()
}

// TestSourceReload: a Secret update (symlink swap) is picked up by the
// next poll — a new token works, a removed one stops; an invalid update
// is logged once and the last good credentials keep serving; an
// unchanged file is not parsed again.
func TestSourceReload(t *testing.T) {
	t.Parallel()
	vol := newSecretVolume(t, fileWith("team-a", hashA))
	logs := &logBuffer{}
	src, err := auth.NewSource(vol.path(), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if src.Current().TenantForToken(tokenA) == nil || src.Current().TenantForToken(tokenB) != nil {
		t.Fatal("initial credentials: want token A only")
	}
	if !strings.Contains(logs.String(), "auth credentials loaded") || strings.Contains(logs.String(), hashA) {
		t.Errorf("load log (counts, no hashes):\n%s", logs)
	}
	if src.Reload() {
		t.Error("Reload of an unchanged file reported new credentials")
	}

	vol.update(fileWith("team-a", hashB))
	if !src.Reload() {
		t.Fatal("Reload after a Secret update did not load it")
	}
	if src.Current().TenantForToken(tokenB) == nil || src.Current().TenantForToken(tokenA) != nil {
		t.Error("after the update: want token B only")
	}

	good := src.Current()
	vol.update("tenants:\n  - id: team-a\n    tokens: [{sha256: nothex}]\n")
	for range 3 {
		if src.Reload() {
			t.Error("Reload of an invalid file reported new credentials")
		}
	}
	if src.Current() != good {
		t.Error("an invalid update replaced the credentials")
	}
	if n := strings.Count(logs.String(), "auth credentials reload failed"); n != 1 {
		t.Errorf("invalid update logged %d times, want once:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "tenants[0].tokens[0].sha256") {
		t.Errorf("the failure does not name the field:\n%s", logs)
	}

	// The file disappears (a broken mount), then comes back fixed.
	if err := os.Remove(filepath.Join(vol.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if src.Reload() || src.Current() != good {
		t.Error("a missing file replaced the credentials")
	}
	vol.update(fileWith("team-a", hashA, hashB))
	if !src.Reload() || src.Current().TenantForToken(tokenA) == nil || src.Current().TenantForToken(tokenB) == nil {
		t.Error("the fixed file was not loaded")
	}
}

// TestSourceWatch: Watch polls until its context ends.
func TestSourceWatch(t *testing.T) {
	t.Parallel()
	vol := newSecretVolume(t, fileWith("team-a", hashA))
	src, err := auth.NewSource(vol.path(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Watch(ctx, 10*time.Millisecond)
	}()
	vol.update(fileWith("team-b", hashB))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if tn := src.Current().TenantForToken(tokenB); tn != nil && tn.ID == "team-b" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Watch did not pick up the update")
		}
	}
	cancel()
	<-done
}

// TestNewSourceRefuses: a missing or invalid file at start is an error
// that says why.
func TestNewSourceRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := auth.NewSource(filepath.Join(dir, "missing.yaml"), nil); err == nil ||
		!strings.Contains(err.Error(), "cannot read: no such file or directory") {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("tenants: [{id: a, tokens: [{sha256: x}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.NewSource(bad, nil); err == nil || !strings.Contains(err.Error(), "tenants[0].tokens[0].sha256") {
		t.Errorf("invalid file: %v", err)
	}
}
