package redis_test

import (
	"context"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestExpiry runs two replicas with a 1 s chain TTL. A session idle for
// the TTL is forgotten as in the memory store: its open chain is logged
// closed (reason expired) exactly once although both replicas handle
// timers, then the session and its retries answer NOT_FOUND on every
// replica. A session with a pending retry is kept past the TTL until the
// retry is abandoned, and expires after that.
func TestExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits for sessions to expire")
	}
	t.Parallel()
	srv := redistest.Start(t)
	args := []string{"--store", srv.URL(0), "--chain-ttl", "1s", "--abandon-grace", "1s"}
	a, b := retrydtest.Start(t, args...), retrydtest.Start(t, args...)
	ca, cb := retrydv1.NewRetryServiceClient(a.Conn(t)), retrydv1.NewRetryServiceClient(b.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// An open chain: its retry started, nothing succeeded since.
	open := scheduleFixed(ctx, t, ca, "open", 10)
	if term, err := terminal(awaitStream(ctx, t, cb, open)); err != nil || term.GetStarted() == nil {
		t.Fatalf("await %s: %v %v", open, term, err)
	}
	// A pending retry due after the TTL, which nobody awaits.
	pending := scheduleFixed(ctx, t, ca, "pending", 2_500)

	expired := waitEvent(ctx, t, a, "open", func(ev *retrydv1.Event) bool {
		return ev.GetClosed().GetReason() == retrydv1.CloseReason_CLOSE_REASON_EXPIRED
	})
	if c := expired.GetClosed(); c.GetProvider() != "p" || c.GetRetries() != 1 {
		t.Errorf("expired chain: %v, want provider p with 1 retry", c)
	}
	for _, c := range []retrydv1.RetryServiceClient{ca, cb} {
		if _, err := c.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "open"}); status.Code(err) != codes.NotFound {
			t.Errorf("GetChains of the expired session: %v, want NOT_FOUND", err)
		}
		_, err := c.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: open}})
		if status.Code(err) != codes.NotFound {
			t.Errorf("CancelRetries of the expired session's retry: %v, want NOT_FOUND", err)
		}
	}
	// Past the TTL, the session with the pending retry is still there.
	chains, err := cb.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "pending"})
	if err != nil || chains.GetChains()[0].GetLatest().GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
		t.Fatalf("GetChains of the session with a pending retry, past the TTL: %v %v", chains, err)
	}
	waitEvent(ctx, t, a, "pending", func(ev *retrydv1.Event) bool {
		return ev.GetCancelled().GetReason() == retrydv1.CancelReason_CANCEL_REASON_ABANDONED
	})
	for {
		_, err := cb.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "pending"})
		if status.Code(err) == codes.NotFound {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the session of the abandoned retry %s did not expire: %v", pending, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	n := 0
	for _, ev := range retrydtest.Verify(t, b.Conn(t)) {
		if ev.GetClosed().GetReason() == retrydv1.CloseReason_CLOSE_REASON_EXPIRED {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d closed (expired) events, want 1: the open chain, once", n)
	}
}

// waitEvent waits until the session's log on srv holds an event that
// matches, and returns it.
func waitEvent(ctx context.Context, t *testing.T, srv *retrydtest.Server, session string, match func(*retrydv1.Event) bool) *retrydv1.Event {
	t.Helper()
	conn := srv.Conn(t)
	for {
		events, err := retrydtest.Events(ctx, conn, session)
		if err != nil {
			t.Fatalf("events of %s: %v", session, err)
		}
		for _, ev := range events {
			if match(ev) {
				return ev
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no matching event of %s in %v", session, events)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
