package redis

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/store"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store/redis/redistest"
	"github.com/retryd/retryd/store/storetest"
)

// TestRetryIDNamesSession: a retry of a session whose id fits in a retry
// id is named after it and has no retry index key; CancelRetries and
// AwaitRetry find it by its id alone, in every layout, and an id that
// names a session without that retry is NOT_FOUND (the caller's scope is
// the service's to check: service's tenancy tests).
func TestRetryIDNamesSession(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	for _, query := range []string{"", "?partitions=4"} {
		t.Run("layout"+query, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			prefix := redistest.Prefix()
			rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
			defer rdb.Close()
			s := openReplica(t, srv.URL(0)+query, prefix, newFakeClock(), &atomic.Int64{}, false)
			pol := fixedPolicy(t, time.Hour, 3)
			ids := map[string]string{}
			for _, session := range []string{"s", "agent-7_run-2"} {
				out, err := store.New(s).FailedStep(ctx, failureOf(pol, session, 1, 1))
				if err != nil {
					t.Fatal(err)
				}
				id := out.Scheduled.ID
				if named, ok := retrySession(id); !ok || named != session {
					t.Fatalf("retry id %q of session %q names %q, %v", id, session, named, ok)
				}
				ids[session] = id
			}
			keys, err := rdb.Keys(ctx, prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if strings.Contains(k, ":r:") {
					t.Errorf("a retry index key of retries named after their sessions: %s", k)
				}
			}

			// The retry is found by its id alone.
			sessionID, err := s.Locate(ctx, ids["s"])
			if err != nil || sessionID != "s" {
				t.Fatalf("Locate(%s): %q (%v), want session s", ids["s"], sessionID, err)
			}
			view, err := s.Await(sessionID, ids["s"]).Look(ctx)
			if err != nil || view.State.GetRetryId() != ids["s"] || view.State.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
				t.Fatalf("AwaitRetry's look-up of %s: %v (%v), want the pending retry", ids["s"], view.State, err)
			}
			for _, id := range []string{
				"R99_s",                    // a session without that retry
				"R1_nobody",                // no such session
				ids["s"][:len(ids["s"])-2], // a prefix of a real id
				ids["agent-7_run-2"] + "x", // a session that does not exist
			} {
				_, err := storetest.CancelRetry(ctx, s, id)
				var ee *engine.Error
				if !errors.As(err, &ee) || ee.Kind != engine.KindNotFound {
					t.Errorf("CancelRetry(%q): %v, want not found", id, err)
				}
			}
			resp, err := storetest.CancelRetry(ctx, s, ids["agent-7_run-2"])
			if err != nil || len(resp.GetRetries()) != 1 || resp.GetRetries()[0].GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_CANCELLED {
				t.Fatalf("CancelRetry(%s): %v (%v), want it cancelled", ids["agent-7_run-2"], resp, err)
			}
		})
	}
}
