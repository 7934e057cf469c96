package redis_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestStrandedAwaiter: a replica killed with SIGKILL while it holds an
// awaiter leaves no awaiter behind. Its awaiter's entry stops counting
// when its lease ends, so a retry nobody awaits any more is cancelled as
// abandoned after the grace instead of starting with nobody listening
// (which a plain awaiter count, never decremented by the dead replica,
// did). An awaiter on a live replica, waiting longer than a lease, keeps
// its retry's start.
func TestStrandedAwaiter(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits past an awaiter lease")
	}
	t.Parallel()
	srv := redistest.Start(t)
	a := retrydtest.Start(t, "--store", srv.URL(0), "--abandon-grace", "1s")
	b := retrydtest.Start(t, "--store", srv.URL(0), "--abandon-grace", "1s")
	ca, cb := retrydv1.NewRetryServiceClient(a.Conn(t)), retrydv1.NewRetryServiceClient(b.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Due well after the dead replica's lease (6 s) ends.
	const delayMs = 10_000
	stranded, held := scheduleFixed(ctx, t, ca, "stranded", delayMs), scheduleFixed(ctx, t, ca, "held", delayMs)

	// B holds the awaiter of the stranded retry (its stream stays open
	// until the test ends), then dies with it.
	awaitStream(ctx, t, cb, stranded)
	if err := b.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b.Wait(10 * time.Second)
	// A holds the awaiter of the other one, alive, through the whole wait.
	heldStream := awaitStream(ctx, t, ca, held)

	term, err := terminal(heldStream)
	if err != nil || term.GetStarted() == nil {
		t.Fatalf("awaiter of %s on a live replica: %v %v, want Started", held, term, err)
	}
	var outcome *retrydv1.Event
	for outcome == nil {
		events, err := retrydtest.Events(ctx, a.Conn(t), "stranded")
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events {
			if ev.GetStarted() != nil || ev.GetCancelled() != nil {
				outcome = ev
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the stranded retry neither started nor was cancelled")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if outcome.GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_ABANDONED {
		t.Errorf("the retry whose only awaiter died with its replica: %v, want cancelled (abandoned)", outcome)
	}
	retrydtest.Verify(t, a.Conn(t))
}
