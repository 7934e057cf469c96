package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/store"
)

var _ store.Pinger = (*Store)(nil)

// Ping implements store.Pinger: Redis answers PING. The server turns a
// failure into NOT_SERVING on gRPC health; the calls themselves fail
// UNAVAILABLE on their own meanwhile, without guessing.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return unavailable("PING", err)
	}
	return nil
}

// Durability. Redis acknowledges a write once it is in its memory; whether
// it is on disk depends on its own settings. With appendonly yes and
// appendfsync always Redis writes and fsyncs its append-only file before it
// answers any client, so every decision retryd acknowledged (and every
// state another replica read) survives a crash of Redis or of its machine.
// With the default appendfsync everysec a crash loses up to about a second
// of acknowledged writes; a clean shutdown (SIGTERM, SHUTDOWN) loses
// nothing. WAITAOF (Redis 7.2) would make one client's writes durable
// without the Redis-wide setting, but other replicas could still read and
// act on a state that is not yet on disk, and Redis 7.0 lacks it; so retryd
// relies on appendfsync always, and checks it when the URL asks.
//
// The check runs on every new connection, not once: the Redis behind a
// URL can change while retryd runs (a Sentinel failover promotes a
// replica, a Redis restarts with other settings), and a connection to a
// master that could lose acknowledged writes is refused before any
// command is sent on it. The calls fail UNAVAILABLE meanwhile, Ping fails
// too (NOT_SERVING, with the reason in the log), and Open refuses to start.
// Asynchronous replication is another way to lose writes, which no fsync
// setting closes: see the package doc on Sentinel.

// appendFsyncParam is the URL query parameter (appendfsync=always) that
// makes Open refuse a Redis that does not fsync every write.
const appendFsyncParam = "appendfsync"

// partitionsParam is the URL query parameter (partitions=N) that selects
// the partitioned key layout of N partitions (see layout.go).
const partitionsParam = "partitions"

// migrateParam is the URL query parameter (migrate=SCHEMA) that has Open
// convert data of an older key layout, schema SCHEMA, to this one (see
// migrate.go).
const migrateParam = "migrate"

// unavailableAfterParam is the URL query parameter
// (unavailable_after=DURATION) that bounds how long a call waits for a
// Redis that does not answer before it fails UNAVAILABLE.
const unavailableAfterParam = "unavailable_after"

// DefaultUnavailableAfter is the bound of unavailable_after when the URL
// names none.
const DefaultUnavailableAfter = time.Second

// maxUnavailableAfter bounds unavailable_after: past it an agent's own
// deadline, not retryd, decides.
const maxUnavailableAfter = time.Minute

// ownParams are retryd's own query parameters of a store URL.
type ownParams struct {
	fsyncAlways bool
	// partitions is 0 when the URL names none.
	partitions int
	// migrate is the older schema version the URL asks to convert, 0 when
	// it names none.
	migrate int
	// unavailableAfter is the bound of unavailable_after (see failFast).
	unavailableAfter time.Duration
	// dialTimeout, poolTimeout and minIdleConns say whether the URL set
	// the Redis client's own dial_timeout, pool_timeout and
	// min_idle_conns, which then stay as given.
	dialTimeout, poolTimeout, minIdleConns bool
}

