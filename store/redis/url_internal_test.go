package redis

import (
	"runtime"
	"testing"
)

// TestWarmConnections: a partitioned layout keeps a connection per
// partition open, up to the pool's size, unless the URL says how many;
// the single layout keeps go-redis' default.
func TestWarmConnections(t *testing.T) {
	pool := 10 * runtime.GOMAXPROCS(0)
	for _, c := range []struct {
		url  string
		want int
	}{
		{"redis://127.0.0.1:6379/0", 0},
		{"redis://127.0.0.1:6379/0?partitions=1", 0},
		{"redis://127.0.0.1:6379/0?partitions=4", 4},
		{"redis://127.0.0.1:6379/0?partitions=1024", pool},
		{"redis://127.0.0.1:6379/0?partitions=1024&pool_size=50", 50},
		{"redis://127.0.0.1:6379/0?partitions=16&min_idle_conns=3", 3},
		{"redis://127.0.0.1:6379/0?partitions=16&min_idle_conns=0", 0},
		{"redis://127.0.0.1:6379?addr=127.0.0.1:6380", 16},
		{"redis://127.0.0.1:6379?addr=127.0.0.1:6380&partitions=2", 2},
		{"redis://127.0.0.1:26379/0?master_name=m&partitions=8", 8},
	} {
		tg, err := parseURL(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		var got int
		switch {
		case tg.standalone != nil:
			tg.warm(&tg.standalone.MinIdleConns, tg.standalone.PoolSize)
			got = tg.standalone.MinIdleConns
		case tg.cluster != nil:
			tg.warm(&tg.cluster.MinIdleConns, tg.cluster.PoolSize)
			got = tg.cluster.MinIdleConns
		default:
			tg.warm(&tg.sentinel.MinIdleConns, tg.sentinel.PoolSize)
			got = tg.sentinel.MinIdleConns
		}
		if got != c.want {
			t.Errorf("%s: %d connections kept open, want %d", c.url, got, c.want)
		}
	}
}
