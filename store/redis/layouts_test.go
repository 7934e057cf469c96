package redis_test

import (
	"testing"

	"github.com/retryd/retryd/store/redis/redistest"
)

// layouts are the stores the tests of several retryd replicas run on:
// each key layout over a redis-server of the test's own, and a Redis
// Cluster of three masters of its own (the partitioned layout, 16
// partitions). gapless is whether the event log's sequences count 1, 2, …
// across the whole store (the single layout).
var layouts = []struct {
	name    string
	url     func(t *testing.T) string
	gapless bool
}{
	{"single", func(t *testing.T) string { return redistest.Start(t).URL(0) }, true},
	{"partitioned", func(t *testing.T) string { return redistest.Start(t).URL(0) + "?partitions=4" }, false},
	{"cluster", func(t *testing.T) string { return redistest.StartCluster(t, redistest.ClusterOptions{}).URL() }, false},
}

// eachLayout runs fn in parallel subtests, once per layout.
func eachLayout(t *testing.T, fn func(t *testing.T, url string, gapless bool)) {
	t.Helper()
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			fn(t, l.url(t), l.gapless)
		})
	}
}
