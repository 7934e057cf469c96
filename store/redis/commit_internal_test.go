package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestCommitScript: a commit writes only when every check holds — a
// value, a value's SHA-1 (and absence), a snapshot's revision, a hash's
// exact fields; an awaiter hash is compared by nothing — and then runs
// every write; a failed check writes nothing and sends back every checked
// value whole, the awaiter hash too.
func TestCommitScript(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	ctx := context.Background()
	p := redistest.Prefix()
	seq, snap, aw, out, stream, ch := p+"seq", p+"snap", p+"aw", p+"out", p+"stream", p+"channel"
	rsnap, aw2 := p+"rsnap", p+"aw2"
	revised := func(id string) (raw, revision string) {
		b, err := (&statev1.Session{Id: id, Revision: newRevision()}).MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		if revision = revisionSuffix(b); revision == "" {
			t.Fatalf("snapshot %x has no revision suffix", b)
		}
		return string(b), revision
	}
	rgood, rrev := revised("s")
	_, rother := revised("s") // the same session, written again by another commit
	if err := rdb.Set(ctx, rsnap, rgood, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, seq, "7", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, snap, "\x00binary\xffsnapshot", 0).Err(); err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{"R1 tok": "123", "R2 tok2": "456", "R1 a\x00b": "7"}
	if err := rdb.HSet(ctx, aw, fields).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, aw2, "R3 tok", "789").Err(); err != nil {
		t.Fatal(err)
	}
	sub := rdb.Subscribe(ctx, ch)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}

	build := func(seqWant, snapWant, revWant string, awWant map[string]string) *commit {
		c := newCommit()
		c.checkValue(seq, seqWant)
		c.checkLarge(snap, snapWant, "")
		c.checkLarge(p+"absent", "", "")
		c.checkLarge(rsnap, rgood, revWant)
		c.checkHash(aw, awWant)
		c.checkAwaiters(aw2, nil) // compared by nothing: known stale here
		c.Set(ctx, out, []byte("written"), time.Minute)
		c.XAdd(ctx, stream, []any{"MAXLEN", "~", 100}, "5-0", "e", []byte("event"))
		c.ZAdd(ctx, out+":z", 1.5, "m")
		c.HDel(ctx, aw, "R1 a\x00b")
		c.Publish(ctx, ch, "")
		return c
	}
	good := "\x00binary\xffsnapshot"
	for name, c := range map[string]*commit{
		"counter":  build("8", good, rrev, fields),
		"snapshot": build("7", "other", rrev, fields),
		"absent":   build("7", "", rrev, fields),
		"revision": build("7", good, rother, fields),
		"awaiters": build("7", good, rrev, map[string]string{"R1 tok": "123", "R2 tok2": "456"}),
	} {
		current, err := c.run(ctx, rdb)
		if !errors.Is(err, errConflict) {
			t.Errorf("%s changed: %v, want errConflict", name, err)
		}
		if n, err := rdb.Exists(ctx, out, stream, out+":z").Result(); err != nil || n != 0 {
			t.Fatalf("%s changed: %d keys written (%v), want none", name, n, err)
		}
		// The answer holds every checked key's current value, which a
		// replica then knows.
		k := newKnown()
		k.learn(c.list, current)
		if got := k.get(seq).raw; got != "7" {
			t.Errorf("%s changed: the counter sent back is %q", name, got)
		}
		if got := k.get(snap).raw; got != good {
			t.Errorf("%s changed: the snapshot sent back is %q", name, got)
		}
		// A revision check compares only the last bytes, passed or not:
		// the value is sent back whole, and known without a revision
		// (this replica did not write it).
		if got := k.get(rsnap); got.raw != rgood || got.revision != "" {
			t.Errorf("%s changed: the revised snapshot sent back is %q, revision %q", name, got.raw, got.revision)
		}
		if got := k.get(p + "absent"); got.raw != "" || got.fields != nil {
			t.Errorf("%s changed: the absent key sent back is %v", name, got)
		}
		if got := k.get(aw).fields; canonicalHash(got) != canonicalHash(fields) {
			t.Errorf("%s changed: the hash sent back is %v", name, got)
		}
		if got := k.get(aw2).fields; len(got) != 1 || got["R3 tok"] != "789" {
			t.Errorf("%s changed: the awaiter hash sent back is %v", name, got)
		}
	}
	c := build("7", good, rrev, fields)
	if _, err := c.run(ctx, rdb); err != nil {
		t.Fatalf("nothing changed: %v", err)
	}
	// What the replica knows afterwards: the writes to checked keys, and
	// the revision of the snapshot it checked and left as it was.
	k := newKnown()
	c.remember(k)
	if got := k.get(rsnap); got.raw != rgood || got.revision != rrev {
		t.Errorf("after the commit the replica knows the revised snapshot as %q, revision %q", got.raw, got.revision)
	}
	if got := k.get(aw).fields; len(got) != 2 || got["R1 a\x00b"] != "" {
		t.Errorf("after HDEL the replica knows the hash as %v", got)
	}
	if v, _ := rdb.Get(ctx, out).Result(); v != "written" {
		t.Errorf("SET: %q", v)
	}
	if ttl, _ := rdb.PTTL(ctx, out).Result(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("SET PX: ttl %v", ttl)
	}
	if msgs, _ := rdb.XRange(ctx, stream, "-", "+").Result(); len(msgs) != 1 || msgs[0].ID != "5-0" || msgs[0].Values["e"] != "event" {
		t.Errorf("XADD: %v", msgs)
	}
	if z, _ := rdb.ZScore(ctx, out+":z", "m").Result(); z != 1.5 {
		t.Errorf("ZADD: %v", z)
	}
	if ok, _ := rdb.HExists(ctx, aw, "R1 a\x00b").Result(); ok {
		t.Error("HDEL: the field is still there")
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Channel != ch {
		t.Errorf("PUBLISH: %v %v", msg, err)
	}
}

