package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/internal/loopback"
	"github.com/retryd/retryd/internal/retrydtest"
)

// Cluster is a Redis Cluster of redis-server processes on loopback,
// started by StartCluster or SharedCluster.
type Cluster struct {
	// Nodes are the cluster's servers: the first Masters are its masters
	// at the start, each following its replicas (redis-cli's order).
	Nodes []*Server
	// masters is how many masters share the slots.
	masters int
	// dir holds each node's append-only files (appendonly-I) and log
	// (node-I.log), I its index in Nodes.
	dir string
}

// ClusterOptions configure StartCluster. Zero fields take the defaults.
type ClusterOptions struct {
	// Masters is how many masters share the 16384 slots. Default 3, the
	// least Redis Cluster accepts.
	Masters int
	// Replicas is how many replicas each master has. Default 0.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a master may not
	// answer before its replica takes over. Default 2s.
	NodeTimeout time.Duration
	// AppendFsync, when set, turns every node's append-only file on with
	// that fsync policy.
	AppendFsync string
}

// URL returns the Cluster store URL that seeds from every node.
func (c *Cluster) URL() string {
	u := "redis://" + c.Nodes[0].Addr
	for i, n := range c.Nodes[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + n.Addr
	}
	return u
}

// Client returns a Cluster client of the test's own, closed at cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// StartCluster starts a Redis Cluster of the test's own, stopped at
// cleanup, and returns once every node reports cluster_state:ok.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	skipCluster(t)
	c, err := startCluster(t.TempDir(), opts)
	if c != nil {
		t.Cleanup(c.stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var (
	sharedClusterOnce sync.Once
	sharedCluster     *Cluster
	sharedClusterErr  error
)

// SharedCluster returns one three-master Redis Cluster for the whole test
// process, started at the first call; it stops when the process ends.
// Give each test its own key prefix (Prefix).
func SharedCluster(t testing.TB) *Cluster {
	t.Helper()
	skipCluster(t)
	sharedClusterOnce.Do(func() {
		dir, err := os.MkdirTemp("", "retryd-redistest-cluster-")
		if err != nil {
			sharedClusterErr = err
			return
		}
		sharedCluster, sharedClusterErr = startCluster(dir, ClusterOptions{})
	})
	if sharedClusterErr != nil {
		t.Fatal(sharedClusterErr)
	}
	return sharedCluster
}

// skipCluster skips the test without redis-server or redis-cli (which
// creates the Cluster).
func skipCluster(t testing.TB) {
	t.Helper()
	Skip(t)
	retrydtest.NeedProgram(t, "redis-cli", "apt-get install -y redis-tools")
}

func (c *Cluster) stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

func startCluster(dir string, opts ClusterOptions) (*Cluster, error) {
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = 2 * time.Second
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, fmt.Errorf("redistest: a Cluster needs redis-cli (apt-get install -y redis-tools): %w", err)
	}
	c := &Cluster{masters: opts.Masters, dir: dir}
	n := opts.Masters * (1 + opts.Replicas)
	for i := range n {
		node, err := startNode(dir, i, opts)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
	}
	args := []string{"--cluster", "create"}
	for _, node := range c.Nodes {
		args = append(args, node.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(opts.Replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		c.stop()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitOK(); err != nil {
		c.stop()
		return nil, err
	}
	if err := c.waitReplicas(opts.Masters * opts.Replicas); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// waitReplicas waits until n nodes are replicas whose first full sync is
// done (master_link_status:up), as StartWith does for a standalone
// replica: a Cluster handed to a test has replicas that hold what their
// masters hold, so a failover test does not kill a master while its
// replica is still loading the first copy of its data.
func (c *Cluster) waitReplicas(n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for {
		synced := 0
		var last string
		for _, node := range c.Nodes {
			rc := redis.NewClient(&redis.Options{Addr: node.Addr})
			info, err := rc.Info(ctx, "replication").Result()
			rc.Close()
			if err == nil && strings.Contains(info, "role:slave") {
				if strings.Contains(info, "master_link_status:up") {
					synced++
				} else {
					last = node.Addr + ": " + info
				}
			}
		}
		if synced >= n {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("redistest: %d of %d Cluster replicas synced; %s", synced, n, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startNode starts node i of a cluster, with its cluster bus on a free
// port of its own (not the default port+10000, which may be taken).
func startNode(dir string, i int, opts ClusterOptions) (*Server, error) {
	return startEach(func(host string) ([]string, error) { return nodeArgs(dir, host, i, opts) })
}

// nodeArgs are the arguments of node i on host, with a bus port picked
// afresh.
func nodeArgs(dir, host string, i int, opts ClusterOptions) ([]string, error) {
	bus, err := loopback.FreePortOn(host)
	if err != nil {
		return nil, err
	}
	args := []string{"--save", "", "--dir", dir,
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", i)),
		"--cluster-node-timeout", strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
		"--cluster-port", strconv.Itoa(bus),
		"--appendfilename", fmt.Sprintf("appendonly-%d.aof", i),
		"--appenddirname", fmt.Sprintf("appendonly-%d", i),
		"--logfile", filepath.Join(dir, fmt.Sprintf("node-%d.log", i)),
		// A replica's first full sync starts at once, not after Redis'
		// default wait of 5 s for more replicas (see waitReplicas).
		"--repl-diskless-sync-delay", "0",
	}
	if opts.AppendFsync != "" {
		args = append(args, "--appendonly", "yes", "--appendfsync", opts.AppendFsync)
	} else {
		args = append(args, "--appendonly", "no")
	}
	return args, nil
}

// waitOK waits until every running node reports cluster_state:ok and
// knows every slot.
func (c *Cluster) waitOK() error {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, node := range c.Nodes {
		if !node.running() {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: node.Addr})
		for {
			info, err := rc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if ctx.Err() != nil {
				rc.Close()
				return fmt.Errorf("redistest: Redis Cluster node %s is not ok: %v %q", node.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	return nil
}

// WaitFailover waits until a replica has taken over from a master that was
// killed: as many running masters as at the start, and every running node
// reports cluster_state:ok.
func (c *Cluster) WaitFailover(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for len(c.Masters(t)) < c.masters {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no replica took over: %d masters of %d", len(c.Masters(t)), c.masters)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.waitOK(); err != nil {
		t.Fatal(err)
	}
}

// Masters returns the nodes that are masters now (after failovers too).
func (c *Cluster) Masters(t testing.TB) []*Server {
	t.Helper()
	var masters []*Server
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: n.Addr})
		info, err := rc.Info(context.Background(), "replication").Result()
		rc.Close()
		if err != nil {
			t.Fatalf("redistest: INFO replication on %s: %v", n.Addr, err)
		}
		if strings.Contains(info, "role:master") {
			masters = append(masters, n)
		}
	}
	return masters
}

// Replicated waits until every running master's replicas have received
// everything it had written when Replicated was called (their replication
// offsets reached its own).
func (c *Cluster) Replicated(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, m := range c.Masters(t) {
		rc := redis.NewClient(&redis.Options{Addr: m.Addr})
		target := int64(-1)
		for {
			info, err := rc.Info(ctx, "replication").Result()
			if err != nil {
				rc.Close()
				t.Fatalf("redistest: INFO replication on %s: %v", m.Addr, err)
			}
			offset, replicas := replicationOffsets(info)
			if target < 0 {
				target = offset
			}
			behind := len(replicas) == 0
			for _, o := range replicas {
				behind = behind || o < target
			}
			if !behind {
				break
			}
			if ctx.Err() != nil {
				rc.Close()
				t.Fatalf("redistest: the replicas of %s did not reach offset %d: %s", m.Addr, target, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
		rc.Close()
	}
}

// replicationOffsets reads a master's INFO replication: its own offset
// and each replica's acknowledged one.
func replicationOffsets(info string) (master int64, replicas []int64) {
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
			master, _ = strconv.ParseInt(v, 10, 64)
		}
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "offset=") {
			for _, f := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
				if v, ok := strings.CutPrefix(f, "offset="); ok {
					o, _ := strconv.ParseInt(v, 10, 64)
					replicas = append(replicas, o)
				}
			}
		}
	}
	return master, replicas
}

// Describe reports, for a failed test's log, each node's address, its
// replication role and master (INFO replication), the keys it holds whose
// name contains name (KEYS: for tests with few keys only), how many of its
// append-only files mention name (the base is the node's dataset at its
// last rewrite, a replica's right after its full sync; the increments are
// every write since), and its log's lines about synchronisation and
// failover; a node that does not answer says why.
func (c *Cluster) Describe(name string) string {
	pattern := "*" + name + "*"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	for i, n := range c.Nodes {
		fmt.Fprintf(&b, "node %d %s: ", i, n.Addr)
		b.WriteString(c.history(i, name))
		if !n.running() {
			b.WriteString("  stopped (or an impostor on its address)\n")
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: n.Addr})
		info, err := rc.Info(ctx, "replication").Result()
		keys, kerr := rc.Keys(ctx, pattern).Result()
		rc.Close()
		if err != nil || kerr != nil {
			fmt.Fprintf(&b, "%v %v\n", err, kerr)
			continue
		}
		var fields []string
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			switch k {
			case "role", "master_host", "master_port", "master_link_status", "master_repl_offset", "connected_slaves":
				fields = append(fields, k+"="+v)
			}
		}
		fmt.Fprintf(&b, "  now %s; keys %q\n", strings.Join(fields, " "), keys)
	}
	return b.String()
}

// history is what node i's files say: which of its append-only files
// mention name, and its log's lines about synchronisation and failover.
func (c *Cluster) history(i int, name string) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(c.dir, fmt.Sprintf("appendonly-%d", i), "*"))
	b.WriteString("append-only files mentioning it:")
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil {
			fmt.Fprintf(&b, " %s %d", filepath.Base(f), strings.Count(string(data), name))
		}
	}
	b.WriteString("\n")
	log, _ := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("node-%d.log", i)))
	for _, line := range strings.Split(string(log), "\n") {
		for _, what := range []string{"Full resync", "keys loaded", "Flushing", "election won", "Streamed RDB", "Connection with master lost", "Synchronization with replica"} {
			if strings.Contains(line, what) {
				b.WriteString("  " + line + "\n")
				break
			}
		}
	}
	return b.String()
}

// Holding returns the running node that holds a key matching pattern
// (KEYS on each node: for tests with few keys only).
func (c *Cluster) Holding(t testing.TB, pattern string) *Server {
	t.Helper()
	for _, m := range c.Masters(t) {
		rc := redis.NewClient(&redis.Options{Addr: m.Addr})
		keys, err := rc.Keys(context.Background(), pattern).Result()
		rc.Close()
		if err != nil {
			t.Fatalf("redistest: KEYS on %s: %v", m.Addr, err)
		}
		if len(keys) > 0 {
			return m
		}
	}
	t.Fatalf("redistest: no master holds a key matching %q", pattern)
	return nil
}
