package memory

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/storetest"
	"google.golang.org/protobuf/proto"
)

// disk is a Persist hook that keeps what it was given, marshalled, as a
// durable store would, and fails while broken is set.
type disk struct {
	broken   atomic.Bool
	refused  atomic.Int64 // writes refused while broken
	mu       sync.Mutex
	sessions map[string][]byte
	events   map[uint64][]byte
	last     uint64
	calls    int
}

func newDisk() *disk {
	return &disk{sessions: map[string][]byte{}, events: map[uint64][]byte{}}
}

var errBroken = errors.New("disk on fire")

func (d *disk) persist(changes []Change) error {
	if d.broken.Load() {
		d.refused.Add(1)
		return errBroken
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	for _, c := range changes {
		if c.Session == nil {
			delete(d.sessions, c.SessionID)
		} else {
			b, err := proto.Marshal(c.Session)
			if err != nil {
				return err
			}
			d.sessions[c.SessionID] = b
		}
		for _, ev := range c.Events {
			if ev.GetSequence() == 0 {
				return errors.New("an event without its sequence")
			}
			b, err := proto.Marshal(ev)
			if err != nil {
				return err
			}
			d.events[ev.GetSequence()] = b
			d.last = max(d.last, ev.GetSequence())
		}
	}
	return nil
}

// state is what a restart would read back.
func (d *disk) state(t *testing.T) *State {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &State{LastSequence: d.last}
	for _, b := range d.sessions {
		var snap statev1.Session
		if err := proto.Unmarshal(b, &snap); err != nil {
			t.Fatal(err)
		}
		sess, err := engine.RestoreSession(&snap)
		if err != nil {
			t.Fatal(err)
		}
		st.Sessions = append(st.Sessions, sess)
	}
	for _, seq := range slices.Sorted(func(yield func(uint64) bool) {
		for k := range d.events {
			if !yield(k) {
				return
			}
		}
	}) {
		ev := &retrydv1.Event{}
		if err := proto.Unmarshal(d.events[seq], ev); err != nil {
			t.Fatal(err)
		}
		st.Events = append(st.Events, ev)
	}
	return st
}

func sequences(s *Store) []uint64 {
	evs, _, _ := s.log.read(0, "", 1000)
	var out []uint64
	for _, ev := range evs {
		out = append(out, ev.GetSequence())
	}
	return out
}

// stateOf reads a retry's state under its shard lock.
func stateOf(s *Store, r *engine.Retry) *retrydv1.RetryState {
	sh, _ := s.shardOf(r.SessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return r.State()
}

func chainsOf(t *testing.T, s *Store, session string) *retrydv1.GetChainsResponse {
	t.Helper()
	resp, err := store.New(s).GetChains(context.Background(), session)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestFailedPersistChangesNothing: when the write fails, the call fails
// with ErrUnavailable and nothing of the change is visible: not the
// session, not the retry, not the events; the next call succeeds as if the
// failed one never happened.
func TestFailedPersistChangesNothing(t *testing.T) {
	t.Parallel()
	d := newDisk()
	var ahead atomic.Int64 // how far the store's clock is ahead of the wall clock
	s := New(Config{Options: store.Options{Now: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }}, Persist: d.persist})
	defer s.Close()
	ctx := context.Background()

	first := fail(t, s, "a", 1, 3_600_000)
	firstID := first.GetDecision().GetSchedule().GetRetryId()
	if seq := first.GetEvent().GetSequence(); seq != 1 {
		t.Fatalf("first event has sequence %d, want 1", seq)
	}
	var stored statev1.Session
	if err := proto.Unmarshal(d.sessions["a"], &stored); err != nil {
		t.Fatal(err)
	}
	if got := stored.GetRecords()[0].GetResponse(); !proto.Equal(got, first) {
		t.Fatalf("the stored response is not the one the agent received:\n got %v\nwant %v", got, first)
	}
	before := chainsOf(t, s, "a")

	d.broken.Store(true)
	if _, err := storetest.CancelRetry(ctx, s, firstID); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("CancelRetry with a broken disk: %v, want ErrUnavailable", err)
	}
	if _, err := store.New(s).CancelSession(ctx, "a"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("CancelSession with a broken disk: %v, want ErrUnavailable", err)
	}
	if _, err := store.New(s).FailedStep(ctx, engine.Failure{Request: &retrydv1.FailedStepRequest{
		SessionId: "b", Turn: 1, Step: 1, Failure: &retrydv1.Failure{Code: "SERVER"}}}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("FailedStep with a broken disk: %v, want ErrUnavailable", err)
	}
	if after := chainsOf(t, s, "a"); !proto.Equal(after, before) {
		t.Errorf("a failed write changed the session:\n got %v\nwant %v", after, before)
	}
	if _, err := store.New(s).GetChains(ctx, "b"); err == nil {
		t.Error("a session whose first write failed exists")
	}
	if got := sequences(s); !slices.Equal(got, []uint64{1}) {
		t.Errorf("log after failed writes: %v, want [1]", got)
	}
	// The agent is there and the retry is due, but the start cannot be
	// written: the awaiter is refused and the retry stays pending.
	r, err := s.indexed(firstID)
	if err != nil {
		t.Fatal(err)
	}
	ahead.Store(int64(time.Hour + time.Second)) // the retry is due
	err = storetest.AwaitRetry(ctx, s, firstID, func(*retrydv1.AwaitRetryResponse) error {
		t.Error("AwaitRetry sent a message although the start was not written")
		return nil
	})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("AwaitRetry with a broken disk: %v, want ErrUnavailable", err)
	}
	if st := stateOf(s, r); st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING || st.GetAwaiters() != 0 {
		t.Fatalf("after the failed start: %v", st)
	}

	d.broken.Store(false)
	var msgs []*retrydv1.AwaitRetryResponse
	if err := storetest.AwaitRetry(ctx, s, firstID, func(m *retrydv1.AwaitRetryResponse) error {
		msgs = append(msgs, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 || msgs[1].GetStarted() == nil {
		t.Fatalf("AwaitRetry once the disk works: %v", msgs)
	}
	// The failed writes' sequences were never used: a gap, still increasing.
	got := sequences(s)
	if len(got) != 2 || got[0] != 1 || got[1] <= 2 {
		t.Errorf("log: %v, want [1 n] with n beyond the abandoned sequences", got)
	}
	b := fail(t, s, "b", 1, 1)
	if id := b.GetDecision().GetSchedule().GetRetryId(); id == "" || d.sessions["b"] == nil {
		t.Errorf("session b after the disk recovered: %v", b)
	}
}

// TestTimerRetriesAFailedStart: a start that falls due while the disk is
// broken is tried again, and the awaiter receives exactly one Started.
func TestTimerRetriesAFailedStart(t *testing.T) {
	t.Parallel()
	d := newDisk()
	s := New(Config{Persist: d.persist})
	defer s.Close()
	// The awaiter must attach before the retry falls due (an AwaitRetry
	// that finds it already due starts it itself), so the delay leaves
	// room for a slow goroutine start and the test waits on what it sees.
	id := fail(t, s, "a", 1, 1500).GetDecision().GetSchedule().GetRetryId()
	r, err := s.indexed(id)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []*retrydv1.AwaitRetryResponse, 1)
	go func() {
		var msgs []*retrydv1.AwaitRetryResponse
		err := storetest.AwaitRetry(context.Background(), s, id, func(m *retrydv1.AwaitRetryResponse) error {
			msgs = append(msgs, m)
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		got <- msgs
	}()
	waitFor(t, "the awaiter to attach", func() bool { return stateOf(s, r).GetAwaiters() == 1 })
	if st := stateOf(s, r); st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		t.Fatalf("the retry started before the test broke the disk: %v", st)
	}
	d.broken.Store(true)
	waitFor(t, "the due start to be refused", func() bool { return d.refused.Load() > 0 })
	if st := stateOf(s, r); st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		t.Fatalf("started although the disk is broken: %v", st)
	}
	d.broken.Store(false)
	select {
	case msgs := <-got:
		if len(msgs) != 2 || msgs[1].GetStarted() == nil {
			t.Fatalf("awaiter received %v", msgs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the start was never retried")
	}
	started := 0
	evs, _, _ := s.log.read(0, "", 100)
	for _, ev := range evs {
		if ev.GetStarted() != nil {
			started++
		}
	}
	if started != 1 {
		t.Errorf("%d Started events, want 1", started)
	}
}

// TestRestoreContinuesWhereItStopped: a store started from what another
// persisted answers the same, continues the numbering, and runs the
// pending retries' timers.
func TestRestoreContinuesWhereItStopped(t *testing.T) {
	t.Parallel()
	d := newDisk()
	ctx := context.Background()
	a := New(Config{Persist: d.persist})
	idle := fail(t, a, "idle", 1, 1)
	if _, err := storetest.CancelRetry(ctx, a, idle.GetDecision().GetSchedule().GetRetryId()); err != nil {
		t.Fatal(err)
	}
	soon := fail(t, a, "soon", 1, 300).GetDecision().GetSchedule()
	late := fail(t, a, "late", 1, 1).GetDecision().GetSchedule() // falls due while the store is down
	want := map[string]*retrydv1.GetChainsResponse{}
	for _, id := range []string{"idle", "soon", "late"} {
		want[id] = chainsOf(t, a, id)
	}
	wantSeqs := sequences(a)
	a.Close() // what a crash leaves is what Persist was given

	st := d.state(t)
	if st.LastSequence != wantSeqs[len(wantSeqs)-1] {
		t.Fatalf("last sequence %d, want %d", st.LastSequence, wantSeqs[len(wantSeqs)-1])
	}
	time.Sleep(20 * time.Millisecond)
	b := New(Config{Options: store.Options{AbandonGrace: time.Minute}, Persist: d.persist, Restore: st})
	defer b.Close()
	for id, w := range want {
		if got := chainsOf(t, b, id); !proto.Equal(got, w) {
			t.Errorf("session %s after restore:\n got %v\nwant %v", id, got, w)
		}
	}
	if got := sequences(b); !slices.Equal(got, wantSeqs) {
		t.Errorf("restored log %v, want %v", got, wantSeqs)
	}
	// The same report answers the same response, retry id included.
	again := fail(t, b, "soon", 1, 300)
	if !proto.Equal(again.GetDecision().GetSchedule(), soon) {
		t.Errorf("repeated report after restore: %v, want %v", again.GetDecision().GetSchedule(), soon)
	}
	for _, s := range []*retrydv1.Schedule{soon, late} {
		var msgs []*retrydv1.AwaitRetryResponse
		if err := storetest.AwaitRetry(ctx, b, s.GetRetryId(), func(m *retrydv1.AwaitRetryResponse) error {
			msgs = append(msgs, m)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 2 || msgs[1].GetStarted().GetRetryNumber() != s.GetRetryNumber() {
			t.Errorf("await %s after restore: %v", s.GetRetryId(), msgs)
		}
		if at := msgs[1].GetStarted().GetStartedAt().AsTime(); at.Before(s.GetDueAt().AsTime()) {
			t.Errorf("retry %s started at %v, before its due time %v", s.GetRetryId(), at, s.GetDueAt().AsTime())
		}
	}
	next := fail(t, b, "new", 1, 1)
	if seq := next.GetEvent().GetSequence(); seq <= st.LastSequence {
		t.Errorf("first event after restore has sequence %d, want after %d", seq, st.LastSequence)
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