// TestSnapshotRevision: a snapshot written with setSnapshot is known with
// its revision, a value written with Set without one; a snapshot whose
// revision is not its last field has none to check by.
func TestSnapshotRevision(t *testing.T) {
	tok := newRevision()
	if other := newRevision(); string(other) == string(tok) {
		t.Fatalf("two revisions are equal: %x", tok)
	}
	snap, err := (&statev1.Session{Id: "s", Revision: tok}).MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	want := string(snap[len(snap)-2-revisionLen:])
	if got := revisionSuffix(snap); got != want || got[2:] != string(tok) {
		t.Fatalf("revisionSuffix = %x, want %x", got, want)
	}
	for name, b := range map[string][]byte{
		"none":      mustMarshal(t, &statev1.Session{Id: "s"}),
		"short":     mustMarshal(t, &statev1.Session{Id: "s", Revision: tok[:8]}),
		"not last":  append(snap[:len(snap):len(snap)], 0x08, 0x01), // an unknown field after it
		"truncated": snap[len(snap)-revisionLen:],
	} {
		if got := revisionSuffix(b); got != "" {
			t.Errorf("%s: revisionSuffix = %x, want none", name, got)
		}
	}

	ctx := context.Background()
	c := newCommit()
	c.checkLarge("k", "old", "")
	c.setSnapshot(ctx, "k", snap, time.Minute)
	if v := c.after["k"]; v.raw != string(snap) || v.revision != want {
		t.Errorf("after setSnapshot: %q, revision %x", v.raw, v.revision)
	}
	c.Set(ctx, "k", []byte("plain"), 0)
	if v := c.after["k"]; v.raw != "plain" || v.revision != "" {
		t.Errorf("after Set: %q, revision %x", v.raw, v.revision)
	}
}

func mustMarshal(t *testing.T, m *statev1.Session) []byte {
	t.Helper()
	b, err := m.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
