package redistest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// waitTimeout bounds how long a helper waits for replication or a
// Sentinel: generous, for a loaded machine.
const waitTimeout = time.Minute

// Sentinels are Redis Sentinels (redis-server --sentinel) monitoring one
// master, started by StartSentinels.
type Sentinels struct {
	// MasterName is the name they monitor the master under.
	MasterName string
	// Servers are the Sentinels, each a Server (Stop, Kill, Restart).
	Servers []*Server
}

// SentinelOptions configure StartSentinels. Zero fields take the defaults.
type SentinelOptions struct {
	// MasterName is the master's name. Default "mymaster".
	MasterName string
	// Count is how many Sentinels run. Default 1.
	Count int
	// Quorum is how many must find the master down. Default a majority
	// of Count.
	Quorum int
	// DownAfter is how long the master must not answer before a Sentinel
	// finds it down (down-after-milliseconds). Default 1s.
	DownAfter time.Duration
	// FailoverTimeout is Sentinel's failover-timeout. Default 10s.
	FailoverTimeout time.Duration
	// Replicas are the master's replicas (StartWith with ReplicaOf),
	// written into the Sentinels' configuration so that they know them at
	// once instead of at their first INFO of the master, up to 10s later.
	Replicas []*Server
}

// StartSentinels starts Sentinels monitoring master, each with its own
// configuration file in a temporary directory of the test (Sentinels
// rewrite it), stopped at cleanup. It returns once every Sentinel knows the
// master, every replica (up and synced) and every other Sentinel, so that
// they can agree on a failover.
func StartSentinels(t testing.TB, master *Server, opts SentinelOptions) *Sentinels {
	t.Helper()
	Skip(t)
	if opts.MasterName == "" {
		opts.MasterName = "mymaster"
	}
	if opts.Count <= 0 {
		opts.Count = 1
	}
	if opts.Quorum <= 0 {
		opts.Quorum = opts.Count/2 + 1
	}
	if opts.DownAfter <= 0 {
		opts.DownAfter = time.Second
	}
	if opts.FailoverTimeout <= 0 {
		opts.FailoverTimeout = 10 * time.Second
	}
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("sentinel monitor %s %s %s %d\n", opts.MasterName, host, port, opts.Quorum) +
		fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", opts.MasterName, opts.DownAfter.Milliseconds()) +
		fmt.Sprintf("sentinel failover-timeout %s %d\n", opts.MasterName, opts.FailoverTimeout.Milliseconds())
	for _, r := range opts.Replicas {
		rhost, rport, err := net.SplitHostPort(r.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conf += fmt.Sprintf("sentinel known-replica %s %s %s\n", opts.MasterName, rhost, rport)
	}
	ss := &Sentinels{MasterName: opts.MasterName}
	for range opts.Count {
		dir := t.TempDir()
		file := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := startArgs([]string{file, "--sentinel", "--dir", dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		ss.Servers = append(ss.Servers, s)
	}
	ss.waitReady(t, len(opts.Replicas))
	return ss
}

// URL returns the Sentinel store URL of database db: the first Sentinel as
// the host, the others as addr parameters (the Redis client's
// ParseFailoverURL form).
func (ss *Sentinels) URL(db int) string {
	q := url.Values{"master_name": {ss.MasterName}}
	for _, s := range ss.Servers[1:] {
		q.Add("addr", s.Addr)
	}
	return "redis://" + ss.Servers[0].Addr + "/" + strconv.Itoa(db) + "?" + q.Encode()
}

// sentinel is a client of one Sentinel that does not retry.
func sentinel(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second})
}

// MasterAddr returns the master's address as the first Sentinel that
// answers reports it (SENTINEL get-master-addr-by-name).
func (ss *Sentinels) MasterAddr(ctx context.Context) (string, error) {
	var errs []string
	for _, s := range ss.Servers {
		addr, err := masterAddr(ctx, s.Addr, ss.MasterName)
		if err == nil {
			return addr, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", s.Addr, err))
	}
	return "", fmt.Errorf("redistest: no Sentinel reports master %s: %s", ss.MasterName, strings.Join(errs, "; "))
}

func masterAddr(ctx context.Context, sentinelAddr, name string) (string, error) {
	c := sentinel(sentinelAddr)
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, name).Result()
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("get-master-addr-by-name answered %q", hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// WaitMaster waits until every running Sentinel reports addr as the
// master, as they do once a failover promoted the replica at addr.
func (ss *Sentinels) WaitMaster(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for _, s := range ss.Servers {
		if !s.running() {
			continue
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			got, err := masterAddr(ctx, s.Addr, ss.MasterName)
			cancel()
			if err == nil && got == addr {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: Sentinel %s reports master %s at %q (%v), want %s", s.Addr, ss.MasterName, got, err, addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// waitReady waits until every Sentinel can authorise a failover
// (SENTINEL CKQUORUM: it knows enough other Sentinels) and knows replicas
// replicas of the master, each up and with its link to the master up.
func (ss *Sentinels) waitReady(t testing.TB, replicas int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for _, s := range ss.Servers {
		for {
			err := ss.ready(s.Addr, replicas)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: Sentinel %s is not ready: %v", s.Addr, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (ss *Sentinels) ready(addr string, replicas int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := sentinel(addr)
	defer c.Close()
	if err := c.CkQuorum(ctx, ss.MasterName).Err(); err != nil {
		return fmt.Errorf("CKQUORUM: %w", err)
	}
	rs, err := c.Replicas(ctx, ss.MasterName).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	up := 0
	for _, r := range rs {
		if r["flags"] == "slave" && r["master-link-status"] == "ok" {
			up++
		}
	}
	if up < replicas {
		return fmt.Errorf("%d of %d replicas known and up: %v", up, replicas, rs)
	}
	return nil
}

// running reports whether the server runs (not stopped or killed).
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// waitSynced waits until a replica's link to its master is up: its
// initial synchronisation is done.
func (s *Server) waitSynced(t testing.TB) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(waitTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := c.Info(ctx, "replication").Result()
		cancel()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: replica %s has not synced: %v %s", s.Addr, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Replicated returns once at least n replicas have acknowledged every
// write this server (a master) accepted before the call, from any client:
// it writes a key of its own and waits for it (WAIT n), and a replica
// applies the replication stream in order. A write acknowledged before
// Replicated returned therefore survives the failover to one of them.
func (s *Server) Replicated(t testing.TB, n int) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := c.Set(ctx, "redistest:fence", time.Now().UnixNano(), 0).Err(); err != nil {
		t.Fatalf("redistest: writing the fence on %s: %v", s.Addr, err)
	}
	got, err := c.Wait(ctx, n, waitTimeout).Result()
	if err != nil || got < int64(n) {
		t.Fatalf("redistest: WAIT %d on %s: %d replicas acknowledged, %v", n, s.Addr, got, err)
	}
}
