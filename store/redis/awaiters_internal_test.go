package redis

import (
	"context"
	"github.com/retryd/retryd/store"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/protobuf/proto"
)

// TestAwaiterEntryChangesRevision: writing or deleting an awaiter entry
// gives the session's snapshot a new revision (and nothing else of it
// changes), so a commit decided on what the replica knew before fails its
// revision check and decides again with the entry; a snapshot without a
// revision gets one; a session that does not exist gets no entry.
func TestAwaiterEntryChangesRevision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Shared(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	s := openReplica(t, srv.URL(0), redistest.Prefix(), newFakeClock(), &atomic.Int64{}, false)
	pol := fixedPolicy(t, time.Hour, 3)
	out, err := store.New(s).FailedStep(ctx, failureOf(pol, "s", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	retryID := out.Scheduled.ID
	key := s.keys.sessionKey("s")
	// awaiters is what a transition of the replica finds for the retry.
	awaiters := func() int64 {
		t.Helper()
		var n int64
		if err := s.update(ctx, "s", func(tx *txn) error { n = tx.awaiters[retryID]; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := awaiters(); n != 0 {
		t.Fatalf("awaiters before any attached: %d", n)
	}

	before := rdb.Get(ctx, key).Val()
	aw, err := s.attach(ctx, "s", retryID, out.Scheduled.Due())
	if err != nil {
		t.Fatal(err)
	}
	after := rdb.Get(ctx, key).Val()
	head := len(before) - revisionLen
	if len(after) != len(before) || after[:head] != before[:head] || revisionSuffix([]byte(after)) == revisionSuffix([]byte(before)) {
		t.Fatalf("attaching changed the snapshot from %x to %x, want a new revision only", before, after)
	}
	if n := awaiters(); n != 1 {
		t.Errorf("awaiters once one attached: %d, want 1", n)
	}
	aw.Detach()
	if n := awaiters(); n != 0 {
		t.Errorf("awaiters once it detached: %d, want 0", n)
	}

	// A snapshot without a revision (written by hand) gets one.
	sess, err := s.loadOne(ctx, "s")
	if err != nil || sess == nil {
		t.Fatalf("loading the session: %v %v", sess, err)
	}
	snap := sess.Snapshot()
	snap.Revision = nil
	bare, err := proto.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, key, bare, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	aw, err = s.attach(ctx, "s", retryID, out.Scheduled.Due())
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Detach()
	revised := rdb.Get(ctx, key).Val()
	if revisionSuffix([]byte(revised)) == "" || revised[:len(bare)] != string(bare) {
		t.Fatalf("attaching to a snapshot without a revision made %x of %x, want a revision appended", revised, bare)
	}
	got, err := s.loadOne(ctx, "s")
	if err != nil || got == nil {
		t.Fatalf("the session after a revision was appended: %v (%v)", got, err)
	}
	if gotSnap := got.Snapshot(); !proto.Equal(gotSnap, snap) {
		t.Fatalf("the session after a revision was appended: %v, want %v", gotSnap, snap)
	}
	if n := awaiters(); n != 1 {
		t.Errorf("awaiters once one attached to a snapshot without a revision: %d, want 1", n)
	}

	// No session, no entry.
	if _, err := s.attach(ctx, "nobody", "R9", out.Scheduled.Due()); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, s.keys.awaitersKey("nobody"), s.keys.sessionKey("nobody")).Val() +
		rdb.ZCount(ctx, s.keys.timersKey(0), "-inf", "+inf").Val() - 1; n != 0 {
		t.Errorf("an attach to a session that does not exist wrote %d keys", n)
	}
}
