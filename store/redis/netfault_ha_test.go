package redis_test

import (
	"testing"

	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
)

// startInStoreNet runs the retryd binary as replica i of sn, in its
// namespace, with a health port; both ports are on its client path.
func startInStoreNet(t *testing.T, sn *redistest.StoreNet, i int) *retrydtest.Server {
	t.Helper()
	return retrydtest.StartInNetns(t, sn.Namespace(i), "--store", sn.URL+"&unavailable_after="+netBound.String(),
		"--listen", sn.Listen(i), "--health-listen", sn.Listen(i))
}

// TestBlackholedSentinel is TestBlackholedReplica over a Sentinel URL:
// the master and its Sentinel listen on one address, the one the
// Sentinel hands out, and one replica's every packet to either is dropped
// (its namespace's path to theirs goes down), while the other replica and
// the Sentinel keep the master.
func TestBlackholedSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts a path to Redis for seconds")
	}
	sn := redistest.StartSentinelNet(t, 2)
	cut, healthy := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveBlackholed(t, cut, healthy, func() { sn.Cut(t, 0) }, func() { sn.Heal(t, 0) })
}

// TestBlackholedCluster is TestBlackholedReplica over a Cluster URL: the
// three masters announce one address (with a port each) in CLUSTER SLOTS,
// and one replica's every packet to any of them is dropped.
func TestBlackholedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts a path to Redis for seconds")
	}
	sn := redistest.StartClusterNet(t, 2)
	cut, healthy := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveBlackholed(t, cut, healthy, func() { sn.Cut(t, 0) }, func() { sn.Heal(t, 0) })
}

// TestFlappingSentinel is TestFlappingPath over a Sentinel URL: one
// replica's path to the master and its Sentinel flaps.
func TestFlappingSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: flaps a path to Redis for seconds")
	}
	sn := redistest.StartSentinelNet(t, 2)
	flapping, steady := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveFlapping(t, flapping, steady, func() { sn.Cut(t, 0) }, func() { sn.Heal(t, 0) })
}

// TestFlappingCluster is TestFlappingPath over a Cluster URL: one
// replica's path to every node flaps.
func TestFlappingCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: flaps a path to Redis for seconds")
	}
	sn := redistest.StartClusterNet(t, 2)
	flapping, steady := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveFlapping(t, flapping, steady, func() { sn.Cut(t, 0) }, func() { sn.Heal(t, 0) })
}

// TestBlackholedSentinelAwaiters is TestBlackholedAwaiters over a
// Sentinel URL.
func TestBlackholedSentinelAwaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts a path to Redis for seconds")
	}
	sn := redistest.StartSentinelNet(t, 2)
	cut, healthy := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveBlackholedAwaiters(t, cut, healthy, func() { sn.Cut(t, 0) }, func() { sn.Heal(t, 0) })
}

// TestBlackholedClusterAwaiters is TestBlackholedAwaiters over a Cluster
// URL.
func TestBlackholedClusterAwaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts a path to Redis for seconds")
	}
	sn := redistest.StartClusterNet(t, 2)
	cut, healthy := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveBlackholedAwaiters(t, cut, healthy, func() { sn.Cut(t, 0) }, func() { sn.Heal(t, 0) })
}

// TestLatencyAndLossSentinel is TestLatencyAndLoss over a Sentinel URL:
// one replica's path to the master and its Sentinel is slow and lossy.
func TestLatencyAndLossSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs a load over a slow, lossy path")
	}
	sn := redistest.StartSentinelNet(t, 2)
	slow, clean := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveLatencyAndLoss(t, slow, clean, sn)
}

// TestLatencyAndLossCluster is TestLatencyAndLoss over a Cluster URL: one
// replica's path to every node is slow and lossy.
func TestLatencyAndLossCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs a load over a slow, lossy path")
	}
	sn := redistest.StartClusterNet(t, 2)
	slow, clean := startInStoreNet(t, sn, 0), startInStoreNet(t, sn, 1)
	proveLatencyAndLoss(t, slow, clean, sn)
}
