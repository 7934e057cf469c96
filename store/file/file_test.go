package file_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/policy"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/file"
	"github.com/retryd/retryd/store/memory"
	"github.com/retryd/retryd/store/storetest"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

func open(t *testing.T, dir string, cfg memory.Config) *file.Store {
	t.Helper()
	s, err := file.Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func failStep(t *testing.T, s *file.Store, session string, step uint64, delayMs uint64) *retrydv1.FailedStepResponse {
	t.Helper()
	p, err := policy.Resolve(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(delayMs), MaxDelayMs: proto.Uint64(delayMs), JitterRatio: proto.Float64(0)}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := store.New(s).FailedStep(context.Background(), engine.Failure{
		Request: &retrydv1.FailedStepRequest{SessionId: session, Turn: 1, Step: step, Provider: "p",
			Failure: &retrydv1.Failure{Code: "SERVER"}},
		Policy: p,
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Response
}

func events(t *testing.T, s *file.Store) []*retrydv1.Event {
	t.Helper()
	var out []*retrydv1.Event
	err := store.New(s).WatchEvents(context.Background(), &retrydv1.WatchEventsRequest{StopAtEnd: true}, func(ev *retrydv1.Event) error {
		out = append(out, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReopenKeepsEverything: a store closed and opened again on the same
// directory has the same sessions, retries and log, and numbers on.
func TestReopenKeepsEverything(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	a := open(t, dir, memory.Config{})
	cancelled := failStep(t, a, "a", 1, 1).GetDecision().GetSchedule().GetRetryId()
	if _, err := storetest.CancelRetry(ctx, a, cancelled); err != nil {
		t.Fatal(err)
	}
	pending := failStep(t, a, "a", 2, 3_600_000)
	failStep(t, a, "b", 1, 3_600_000)
	if _, err := store.New(a).CancelSession(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	wantChains := map[string]*retrydv1.GetChainsResponse{}
	for _, id := range []string{"a", "b"} {
		c, err := store.New(a).GetChains(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		wantChains[id] = c
	}
	wantEvents := events(t, a)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	b := open(t, dir, memory.Config{})
	for id, want := range wantChains {
		got, err := store.New(b).GetChains(ctx, id)
		if err != nil || !proto.Equal(got, want) {
			t.Errorf("session %s after reopening: %v %v\nwant %v", id, got, err, want)
		}
	}
	gotEvents := events(t, b)
	if len(gotEvents) != len(wantEvents) {
		t.Fatalf("%d events after reopening, want %d", len(gotEvents), len(wantEvents))
	}
	for i := range gotEvents {
		if !proto.Equal(gotEvents[i], wantEvents[i]) {
			t.Errorf("event %d after reopening: %v, want %v", i, gotEvents[i], wantEvents[i])
		}
	}
	// The same report is answered from the stored record: same retry id.
	if again := failStep(t, b, "a", 2, 3_600_000); !proto.Equal(again, pending) {
		t.Errorf("repeated report after reopening: %v, want %v", again, pending)
	}
	next := failStep(t, b, "c", 1, 1)
	if seq, last := next.GetEvent().GetSequence(), wantEvents[len(wantEvents)-1].GetSequence(); seq != last+1 {
		t.Errorf("first new event has sequence %d, want %d", seq, last+1)
	}
	for _, v := range invariant.Check(events(t, b)) {
		t.Errorf("invariant violation: %s", v)
	}
}

// TestEventsAreTrimmed: the database keeps the newest EventLogSize events,
// as the log does.
func TestEventsAreTrimmed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := open(t, dir, memory.Config{Options: store.Options{EventLogSize: 5}})
	for step := range uint64(12) {
		// Each retry is cancelled before the next report.
		r := failStep(t, a, "s", step+1, 3_600_000)
		failStep(t, a, "s", step+1, 3_600_000) // a repeated report records nothing
		if id := r.GetDecision().GetSchedule().GetRetryId(); id != "" {
			if _, err := storetest.CancelRetry(context.Background(), a, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := events(t, a)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, file.FileName), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = db.View(func(tx *bolt.Tx) error { n = tx.Bucket([]byte("events")).Stats().KeyN; return nil })
	db.Close()
	if err != nil || n != 5 {
		t.Fatalf("the database holds %d events (%v), want 5", n, err)
	}
	b := open(t, dir, memory.Config{Options: store.Options{EventLogSize: 5}})
	got := events(t, b)
	if len(got) != 5 || len(want) != 5 || got[0].GetSequence() != want[0].GetSequence() || got[4].GetSequence() != want[4].GetSequence() {
		t.Errorf("reopened log %v, want %v", got, want)
	}
}

// writeSchemaVersion makes dir a store of another schema version.
func writeSchemaVersion(t *testing.T, dir, version string) {
	t.Helper()
	s := open(t, dir, memory.Config{})
	failStep(t, s, "s", 1, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, file.FileName), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schema_version"), []byte(version))
	}); err != nil {
		t.Fatal(err)
	}
}

func TestOtherSchemaVersionIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeSchemaVersion(t, dir, "2")
	_, err := file.Open(dir, memory.Config{})
	var se *file.SchemaError
	if !errors.As(err, &se) || se.Found != "2" || se.Want != file.SchemaVersion {
		t.Fatalf("Open: %v, want a SchemaError naming versions 2 and %d", err, file.SchemaVersion)
	}
}

func TestNotARetrydStoreIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, file.FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := file.Open(dir, memory.Config{}); err == nil || !strings.Contains(err.Error(), "not a retryd store") {
		t.Fatalf("Open of a foreign database: %v", err)
	}
}

func TestLockedByAnotherProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open(t, dir, memory.Config{})
	if _, err := file.Open(dir, memory.Config{}); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second Open of one directory: %v, want a lock error", err)
	}
}

// TestServeRefusesOtherSchemaVersion: the binary exits non-zero, naming the
// version it found and the one it reads.
func TestServeRefusesOtherSchemaVersion(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeSchemaVersion(t, dir, "7")
	bin := retrydtest.Binary(t) // built before the clock starts
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0", "--store", "file:"+dir).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("retryd serve on a store of schema version 7: %v\n%s", err, out)
	}
	for _, want := range []string{"schema version 7", "schema version 1", dir} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "serving") {
		t.Errorf("retryd served before refusing:\n%s", out)
	}
}

// TestServeRefusesUnreachableStore: a directory that cannot be created is a
// start-up error, not a server without state.
func TestServeRefusesUnreachableStore(t *testing.T) {
	t.Parallel()
	blocker := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := retrydtest.Binary(t) // built before the clock starts
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0",
		"--store", "file:"+filepath.Join(blocker, "dir")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "file store") {
		t.Fatalf("retryd serve on an unreachable store: %v\n%s", err, out)
	}
}
