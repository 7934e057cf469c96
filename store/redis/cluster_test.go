package redis_test

import (
	"syscall"
	"testing"

	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestClusterFailover: two retryd binaries over a Redis Cluster of three
// masters, each with a replica (appendfsync always, checked on every
// connection). After a load, one more retry is scheduled; once the
// replicas have everything, the master holding that retry's session is
// killed with SIGKILL and an agent awaits the retry during the outage.
// The replica takes over the master's slots; then both binaries serve,
// the awaiter receives the retry's one Started, a second load runs, every
// decision, Started and Cancelled the first load's agents were told of is
// there, and the invariant checker passes.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a Cluster failover under two retryd processes")
	}
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1, AppendFsync: "always"})
	url := cluster.URL() + "&appendfsync=always"
	a := retrydtest.Start(t, "--store", url, "--health-listen", "127.0.0.1:0")
	b := retrydtest.Start(t, "--store", url)
	proveRedisFailover(t, a, b, redisFailover{
		kill: func() {
			cluster.Replicated(t)
			master := cluster.Holding(t, "*:s:across")
			if err := master.Kill(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
		promoted: func() string {
			cluster.WaitFailover(t)
			return "a replica took over the killed master's slots"
		},
	})
}
