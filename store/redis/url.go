package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store URLs. A store URL names one standalone Redis, a master that
// Redis Sentinel finds, or a Redis Cluster; the Redis client parses them
// with its own parsers (redis.ParseURL, redis.ParseFailoverURL,
// redis.ParseClusterURL) once retryd took its own parameters appendfsync
// and partitions out (health.go):
//
//	redis[s]://[[USER]:PASSWORD@]HOST:PORT[/DB][?OPTIONS]
//	redis[s]://[[USER]:PASSWORD@]SENTINEL:PORT[/DB]?master_name=NAME[&addr=SENTINEL:PORT…][&username=USER][&password=PASSWORD][&OPTIONS]
//	redis[s]://[[USER]:PASSWORD@]NODE:PORT?addr=NODE:PORT[&addr=…][&OPTIONS]
//
// Cluster. A URL that lists further addresses (addr=) without a
// master_name is a Cluster URL: its host and every addr are seed nodes,
// from which the client learns the cluster's slots, and it follows
// resharding and failovers on its own. A URL of one host also becomes a
// Cluster URL when that host turns out to be a Cluster node (Open asks it),
// so the address of any node is enough. On Cluster the store uses the
// partitioned layout (DefaultClusterPartitions unless partitions=N says
// otherwise), database 0, and reads and writes the masters only.
//
// The parameter master_name makes a URL a Sentinel URL (the standalone
// parser refuses it, so no URL changes meaning): its host and every addr
// are Sentinels, asked for the address of the master NAME whenever a
// connection is made, and the client follows a failover on its own. In a
// Sentinel URL the user and password before the host authenticate to the
// Sentinels, the parameters username and password to the master. OPTIONS
// are the client's own (dial_timeout=3s, pool_size=20, …); those that
// send commands to replicas (route_by_latency, route_randomly,
// replica_only) are refused: a replica may not have the latest writes, and
// every transaction here reads what it writes.

const (
	// masterNameParam names the master in a Sentinel URL.
	masterNameParam = "master_name"
	// sentinelAddrParam lists further Sentinels in a Sentinel URL.
	sentinelAddrParam = "addr"
)

// clusterReloadInterval is how often the Cluster client rereads the slot
// map without being told to.
const clusterReloadInterval = 5 * time.Second

// target is a parsed store URL: one of standalone, sentinel and cluster
// is set.
type target struct {
	standalone *redis.Options
	sentinel   *redis.FailoverOptions
	cluster    *redis.ClusterOptions
	// own are retryd's own parameters.
	own ownParams
	// onConnect is the store's own hook on a new connection, as client
	// was given it (the options hold it wrapped).
	onConnect func(context.Context, *redis.Conn) error
}

// parseURL parses a store URL without connecting. Its errors name the
// part of the URL that is wrong, never the URL itself (it may carry a
// password).
func parseURL(raw string) (*target, error) {
	redisURL, own, err := storeURL(raw)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(redisURL)
	if err != nil {
		return nil, errors.New("redis store: the store URL is not a valid URL")
	}
	q := u.Query()
	if !q.Has(masterNameParam) {
		if q.Has(sentinelAddrParam) {
			opts, err := redis.ParseClusterURL(redisURL)
			if err != nil {
				return nil, fmt.Errorf("redis store: the store URL lists several addresses (%s=) and no %s, "+
					"which makes it a Redis Cluster URL (redis://node:6379?addr=node2:6379), but it is not a valid one: %w",
					sentinelAddrParam, masterNameParam, err)
			}
			if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
				return nil, fmt.Errorf("redis store: the store URL lists several addresses (%s=) and no %s, which makes it "+
					"a Redis Cluster URL, and a Cluster has database 0 only: drop /%s", sentinelAddrParam, masterNameParam, db)
			}
			if err := checkClusterOptions(opts); err != nil {
				return nil, err
			}
			return &target{cluster: opts, own: own}, nil
		}
		opts, err := redis.ParseURL(redisURL)
		if err != nil {
			return nil, fmt.Errorf("redis store: the store URL is not a valid redis://host:port/db URL: %w", err)
		}
		return &target{standalone: opts, own: own}, nil
	}
	if strings.TrimSpace(q.Get(masterNameParam)) == "" {
		return nil, fmt.Errorf("redis store: the Sentinel store URL's %s is empty: give the name the Sentinels "+
			"monitor the master under (sentinel monitor NAME …)", masterNameParam)
	}
	if u.Host == "" {
		return nil, errors.New("redis store: the Sentinel store URL has no host: give a Sentinel's host:port, " +
			"e.g. redis://sentinel-0:26379/0?master_name=mymaster")
	}
	opts, err := redis.ParseFailoverURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("redis store: the Sentinel store URL is not valid "+
			"(redis://sentinel:26379/db?master_name=NAME&addr=sentinel2:26379): %w", err)
	}
	if err := refuseReplicaReads("Sentinel", map[string]bool{
		"route_by_latency": opts.RouteByLatency, "route_randomly": opts.RouteRandomly, "replica_only": opts.ReplicaOnly,
	}); err != nil {
		return nil, err
	}
	return &target{sentinel: opts, own: own}, nil
}

