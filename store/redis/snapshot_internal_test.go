package redis

import (
	"bytes"
	"context"
	"github.com/retryd/retryd/store"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// TestEncodeSessionReusesTerminalRetries: on a long session, whose
// snapshots a replica assembles from the encodings of terminal retries it
// wrote before (encodeSession), the snapshot in Redis holds exactly the
// session's state, in the bytes of a fresh Snapshot; the replica records
// where each terminal retry is in it, and no place for the pending one,
// whose state will still change.
func TestEncodeSessionReusesTerminalRetries(t *testing.T) {
	t.Parallel()
	a, _, _ := replicaPair(t, false)
	v := longSession(t, a, "long")
	ctx := context.Background()
	raw, err := a.rdb.Get(ctx, a.keys.sessionKey("long")).Result()
	if err != nil || raw != v.raw {
		t.Fatalf("Redis holds %d bytes (%v), the replica knows %d", len(raw), err, len(v.raw))
	}
	got := &statev1.Session{}
	if err := proto.Unmarshal([]byte(raw), got); err != nil {
		t.Fatal(err)
	}
	if len(got.GetRevision()) != revisionLen {
		t.Errorf("revision of %d bytes", len(got.GetRevision()))
	}
	got.Revision = nil
	if diff := cmpDiff(v.sess.Snapshot(), got); diff != "" {
		t.Errorf("the snapshot in Redis is not the session's (want, then got):\n%s", diff)
	}

	retries := v.sess.Retries()
	if len(retries) != engine.MaxRetainedRetries || len(v.indexed) != len(retries) {
		t.Fatalf("%d retained retries, %d indexed", len(retries), len(v.indexed))
	}
	for i, r := range retries {
		x := v.indexed[i]
		pending := r.Status == retrydv1.RetryStatus_RETRY_STATUS_PENDING
		if pending != (i == len(retries)-1) || x.id != r.ID || pending != (x.n == 0) {
			t.Fatalf("retry %d (%s): indexed %+v", i, r.Status, x)
		}
		if pending {
			continue
		}
		enc, err := r.Snapshot().MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		if at := v.snap[x.off : x.off+x.n]; at != string(enc) {
			t.Errorf("retry %d: the recorded place holds %x, want %x", i, at, enc)
		}
	}

	full, err := v.sess.Snapshot().MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	for name, prev := range map[string]keptSession{"reusing": v.keptSession, "encoding all": {sess: v.sess}} {
		b, _, err := encodeSession(v.sess, prev)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(b) - 2 - revisionLen; n < 0 || !bytes.Equal(b[:n], full) || revisionSuffix(b) == "" {
			t.Errorf("%s: encodeSession's bytes are not Snapshot's and a revision", name)
		}
	}
}

// BenchmarkEncodeSession: encoding a long session's snapshot (as
// TestEncodeSessionReusesTerminalRetries makes it: engine.MaxRetainedRetries
// retries, all but one terminal) for a write, copying the terminal
// retries' encodings from the last snapshot (reusing) or not
// (encoding-all), and as before encodeSession (snapshot: Snapshot, then
// MarshalVT).
//
//	go test -run '^$' -bench EncodeSession -benchmem ./store/redis/
func BenchmarkEncodeSession(b *testing.B) {
	a, _, _ := replicaPair(b, false)
	v := longSession(b, a, "long")
	b.Run("reusing", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := encodeSession(v.sess, v.keptSession); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-all", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := encodeSession(v.sess, keptSession{sess: v.sess}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("snapshot", func(b *testing.B) {
		for b.Loop() {
			ss := v.sess.Snapshot()
			ss.Revision = newRevision()
			if _, err := ss.MarshalVT(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// longSession makes a session of more decisions than a session retains
// retries on replica a — started and cancelled retries, each written while
// pending first, and a pending one last — and returns what a knows of it.
func longSession(t testing.TB, a *Store, id string) knownValue {
	t.Helper()
	ctx := context.Background()
	pol := fixedPolicy(t, time.Second, 1000)
	step := uint64(0)
	fail := func() string {
		t.Helper()
		step++
		out, err := store.New(a).FailedStep(ctx, failureOf(pol, id, 1, step))
		if err != nil {
			t.Fatal(err)
		}
		rid := out.Response.GetDecision().GetSchedule().GetRetryId()
		if rid == "" {
			t.Fatalf("step %d: %v, want a schedule", step, out.Response.GetDecision())
		}
		return rid
	}
	// Started and cancelled retries, more than a session retains, each
	// written while pending first; the last one stays pending.
	for i := range 2 * engine.MaxRetainedRetries {
		rid := fail()
		if i%2 == 0 {
			if err := startRetry(ctx, a, id, rid); err != nil {
				t.Fatal(err)
			}
		} else if _, err := store.New(a).CancelSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	fail()
	v := a.known.get(a.keys.sessionKey(id))
	if v.sess == nil || v.snap != v.raw {
		t.Fatalf("the replica keeps no session with its snapshot (sess %v, snap %d of raw %d bytes)", v.sess != nil, len(v.snap), len(v.raw))
	}
	return v
}

// cmpDiff is "" when want and got are equal, else both as text.
func cmpDiff(want, got proto.Message) string {
	if proto.Equal(want, got) {
		return ""
	}
	return prototext.Format(want) + "\n" + prototext.Format(got)
}
