package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestOutageAnswersUnavailable: while redis-server is dead, under load,
// every FailedStep fails ErrUnavailable (UNAVAILABLE at the edge) within
// the URL's unavailable_after, well before an agent's deadline, and
// records nothing; every decision acknowledged before the crash is still
// there once Redis is back (appendfsync always), and calls succeed again.
func TestOutageAnswersUnavailable(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: keeps Redis away for seconds under load")
	}
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{AppendOnly: true, AppendFsync: "always"})
	const bound = 500 * time.Millisecond
	// An agent's deadline that the go-redis defaults (a 5 s dial, a 3 s
	// read, three retries) overrun and the bound leaves room in.
	const agentDeadline = 2 * time.Second
	s := open(t, srv.URL(0)+"?appendfsync=always&unavailable_after="+bound.String(), "")

	type answer struct {
		session    string
		err        error
		took       time.Duration
		start, end time.Time
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	done := make(chan struct{})
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				session := fmt.Sprintf("w%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), agentDeadline)
				start := time.Now()
				_, err := store.New(s).FailedStep(ctx, failure(session))
				end := time.Now()
				cancel()
				mu.Lock()
				answers = append(answers, answer{session, err, end.Sub(start), start, end})
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	time.Sleep(time.Second)
	if err := srv.Kill(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	time.Sleep(4 * time.Second)
	restarting := time.Now()
	srv.Restart(t)
	time.Sleep(2 * time.Second)
	close(done)
	wg.Wait()

	ctx := context.Background()
	var away, acked, lost, recorded int
	var slowest time.Duration
	for _, a := range answers {
		switch {
		case a.start.After(killed) && a.end.Before(restarting):
			away++
			slowest = max(slowest, a.took)
			if !errors.Is(a.err, store.ErrUnavailable) {
				t.Errorf("%s while Redis was away: %v after %v, want ErrUnavailable", a.session, a.err, a.took)
			}
			if chainsOf(t, s, a.session) > 0 {
				recorded++
			}
		case a.err == nil:
			acked++
			if chainsOf(t, s, a.session) == 0 {
				lost++
			}
		}
	}
	t.Logf("%d calls while Redis was away, slowest answer %v (bound %v); %d acknowledged in all", away, slowest, bound, acked)
	if away == 0 {
		t.Fatal("no call made while Redis was away was answered before it came back: calls are held instead of failing")
	}
	if recorded > 0 {
		t.Errorf("%d calls that failed while Redis was away left a chain", recorded)
	}
	if lost > 0 {
		t.Errorf("%d acknowledged decisions were lost", lost)
	}
	if _, err := store.New(s).FailedStep(ctx, failure("after")); err != nil {
		t.Errorf("FailedStep once Redis is back: %v", err)
	}
}

// chainsOf counts a session's chains; a session the store does not have
// has none.
func chainsOf(t *testing.T, s *redis.Store, session string) int {
	t.Helper()
	chains, err := store.New(s).GetChains(context.Background(), session)
	if ee := (*engine.Error)(nil); errors.As(err, &ee) && ee.Kind == engine.KindNotFound {
		return 0
	}
	if err != nil {
		t.Fatalf("GetChains %s: %v", session, err)
	}
	return len(chains.GetChains())
}

// TestUnansweredCommitIsNotSentLate: a call answered UNAVAILABLE while
// Redis refuses connections is not recorded when Redis comes back right
// after the answer. The group commit outlives its callers' bound only to
// read the answer to a request already sent; a dial, go-redis' retries of
// it and anything else not yet on the wire end at that bound.
func TestUnansweredCommitIsNotSentLate(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: restarts Redis and waits out go-redis' dial retries")
	}
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{AppendOnly: true, AppendFsync: "always"})
	const bound = 300 * time.Millisecond
	s := open(t, srv.URL(0)+"?appendfsync=always&unavailable_after="+bound.String(), "")
	ctx := context.Background()
	var away []string
	for round := range 3 {
		// A decision first, so the pool holds connections the kill breaks.
		if _, err := store.New(s).FailedStep(ctx, failure(fmt.Sprintf("up-%d", round))); err != nil {
			t.Fatalf("FailedStep while Redis is up: %v", err)
		}
		if err := srv.Kill(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		session := fmt.Sprintf("away-%d", round)
		start := time.Now()
		_, err := store.New(s).FailedStep(ctx, failure(session))
		took := time.Since(start)
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("FailedStep while Redis is away: %v after %v, want ErrUnavailable", err, took)
		}
		if took > 2*bound {
			t.Errorf("FailedStep while Redis is away answered after %v, bound %v", took, bound)
		}
		away = append(away, session)
		srv.Restart(t)
	}
	// go-redis retries a refused dial, and retries the command that needed
	// it, for longer than this (see TestOutageAnswersUnavailable's
	// agentDeadline); a commit that went on doing so would be recorded by
	// now.
	time.Sleep(3 * time.Second)
	for _, session := range away {
		if n := chainsOf(t, s, session); n > 0 {
			t.Errorf("%s, answered UNAVAILABLE while Redis was away, has %d chains once Redis is back", session, n)
		}
	}
	if _, err := store.New(s).FailedStep(ctx, failure("after")); err != nil {
		t.Errorf("FailedStep once Redis is back: %v", err)
	}
}
