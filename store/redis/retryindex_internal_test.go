package redis

import (
	"bufio"
	"context"
	"fmt"
	"github.com/retryd/retryd/store"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestRetryIndexKeys: whichever replica wrote a session last, every
// retained retry's index key lives at least as long as the session's key,
// and a commit writes the index keys only of new retries, of retries it
// does not know the keys of (a session decoded from its snapshot), and of
// retries whose keys near that bound — not of every retained retry on
// every write. The writes are counted with MONITOR, which shows the
// commands the commit script runs.
func TestRetryIndexKeys(t *testing.T) {
	t.Parallel()
	a, b, clock := replicaPair(t, false)
	ctx := context.Background()
	pol := fixedPolicy(t, time.Second, 1000)
	mon := newMonitor(t, redistest.Shared(t).Addr)

	const session = "a session id no retry id can name"
	step := uint64(0)
	// run fails the session's next step on replica s and starts its retry
	// (two commits), then checks the keys, and returns how many index
	// keys the two commits wrote.
	run := func(s *Store) int {
		t.Helper()
		step++
		mark := mon.mark(t)
		o, err := store.New(s).FailedStep(ctx, failureOf(pol, session, 1, step))
		if err != nil || o.Scheduled == nil {
			t.Fatalf("step %d: %v, scheduled %v", step, err, o.Scheduled)
		}
		if err := startRetry(ctx, s, session, o.Scheduled.ID); err != nil {
			t.Fatalf("step %d: starting: %v", step, err)
		}
		sess, err := s.loadOne(ctx, session)
		if err != nil {
			t.Fatal(err)
		}
		sessionTTL := pttl(t, s, s.keys.sessionKey(session))
		writes := mon.since(t, mark)
		n := 0
		for _, r := range sess.Retries() {
			key := retryKeyOf(t, s, r)
			if got := pttl(t, s, key); got < sessionTTL {
				t.Errorf("step %d: retry %s's index key lives %v, its session's key %v", step, r.ID, got, sessionTTL)
			}
			for _, w := range writes {
				if strings.Contains(w, `"SET" "`+key+`"`) {
					n++
				}
			}
		}
		return n
	}
	expect := func(what string, s *Store, want int) {
		t.Helper()
		if got := run(s); got != want {
			t.Errorf("step %d (%s): %d index keys written, want %d", step+0, what, got, want)
		}
	}

	// One replica, a minute between steps: past the first steps the session
	// retains engine.MaxRetainedRetries retries, and each step writes the
	// key of its new retry alone.
	for range engine.MaxRetainedRetries + 4 {
		clock.advance(time.Minute)
		expect("same replica", a, 1)
	}
	// The other replica decodes the session: it writes every key once,
	// then only new ones.
	expect("other replica, first write", b, engine.MaxRetainedRetries)
	expect("other replica again", b, 1)
	// Back on the first replica, whose session is no longer the one
	// Redis holds.
	expect("first replica after the other", a, engine.MaxRetainedRetries)
	expect("first replica again", a, 1)
	// With 40 minutes between steps (more than half the chain TTL of
	// lead an index key has), every key is written again at each step.
	for range 3 {
		clock.advance(40 * time.Minute)
		expect("keys near their bound", a, engine.MaxRetainedRetries)
	}
}

func pttl(t *testing.T, s *Store, key string) time.Duration {
	t.Helper()
	d, err := s.rdb.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 {
		t.Fatalf("key %s: PTTL %v", key, d)
	}
	return d
}

func retryKeyOf(t *testing.T, s *Store, r *engine.Retry) string {
	t.Helper()
	p, ok := s.keys.retryPartition(r.ID)
	if !ok {
		t.Fatalf("retry id %s names no partition", r.ID)
	}
	return s.keys.retryKey(p, r.ID)
}

// monitor collects the commands a Redis runs (MONITOR), scripts' included.
// It speaks RESP on a connection of its own: go-redis' Monitor (v9.23.0)
// hands its connection back to the pool while it still reads from it,
// which the race detector flags
// (https://github.com/redis/go-redis/issues/3079; a fix is proposed in
// https://github.com/redis/go-redis/pull/3901).
type monitor struct {
	rdb   *goredis.Client
	mu    sync.Mutex
	lines []string
	marks int
}

func newMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	m := &monitor{rdb: goredis.NewClient(&goredis.Options{Addr: addr})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(conn)
		sc.Buffer(make([]byte, 64<<10), 16<<20) // a snapshot is one argument
		for sc.Scan() {
			m.mu.Lock()
			m.lines = append(m.lines, sc.Text())
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
		m.rdb.Close()
	})
	return m
}

// mark sends a marker through Redis and waits until MONITOR shows it: the
// commands after it are the ones run since.
func (m *monitor) mark(t *testing.T) string {
	t.Helper()
	m.marks++
	marker := fmt.Sprintf("retryindex-mark-%d-%d", time.Now().UnixNano(), m.marks)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := m.rdb.Echo(context.Background(), marker).Err(); err != nil {
			t.Fatal(err)
		}
		if m.index(marker) >= 0 {
			return marker
		}
		if time.Now().After(deadline) {
			t.Fatal("MONITOR does not show the marker")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// since returns the commands shown after marker, up to a new marker.
func (m *monitor) since(t *testing.T, marker string) []string {
	t.Helper()
	end := m.mark(t)
	m.mu.Lock()
	defer m.mu.Unlock()
	from, to := m.indexLocked(marker), m.indexLocked(end)
	return append([]string(nil), m.lines[from+1:to]...)
}

func (m *monitor) index(marker string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.indexLocked(marker)
}

func (m *monitor) indexLocked(marker string) int {
	for i, l := range m.lines {
		if strings.Contains(l, marker) {
			return i
		}
	}
	return -1
}
