package redis_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/retryd/retryd/store"

	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
)

// TestClusterFailover: two retryd binaries over a Redis Cluster of three
// masters, each with a replica (appendfsync always, checked on every
// connection). After a load, one more retry is scheduled; once the
// replicas have everything, the master holding that retry's session is
// killed with SIGKILL and an agent awaits the retry during the outage.
// Another Redis, not a Cluster node, takes the dead master's address at
// once (an address handed out again): retryd's slot maps name that
// address until the failover, and retryd must refuse it rather than
// write the Cluster's decisions into it or read its absence of them. The
// replica takes over the master's slots; then both binaries serve, the
// awaiter receives the retry's one Started, a second load runs, every
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
			master.Impostor(t)
		},
		promoted: func() string {
			cluster.WaitFailover(t)
			return "a replica took over the killed master's slots (a standalone Redis on its address meanwhile)"
		},
		describe: func() string { return cluster.Describe("across") },
	})
}

// TestClusterURL: the address of any one node is a Cluster URL (retryd
// asks it), with the partitioned layout of 16 partitions unless the URL
// names a number; a Cluster has database 0 only; a URL with addr= whose
// nodes are not a Cluster says what it took the URL for.
func TestClusterURL(t *testing.T) {
	t.Parallel()
	cluster := redistest.SharedCluster(t)
	ctx := context.Background()
	for url, want := range map[string]int{
		"redis://" + cluster.Nodes[1].Addr:                     redis.DefaultClusterPartitions,
		"redis://" + cluster.Nodes[2].Addr + "/0?partitions=3": 3,
	} {
		s := open(t, url, redistest.Prefix())
		if got := s.Partitions(); got != want {
			t.Errorf("%s: %d partitions, want %d", url, got, want)
		}
		if out, err := store.New(s).FailedStep(ctx, failure("over-"+strconv.Itoa(want))); err != nil || out.Scheduled == nil {
			t.Errorf("%s: FailedStep: %v %v", url, out, err)
		}
	}
	_, err := redis.Open(ctx, redis.Config{URL: "redis://" + cluster.Nodes[0].Addr + "/3", KeyPrefix: redistest.Prefix()})
	if err == nil || !strings.Contains(err.Error(), "database 0 only") {
		t.Errorf("a Cluster node with database 3: %v, want a refusal naming database 0", err)
	}
	plain := redistest.Shared(t)
	_, err = redis.Open(ctx, redis.Config{URL: "redis://" + plain.Addr + "?addr=" + plain.Addr, KeyPrefix: redistest.Prefix()})
	if err == nil || !strings.Contains(err.Error(), "not a Cluster node") {
		t.Errorf("addr= over a standalone Redis: %v, want a refusal saying it is not a Cluster node", err)
	}
}
