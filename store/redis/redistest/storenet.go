package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
)

// StoreNet is a network for a Sentinel or a Cluster store URL whose paths
// to replicas can be cut one at a time. Sentinel hands every client the
// same master address, and a Cluster announces the same node addresses
// in CLUSTER SLOTS, so the fault cannot be told apart by the address a
// replica dials: it is told apart by where the replica runs. Every Redis
// process (the master and its Sentinel, or the Cluster's nodes) runs in a
// store namespace and listens on one service address that exists only
// there (10.248.X.254, on its loopback device), and announces that
// address; each replica (a retryd process, StartReplica) runs in a
// namespace of its own, with one veth pair to the store namespace (its
// store path, routing the service address) and one to the test's
// namespace (its client path, where it listens for gRPC). Cutting a
// replica's store path blackholes it from every Redis process and leaves
// the other replicas, and the test's own path to Redis, as they were. The
// namespaces and their veths are deleted at cleanup.
type StoreNet struct {
	// URL is the store URL of what runs in the store namespace, for
	// database 0.
	URL string
	// Service is the address every Redis process listens on.
	Service string
	ns      string
	name    string
	subnet  int
	// replicas are the replicas' namespaces and paths, by index.
	replicas []replicaNet
}

// replicaNet is one replica's namespace: store is its path to the store
// namespace (host is its end in the replica's namespace, inner the end in
// the store namespace), listen its address on its client path.
type replicaNet struct {
	ns     string
	store  netPath
	listen string
}

// adminPath is the index of the path between the test's namespace and the
// store namespace, past every replica's.
const adminPath = 60

// Ports of the Redis processes in the store namespace, which is theirs
// alone.
const (
	sentinelMasterPort = 6379
	sentinelPort       = 26379
	clusterFirstPort   = 7001
)

// startStoreNet builds the store namespace, its admin path and replicas
// replica namespaces. It skips the test when the process is not root or
// `ip netns` does not work here.
func startStoreNet(t testing.TB, replicas int) *StoreNet {
	t.Helper()
	retrydtest.EndToEnd(t, NetworkFaults)
	Skip(t)
	if os.Geteuid() != 0 {
		t.Skip("not root: building network namespaces needs root; skipping the network fault tests")
	}
	retrydtest.NeedProgram(t, "ip", "apt-get install -y iproute2")
	if replicas > adminPath {
		t.Fatalf("redistest: %d replicas, at most %d", replicas, adminPath)
	}
	n := netSeq.Add(1)
	// The test's namespace holds the admin path's end (10.248) and the
	// client paths' (10.247).
	subnet, release := claimSubnet(t, n, "10.248", "10.247")
	defer release()
	sn := &StoreNet{
		name:   fmt.Sprintf("%d-%d", os.Getpid()%100000, n%100),
		subnet: subnet,
	}
	sn.ns = "retrydtest-s" + sn.name
	sn.Service = fmt.Sprintf("10.248.%d.254", sn.subnet)
	if out, err := exec.Command("ip", "netns", "add", sn.ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add does not work here (%v: %s); skipping the network fault tests", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", sn.ns).Run() })
	ip(t, "-n", sn.ns, "link", "set", "lo", "up")
	ip(t, "-n", sn.ns, "addr", "add", sn.Service+"/32", "dev", "lo")

	// The admin path: the test's namespace reaches the service address
	// over it, to start, watch and read Redis.
	admin := sn.veth(t, "a", "", sn.ns, "10.248", adminPath)
	ip(t, "route", "add", sn.Service+"/32", "via", admin.addr)
	checkRoute(t, sn.Service, admin.host)

	for i := range replicas {
		r := replicaNet{ns: fmt.Sprintf("retrydtest-r%s-%d", sn.name, i)}
		if out, err := exec.Command("ip", "netns", "add", r.ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", r.ns, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "delete", r.ns).Run() })
		ip(t, "-n", r.ns, "link", "set", "lo", "up")
		r.store = sn.veth(t, fmt.Sprintf("s%d", i), r.ns, sn.ns, "10.248", i)
		ip(t, "-n", r.ns, "route", "add", sn.Service+"/32", "via", r.store.addr)
		client := sn.veth(t, fmt.Sprintf("c%d", i), "", r.ns, "10.247", i)
		checkRoute(t, client.addr, client.host)
		r.listen = client.addr
		sn.replicas = append(sn.replicas, r)
	}
	release()
	return sn
}

// veth makes path i of a /24 (prefix.subnet.0/24, a /30 per path): a veth
// pair whose host end is in namespace hostNS ("" is the test's own) with
// address .4i+1, and whose inner end is in innerNS with .4i+2 (the path's
// addr: the gateway to the store namespace, or the replica's address on
// its client path), both up. The pair is named for the StoreNet and tag; deleting either end deletes
// both, at cleanup or with a namespace.
func (sn *StoreNet) veth(t testing.TB, tag, hostNS, innerNS, prefix string, i int) netPath {
	t.Helper()
	p := netPath{
		host:  "rn" + sn.name + tag + "h",
		inner: "rn" + sn.name + tag + "i",
		addr:  fmt.Sprintf("%s.%d.%d", prefix, sn.subnet, 4*i+2),
	}
	hostAddr := fmt.Sprintf("%s.%d.%d/30", prefix, sn.subnet, 4*i+1)
	ip(t, "link", "add", p.host, "type", "veth", "peer", "name", p.inner)
	on := []string{}
	if hostNS == "" {
		t.Cleanup(func() { exec.Command("ip", "link", "delete", p.host).Run() })
	} else {
		ip(t, "link", "set", p.host, "netns", hostNS)
		on = []string{"-n", hostNS}
	}
	ip(t, "link", "set", p.inner, "netns", innerNS)
	ip(t, append(on, "addr", "add", hostAddr, "dev", p.host)...)
	ip(t, append(on, "link", "set", p.host, "up")...)
	ip(t, "-n", innerNS, "addr", "add", p.addr+"/30", "dev", p.inner)
	ip(t, "-n", innerNS, "link", "set", p.inner, "up")
	return p
}