// storeURL removes retryd's own query parameters from a store URL (the
// Redis client refuses parameters it does not know) and returns what they
// ask for.
func storeURL(raw string) (redisURL string, own ownParams, err error) {
	own.unavailableAfter = DefaultUnavailableAfter
	u, err := url.Parse(raw)
	if err != nil {
		// The URL may carry a password: name the problem, not the URL.
		return "", own, errors.New("redis store: the store URL is not a valid redis://host:port/db URL")
	}
	q := u.Query()
	own.dialTimeout, own.poolTimeout, own.minIdleConns = q.Has("dial_timeout"), q.Has("pool_timeout"), q.Has("min_idle_conns")
	if !q.Has(appendFsyncParam) && !q.Has(partitionsParam) && !q.Has(unavailableAfterParam) && !q.Has(migrateParam) {
		return raw, own, nil
	}
	if q.Has(appendFsyncParam) {
		if v := q.Get(appendFsyncParam); v != "always" {
			return "", own, fmt.Errorf("redis store: the store URL's %s=%q: the one value is always", appendFsyncParam, v)
		}
		own.fsyncAlways = true
		q.Del(appendFsyncParam)
	}
	if q.Has(partitionsParam) {
		v := q.Get(partitionsParam)
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPartitions {
			return "", own, fmt.Errorf("redis store: the store URL's %s=%q: want a number from 1 to %d", partitionsParam, v, MaxPartitions)
		}
		own.partitions = n
		q.Del(partitionsParam)
	}
	if q.Has(migrateParam) {
		v := q.Get(migrateParam)
		n, err := strconv.Atoi(v)
		if err != nil || strconv.Itoa(n) != v || n < 1 || n >= SchemaVersion {
			return "", own, fmt.Errorf("redis store: the store URL's %s=%q: retryd converts schemas 1 and %d (the single layout) "+
				"and 2 and %d (the partitioned one)", migrateParam, v, countersSchemaVersion, countersPartitionedSchemaVersion)
		}
		own.migrate = n
		q.Del(migrateParam)
	}
	if q.Has(unavailableAfterParam) {
		v := q.Get(unavailableAfterParam)
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > maxUnavailableAfter {
			return "", own, fmt.Errorf("redis store: the store URL's %s=%q: want a duration from 1ms to %v, e.g. 1s",
				unavailableAfterParam, v, maxUnavailableAfter)
		}
		own.unavailableAfter = d
		q.Del(unavailableAfterParam)
	}
	u.RawQuery = q.Encode()
	return u.String(), own, nil
}

// durabilityError is a Redis master that does not fsync every write before
// it answers, found on a new connection while the URL asks for
// appendfsync=always.
type durabilityError struct {
	addr                    string
	appendOnly, appendFsync string
}

func (e *durabilityError) Error() string {
	return fmt.Sprintf("redis store: the URL asks for %s=always, but Redis at %s runs appendonly %q, appendfsync %q: "+
		"a crash of Redis could lose decisions retryd acknowledged; set appendonly yes and appendfsync always "+
		"in Redis (on every node a Sentinel may promote), or drop %s from the URL to accept that",
		appendFsyncParam, e.addr, e.appendOnly, e.appendFsync, appendFsyncParam)
}

// requireDurable is the client's connection hook when the URL asks for
// appendfsync=always: a connection to a master that does not fsync every
// write fails, before any command is sent on it. A replica and a Sentinel
// (the Sentinel URL's client connects to both through the same hook) are
// let through: a Sentinel stores no decisions, and a replica refuses
// writes on its own (READONLY). It needs ROLE and CONFIG GET, which some
// managed Redis services rename away: there, leave the parameter out and
// check the service's settings. where names the target when Redis does not
// say its own address.
func requireDurable(where string) func(context.Context, *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		role, err := cn.Do(ctx, "ROLE").Slice()
		if err != nil {
			return fmt.Errorf("redis store: the URL asks for %s=always, but ROLE at %s failed: %w", appendFsyncParam, where, err)
		}
		if len(role) == 0 || role[0] != "master" {
			return nil
		}
		got := map[string]string{}
		for _, name := range []string{"appendonly", "appendfsync"} {
			v, err := cn.ConfigGet(ctx, name).Result()
			if err != nil {
				return fmt.Errorf("redis store: the URL asks for %s=always, but CONFIG GET %s at %s failed: %w",
					appendFsyncParam, name, where, err)
			}
			got[name] = v[name]
		}
		if got["appendonly"] == "yes" && got["appendfsync"] == "always" {
			return nil
		}
		addr := where
		if info, err := cn.ClientInfo(ctx).Result(); err == nil && info.LAddr != "" {
			addr = info.LAddr // the address this connection reached, e.g. the master a Sentinel named
		}
		return &durabilityError{addr: addr, appendOnly: got["appendonly"], appendFsync: got["appendfsync"]}
	}
}