// checkClusterOptions refuses the Cluster client options that read from
// replicas.
func checkClusterOptions(opts *redis.ClusterOptions) error {
	return refuseReplicaReads("Cluster", map[string]bool{
		"read_only": opts.ReadOnly, "route_by_latency": opts.RouteByLatency, "route_randomly": opts.RouteRandomly,
	})
}

// refuseReplicaReads refuses a client option (by its URL parameter's
// name) that sends commands to replicas: a replica may not have the
// latest writes, and every commit checks what it read.
func refuseReplicaReads(kind string, set map[string]bool) error {
	for _, name := range slices.Sorted(maps.Keys(set)) {
		if set[name] {
			return fmt.Errorf("redis store: the %s store URL sets %s: retryd reads and writes masters only "+
				"(a replica may not have the latest writes); drop it", kind, name)
		}
	}
	return nil
}

// clusterOf turns a standalone target whose host is a Cluster node into a
// Cluster target seeded by it.
func clusterOf(o *redis.Options) (*redis.ClusterOptions, error) {
	if o.DB != 0 {
		return nil, fmt.Errorf("redis store: %s is a Redis Cluster node, which has database 0 only; the store URL names database %d", o.Addr, o.DB)
	}
	return &redis.ClusterOptions{
		Addrs: []string{o.Addr}, ClientName: o.ClientName, Protocol: o.Protocol,
		Username: o.Username, Password: o.Password, CredentialsProvider: o.CredentialsProvider,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime,
		TLSConfig: o.TLSConfig,
	}, nil
}

// CheckURL reports whether raw is a store URL Open accepts, without
// connecting: a standalone or a Sentinel URL (see the package's URL forms)
// with retryd's own appendfsync=always. Its errors never hold the URL
// itself, which may carry a password.
func CheckURL(raw string) error {
	_, err := parseURL(raw)
	return err
}

// RedactURL returns a store URL fit for messages and logs: its passwords
// (before the host, and a parameter password) are replaced by xxxxx. A
// URL that does not parse is replaced as a whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a store URL that does not parse)"
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// String says where the target is, for messages: host:port, or the master
// and the Sentinels that find it.
func (t *target) String() string {
	switch {
	case t.standalone != nil:
		return t.standalone.Addr
	case t.cluster != nil:
		return "cluster " + strings.Join(t.cluster.Addrs, ",")
	}
	return fmt.Sprintf("master %q (Sentinels %s)", t.sentinel.MasterName, strings.Join(t.sentinel.SentinelAddrs, ","))
}

// client returns the target's client; onConnect, when not nil, runs on
// every new connection (to the Sentinels as well, in a Sentinel URL).
//
// A new connection is not handed to a command whose context ended while
// the connection was made: go-redis checks a command's context before it
// waits for a connection, and a dial honours it, but the handshake that
// follows a dial (HELLO, onConnect) does not, and the command would then
// be sent after its context ended. A group commit relies on this: nothing
// of it is sent once its context is cancelled (see commitGroup).
func (t *target) client(onConnect func(context.Context, *redis.Conn) error) redis.UniversalClient {
	t.onConnect = onConnect
	onConnect = func(ctx context.Context, cn *redis.Conn) error {
		if t.onConnect != nil {
			if err := t.onConnect(ctx, cn); err != nil {
				return err
			}
		}
		return ctx.Err()
	}
	switch {
	case t.standalone != nil:
		t.standalone.OnConnect = onConnect
		t.failFast(&t.standalone.ContextTimeoutEnabled, &t.standalone.DialTimeout, &t.standalone.PoolTimeout)
		t.warm(&t.standalone.MinIdleConns, t.standalone.PoolSize)
		return redis.NewClient(t.standalone)
	case t.cluster != nil:
		t.cluster.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
			if err := requireClusterNode(ctx, cn); err != nil {
				return err
			}
			return onConnect(ctx, cn)
		}
		t.failFast(&t.cluster.ContextTimeoutEnabled, &t.cluster.DialTimeout, &t.cluster.PoolTimeout)
		t.warm(&t.cluster.MinIdleConns, t.cluster.PoolSize)
		if t.cluster.ClusterStateReloadInterval == 0 {
			// go-redis rereads the slot map on MOVED, or after a minute:
			// after a failover, the commands for the dead master's slots
			// would fail until then (see also Store.reloadSlots).
			t.cluster.ClusterStateReloadInterval = clusterReloadInterval
		}
		return redis.NewClusterClient(t.cluster)
	}
	t.sentinel.OnConnect = onConnect
	t.failFast(&t.sentinel.ContextTimeoutEnabled, &t.sentinel.DialTimeout, &t.sentinel.PoolTimeout)
	t.warm(&t.sentinel.MinIdleConns, t.sentinel.PoolSize)
	return redis.NewFailoverClient(t.sentinel)
}