// ip runs ip with args.
func ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// redis runs a redis-server (or Sentinel) with args on the service
// address and port, in the store namespace, stopped at cleanup.
func (sn *StoreNet) redis(t testing.TB, port int, args ...string) *Server {
	t.Helper()
	// Replicas connect from addresses that are not loopback ones.
	args = append(args, "--protected-mode", "no")
	p, err := runAt(sn.ns, sn.Service, port, args)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: net.JoinHostPort(sn.Service, strconv.Itoa(port)), host: sn.Service, port: port, args: args, proc: p}
	t.Cleanup(s.Stop)
	return s
}

// StartSentinelNet starts a StoreNet with replicas replica namespaces
// around a master and one Sentinel monitoring it, both on the service
// address; URL is the Sentinel URL. The Sentinel answers the master's
// address before it returns.
func StartSentinelNet(t testing.TB, replicas int) *StoreNet {
	t.Helper()
	sn := startStoreNet(t, replicas)
	sn.redis(t, sentinelMasterPort, "--save", "", "--appendonly", "no")
	dir := t.TempDir()
	file := filepath.Join(dir, "sentinel.conf")
	master := net.JoinHostPort(sn.Service, strconv.Itoa(sentinelMasterPort))
	conf := fmt.Sprintf("sentinel monitor mymaster %s %d 1\nsentinel announce-ip %s\n", sn.Service, sentinelMasterPort, sn.Service)
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	sentinel := sn.redis(t, sentinelPort, file, "--sentinel", "--dir", dir)
	deadline := time.Now().Add(waitTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := masterAddr(ctx, sentinel.Addr, "mymaster")
		cancel()
		if err == nil && got == master {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: the Sentinel reports master %q (%v), want %s", got, err, master)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sn.URL = "redis://" + sentinel.Addr + "/0?master_name=mymaster"
	return sn
}

// StartClusterNet starts a StoreNet with replicas replica namespaces
// around a Redis Cluster of three masters, each announcing the service
// address with a port of its own; URL is the Cluster URL seeded by every
// node. Every node reports cluster_state:ok before it returns.
func StartClusterNet(t testing.TB, replicas int) *StoreNet {
	t.Helper()
	skipCluster(t)
	sn := startStoreNet(t, replicas)
	dir := t.TempDir()
	c := &Cluster{masters: 3}
	create := []string{"--cluster", "create"}
	for i := range c.masters {
		port := clusterFirstPort + i
		node := sn.redis(t, port, "--save", "", "--appendonly", "no", "--dir", dir,
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", i)),
			"--cluster-announce-ip", sn.Service)
		c.Nodes = append(c.Nodes, node)
		create = append(create, node.Addr)
	}
	if out, err := exec.Command("redis-cli", append(create, "--cluster-yes")...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitOK(); err != nil {
		t.Fatal(err)
	}
	sn.URL = c.URL()
	return sn
}

// Namespace is replica i's network namespace, to run retryd in
// (retrydtest.StartInNetns).
func (sn *StoreNet) Namespace(i int) string { return sn.replicas[i].ns }

// Listen is the address replica i listens on to be reached from the
// test's namespace over its client path (host:0, any port).
func (sn *StoreNet) Listen(i int) string { return sn.replicas[i].listen + ":0" }

// Cut makes replica i's store path drop every packet silently: its end in
// the store namespace goes down, so what the replica sends to any Redis
// process is discarded by the veth and nothing answers, neither a reply
// nor a reset nor an ICMP error. Connections already open stall, as on a
// partitioned network; the replica's client path stays up.
func (sn *StoreNet) Cut(t testing.TB, i int) {
	t.Helper()
	ip(t, "-n", sn.ns, "link", "set", sn.replicas[i].store.inner, "down")
}

// Heal brings replica i's store path back.
func (sn *StoreNet) Heal(t testing.TB, i int) {
	t.Helper()
	ip(t, "-n", sn.ns, "link", "set", sn.replicas[i].store.inner, "up")
}

// Delay holds every packet of replica i's store path, each way, for
// delay ± jitter (see NetServer.Delay), until the test ends or Undelay.
func (sn *StoreNet) Delay(t testing.TB, i int, delay, jitter time.Duration) {
	t.Helper()
	delayPath(t, sn.ns, &sn.replicas[i].store, i, delay, jitter)
}

// Undelay lets replica i's store path through at once again.
func (sn *StoreNet) Undelay(t testing.TB, i int) {
	t.Helper()
	undelayPath(t, &sn.replicas[i].store)
}

// Lose drops each packet of replica i's store path, each way, with
// probability p (see NetServer.Lose; 0 stops the loss).
func (sn *StoreNet) Lose(t testing.TB, i int, p float64) {
	t.Helper()
	losePath(t, sn.ns, &sn.replicas[i].store, p)
}
