package policy

import (
	"errors"
	"sync"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
)

func TestCacheSharesResolvedPolicies(t *testing.T) {
	t.Parallel()
	c := NewCache(2)
	for _, tc := range []struct {
		name   string
		policy *retrydv1.RetryPolicy
	}{
		{"default", nil},
		{"schedule", pSchedule},
	} {
		want, err := Resolve(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		first, err := c.Resolve(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		// Another message with the same content is the same policy.
		again, err := c.Resolve(proto.Clone(tc.policy).(*retrydv1.RetryPolicy))
		if err != nil {
			t.Fatal(err)
		}
		if first != again {
			t.Errorf("%s: two resolutions of one encoding are different Policies", tc.name)
		}
		if first.Key != want.Key || !proto.Equal(first.SharedProto(), want.SharedProto()) {
			t.Errorf("%s: cached %q, Resolve %q", tc.name, first.Key, want.Key)
		}
	}
	if n := c.Len(); n != 2 {
		t.Errorf("Len %d, want 2", n)
	}
	// Full: a new policy is still resolved, just not remembered.
	p, err := c.Resolve(pAlways)
	if err != nil || p.Mode != retrydv1.Mode_MODE_ALWAYS {
		t.Fatalf("resolve with a full cache: %v, %v", p, err)
	}
	if n := c.Len(); n != 2 {
		t.Errorf("Len %d after a miss on a full cache, want 2", n)
	}
}

func TestCacheRefusesInvalidPolicies(t *testing.T) {
	t.Parallel()
	c := NewCache(0)
	bad := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS, MaxRetries: proto.Uint32(3)}
	for range 2 {
		_, err := c.Resolve(bad)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Violations[0].Field != "max_retries" {
			t.Fatalf("invalid policy: %v, want the max_retries violation", err)
		}
	}
	if n := c.Len(); n != 0 {
		t.Errorf("an invalid policy was cached (%d entries)", n)
	}
}

func TestCacheConcurrent(t *testing.T) {
	t.Parallel()
	c := NewCache(0)
	policies := []*retrydv1.RetryPolicy{nil, pNormal, pSchedule, pAlways}
	got := make([][]*Policy, 8)
	var wg sync.WaitGroup
	for g := range got {
		wg.Go(func() {
			for range 50 {
				for _, p := range policies {
					r, err := c.Resolve(p)
					if err != nil {
						t.Error(err)
						return
					}
					got[g] = append(got[g], r)
				}
			}
		})
	}
	wg.Wait()
	for g := range got {
		for i, r := range got[g] {
			if r != got[0][i%len(policies)] {
				t.Fatalf("goroutine %d call %d: a second Policy for one encoding", g, i)
			}
		}
	}
}

func TestCacheHitDoesNotAllocate(t *testing.T) {
	c := NewCache(0)
	if _, err := c.Resolve(pSchedule); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = c.Resolve(pSchedule) }); n != 0 {
		t.Errorf("a cache hit allocates %v times, want 0", n)
	}
}

func BenchmarkCacheResolve(b *testing.B) {
	c := NewCache(0)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = c.Resolve(pSchedule)
	}
}