// requireClusterNode is the first check on every connection of a Cluster
// target: the server must be a Redis Cluster node. The client names the
// nodes by the addresses in its slot map, and after a master dies it
// dials that master's address until a replica has taken over and the map
// is read again. A Redis that is not a Cluster node and listens on that
// address by then (an address handed out again, as Kubernetes does with a
// pod's) would take the commands meant for the Cluster and answer them
// from its own keys: a session not found, decisions written where no
// replica of retryd reads them. A Cluster node answers MOVED for slots it
// does not serve, which the client follows; so the check is that INFO
// reports cluster_enabled:1, one round trip per new connection.
func requireClusterNode(ctx context.Context, cn *redis.Conn) error {
	info, err := cn.Info(ctx, "cluster").Result()
	if err != nil {
		return fmt.Errorf("redis store: INFO cluster on a Cluster node's connection: %w", err)
	}
	if !strings.Contains(info, "cluster_enabled:1") {
		addr := "an address in the Cluster's slot map"
		if ci, err := cn.ClientInfo(ctx).Result(); err == nil && ci.LAddr != "" {
			addr = ci.LAddr
		}
		return fmt.Errorf("redis store: the Redis at %s is not a Cluster node (INFO cluster: cluster_enabled is not 1), "+
			"though the Cluster's slot map names its address: refused, so that no command meant for the Cluster reaches it", addr)
	}
	return nil
}

// failFast sets the client options that let a call end within
// unavailable_after when Redis does not answer, whether it refuses
// connections or a silent network drops every packet: socket reads and
// writes honour the context's deadline (go-redis ignores it unless told,
// and waits its own 3 s read timeout, again for each of its retries),
// and a dial or a wait for a pooled connection gives up at the bound
// unless the URL set dial_timeout or pool_timeout itself. The store then
// gives every Redis round trip of a call a context of that bound.
func (t *target) failFast(contextTimeout *bool, dial, pool *time.Duration) {
	*contextTimeout = true
	if !t.own.dialTimeout {
		*dial = t.own.unavailableAfter
	}
	if !t.own.poolTimeout {
		*pool = t.own.unavailableAfter
	}
}

// warm keeps a connection per partition open (go-redis' MinIdleConns, up
// to the pool's size), unless the URL set min_idle_conns itself: every
// partition has a group commit in flight of its own, and over a long
// round trip a group that has to dial first (connect, HELLO) takes two
// round trips more and misses its callers' bound. The single layout's
// one partition needs no more than the connection its commits keep busy.
func (t *target) warm(minIdle *int, poolSize int) {
	n := t.own.partitions
	if t.cluster != nil {
		n = cmp.Or(n, DefaultClusterPartitions)
	}
	if t.own.minIdleConns || n < 2 {
		return
	}
	*minIdle = min(n, cmp.Or(poolSize, 10*runtime.GOMAXPROCS(0)))
}

// explain adds to an error of Open's first command, for a Sentinel URL,
// what the Sentinels say: that they know no master of that name, or that
// none answers. The client itself reports either as an unreachable master.
func (t *target) explain(ctx context.Context, err error) error {
	if t.sentinel == nil {
		return err
	}
	// The first command may have used up ctx: the Sentinels get a moment
	// of their own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	unknown, answered := 0, 0
	for _, addr := range t.sentinel.SentinelAddrs {
		opts := &redis.Options{Addr: addr, Username: t.sentinel.SentinelUsername, Password: t.sentinel.SentinelPassword,
			TLSConfig: t.sentinel.TLSConfig, DialTimeout: t.sentinel.DialTimeout, MaxRetries: -1}
		c := redis.NewSentinelClient(opts)
		_, gerr := c.GetMasterAddrByName(ctx, t.sentinel.MasterName).Result()
		c.Close()
		switch {
		case errors.Is(gerr, redis.Nil):
			answered++
			unknown++
		case gerr == nil:
			answered++
		}
	}
	switch {
	case answered == 0:
		return fmt.Errorf("no Sentinel of %s answers: %w", strings.Join(t.sentinel.SentinelAddrs, ","), err)
	case unknown == answered:
		return fmt.Errorf("the Sentinels monitor no master named %q (%s=): %w", t.sentinel.MasterName, masterNameParam, err)
	}
	return err
}
