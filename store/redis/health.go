package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/retryd/retryd/service"
)

var _ service.Pinger = (*Store)(nil)

// Ping implements service.Pinger: Redis answers PING. The server turns a
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

// appendFsyncParam is the URL query parameter (appendfsync=always) that
// makes Open refuse a Redis that does not fsync every write.
const appendFsyncParam = "appendfsync"

// storeURL removes retryd's own query parameters from a store URL (the
// Redis client refuses parameters it does not know) and returns what they
// ask for.
func storeURL(raw string) (redisURL string, fsyncAlways bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		// The URL may carry a password: name the problem, not the URL.
		return "", false, errors.New("redis store: the store URL is not a valid redis://host:port/db URL")
	}
	q := u.Query()
	if !q.Has(appendFsyncParam) {
		return raw, false, nil
	}
	if v := q.Get(appendFsyncParam); v != "always" {
		return "", false, fmt.Errorf("redis store: the store URL's %s=%q: the one value is always", appendFsyncParam, v)
	}
	q.Del(appendFsyncParam)
	u.RawQuery = q.Encode()
	return u.String(), true, nil
}

// checkDurability refuses a Redis that does not fsync every write before it
// answers. It needs CONFIG GET, which some managed Redis services rename
// away: there, leave the parameter out and check the service's settings.
func (s *Store) checkDurability(ctx context.Context) error {
	addr := s.rdb.Options().Addr
	got := map[string]string{}
	for _, name := range []string{"appendonly", "appendfsync"} {
		v, err := s.rdb.ConfigGet(ctx, name).Result()
		if err != nil {
			return fmt.Errorf("redis store: the URL asks for %s=always, but CONFIG GET %s at %s failed: %w",
				appendFsyncParam, name, addr, err)
		}
		got[name] = v[name]
	}
	if got["appendonly"] != "yes" || got["appendfsync"] != "always" {
		return fmt.Errorf("redis store: the URL asks for %s=always, but Redis at %s runs appendonly %q, appendfsync %q: "+
			"a crash of Redis could lose decisions retryd acknowledged; set appendonly yes and appendfsync always "+
			"in Redis, or drop %s from the URL to accept that", appendFsyncParam, addr, got["appendonly"], got["appendfsync"], appendFsyncParam)
	}
	return nil
}
