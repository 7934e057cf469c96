package redis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestPostponeOnlyDamagedData: a timer whose handling failed because Redis
// was away or slow (UNAVAILABLE, a deadline, a cancelled context) stays
// due, so the next poll fires it; only a session whose data does not
// decode moves its timer a minute on.
func TestPostponeOnlyDamagedData(t *testing.T) {
	t.Parallel()
	url, prefix := redistest.Shared(t).URL(0), redistest.Prefix()
	clock := newFakeClock()
	s := openReplica(t, url, prefix, clock, &atomic.Int64{}, false)
	ctx := context.Background()
	pol := fixedPolicy(t, time.Second, 3)
	tests := []struct {
		name     string
		err      error
		deferred bool
	}{
		{"unavailable", fmt.Errorf("redis store: committing: %w", store.ErrUnavailable), false},
		{"commit deadline", fmt.Errorf("committing: %w", context.DeadlineExceeded), false},
		{"cancelled", context.Canceled, false},
		{"a lost race", errors.New("redis store: 64 transactions lost to concurrent writers"), false},
		{"damaged", damaged{errors.New("redis store: session \"x\" is damaged: proto: cannot parse")}, true},
		{"damaged, wrapped", fmt.Errorf("firing: %w", damaged{errors.New("bad snapshot")}), true},
	}
	for i, tt := range tests {
		session := fmt.Sprintf("timer-%d", i)
		o, err := store.New(s).FailedStep(ctx, failureOf(pol, session, 1, 1))
		if err != nil || o.Scheduled == nil {
			t.Fatalf("%s: FailedStep: %v", tt.name, err)
		}
		member := timerMember(session)
		key := s.keys.timersKey(s.keys.partition(session))
		before, err := s.rdb.ZScore(ctx, key, member).Result()
		if err != nil {
			t.Fatalf("%s: the timer: %v", tt.name, err)
		}
		s.postpone(ctx, s.keys.partition(session), member, session, tt.err)
		after, err := s.rdb.ZScore(ctx, key, member).Result()
		if err != nil {
			t.Fatalf("%s: the timer after postpone: %v", tt.name, err)
		}
		// Postponed: a minute from now (the session's timer was at its
		// retry's abandon time); otherwise where it was.
		postponed := float64(clock.now().Add(damagedRetry).UnixMilli())
		if deferred := after != before && after == postponed; deferred != tt.deferred || !deferred && after != before {
			t.Errorf("%s: the timer moved from %v to %v; want postponed (to %v) %v", tt.name, before, after, postponed, tt.deferred)
		}
	}
}
