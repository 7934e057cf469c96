package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store URLs. A store URL names one standalone Redis, or a master that
// Redis Sentinel finds; the Redis client parses both with its own parsers
// (redis.ParseURL, redis.ParseFailoverURL) once retryd took its own
// parameter appendfsync out (health.go):
//
//	redis[s]://[[USER]:PASSWORD@]HOST:PORT[/DB][?OPTIONS]
//	redis[s]://[[USER]:PASSWORD@]SENTINEL:PORT[/DB]?master_name=NAME[&addr=SENTINEL:PORT…][&username=USER][&password=PASSWORD][&OPTIONS]
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

// target is a parsed store URL: either standalone or sentinel is set.
type target struct {
	standalone *redis.Options
	sentinel   *redis.FailoverOptions
	// fsyncAlways is the URL's appendfsync=always.
	fsyncAlways bool
}

// parseURL parses a store URL without connecting. Its errors name the
// part of the URL that is wrong, never the URL itself (it may carry a
// password).
func parseURL(raw string) (*target, error) {
	redisURL, fsyncAlways, err := storeURL(raw)
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
			return nil, fmt.Errorf("redis store: the store URL lists Sentinels (%s=) but names no master: add %s=NAME, "+
				"the name the Sentinels monitor it under", sentinelAddrParam, masterNameParam)
		}
		opts, err := redis.ParseURL(redisURL)
		if err != nil {
			return nil, fmt.Errorf("redis store: the store URL is not a valid redis://host:port/db URL: %w", err)
		}
		return &target{standalone: opts, fsyncAlways: fsyncAlways}, nil
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
	for _, p := range []struct {
		name string
		set  bool
	}{
		{"route_by_latency", opts.RouteByLatency},
		{"route_randomly", opts.RouteRandomly},
		{"replica_only", opts.ReplicaOnly},
	} {
		if p.set {
			return nil, fmt.Errorf("redis store: the Sentinel store URL sets %s: retryd reads and writes the master only "+
				"(a replica may not have the latest writes); drop it", p.name)
		}
	}
	return &target{sentinel: opts, fsyncAlways: fsyncAlways}, nil
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
	if t.standalone != nil {
		return t.standalone.Addr
	}
	return fmt.Sprintf("master %q (Sentinels %s)", t.sentinel.MasterName, strings.Join(t.sentinel.SentinelAddrs, ","))
}

// client returns the target's client; onConnect, when not nil, runs on
// every new connection (to the Sentinels as well, in a Sentinel URL).
func (t *target) client(onConnect func(context.Context, *redis.Conn) error) *redis.Client {
	if t.standalone != nil {
		t.standalone.OnConnect = onConnect
		return redis.NewClient(t.standalone)
	}
	t.sentinel.OnConnect = onConnect
	return redis.NewFailoverClient(t.sentinel)
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
