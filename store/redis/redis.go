// Package redis is retryd's shared store: every session lives in one Redis
// (7 or later; standalone, a master that Redis Sentinel fails over, or a
// Redis Cluster), so several retryd replicas serve one fleet.
//
// A session's whole state is one key holding the engine's snapshot
// (retryd.state.v1.Session). Every change is optimistic: take what this
// replica knows of the session key (the session its last commit wrote, or
// a snapshot to decode; known.go), its partition's sequence counter and
// the session's awaiter entries, run the engine's transition, then one
// server-side script (commit.go) checks that none of them changed (the
// snapshot's revision covers the awaiter entries, awaiters.go) and
// writes the new snapshot, the group's events (one entry of the
// partition's stream, events.go), its timer, the counters and a pub/sub
// notification — atomically,
// or not at all. A commit that lost a race is run again on fresh state, a bounded
// number of times; past that, or when Redis cannot be reached, the call
// fails with store.ErrUnavailable and nothing changed.
//
// Key layouts (layout.go). In the single layout (the default on
// standalone Redis and Sentinel) there is one partition: one counter
// numbers every event of every session, gapless and strictly increasing
// across every replica in commit order, and a group's last one is its
// stream entry's id (SEQ-0), so WatchEvents resumes after any sequence. The price is that
// all writes of one Redis are ordered through that counter: a replica
// commits its callers' transitions in groups, one group at a time, and
// groups of different replicas committed at the same moment conflict and
// are retried. The partitioned layout (Redis Cluster, or ?partitions=N)
// has a counter, timer set, stream and group-commit queue per partition,
// all under the partition's hash tag, so a transaction touches one slot
// and partitions commit independently; events are numbered per partition
// (watch.go).
//
// Timers (one per session: its pending retry's due or abandon time, or
// its expiry) are members of the partitions' sorted sets, polled by every
// replica; the transaction that moves a retry from pending to started or
// cancelled, or that expires a session (logging its open chains as
// closed, reason expired), succeeds on exactly one replica (timers.go,
// expiry.go). Every AwaitRetry
// stream holds a leased entry in the session's awaiter hash, renewed while
// it waits, so a retry starts when it is due and an agent waits on any
// replica, and the awaiters of a replica that died stop counting once
// their lease ends (awaiters.go). The same transactions keep the
// population counters (stats.go). Ping reports whether Redis answers, for
// gRPC health; the URL parameter appendfsync=always refuses a Redis that
// could lose acknowledged writes (health.go).
//
// Sentinel and Cluster. A URL with master_name (url.go) reaches the master
// through Redis Sentinel: the client asks the Sentinels for the master's
// address on every new connection and drops its connections to the old
// master on a switch, so after a failover the calls, the timer poller and
// the subscription carry on against the promoted replica, with nothing to
// do here: until then they fail UNAVAILABLE and Ping fails (NOT_SERVING).
// A Cluster client likewise follows the cluster's slot map through
// resharding and failovers. What survives a failover is what had reached
// the promoted replica: Redis replicates asynchronously, so a decision
// acknowledged in the last moments before the master died can be missing
// on the new master, together with everything committed after it (each
// script's writes replicate as a whole and in order, so the new master holds a
// prefix of the old one's transactions, never part of one). Its sequence
// numbers are then handed out again. appendfsync=always does not close
// that window, WAIT after each commit would not either (other replicas
// read, notify and start retries on a state before it is replicated); see
// docs/storage.md.
package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/store"
)

var _ store.Backend = (*Store)(nil)

// SchemaVersion is the version of the single key layout, stored in
// retryd:schema; PartitionedSchemaVersion that of the partitioned one,
// stored with its number of partitions (see layout.go). Schemas 1 to 4
// were their older versions; Open converts them when asked to
// (migrate.go).
const (
	SchemaVersion            = 5
	PartitionedSchemaVersion = 6
)

// DefaultEventLogSize is roughly how many events the global stream keeps.
const DefaultEventLogSize = store.DefaultEventLogSize

const (
	// maxAttempts bounds how often a transaction that lost a race is run
	// again before the call fails with store.ErrUnavailable.
	maxAttempts = 64
	// pollInterval is how often a replica looks for due timers.
	pollInterval = 10 * time.Millisecond
	// pollBatch is how many due timers one poll handles.
	pollBatch = 64
	// recheckInterval bounds how long an awaiter or a watcher waits without
	// a notification (one lost while the subscription reconnected) before
	// it reads again.
	recheckInterval = time.Second
	// ttlMargin keeps a session with a pending retry a while past its
	// abandon time, so that the abandonment is still recorded.
	ttlMargin = time.Minute
	// readBatch is how many events WatchEvents reads at once.
	readBatch = 512
	// maxGroup bounds how many transitions one transaction commits.
	maxGroup = 128
	// commitTimeout bounds one group commit.
	commitTimeout = 10 * time.Second
	// startTimeout bounds the PING and schema check of Open.
	startTimeout = 5 * time.Second
)

// Config configures a Store. Zero fields take the defaults.
type Config struct {
	// URL is the Redis to use: redis://[user:password@]host:port/db, or a
	// Sentinel URL redis://SENTINEL:26379/db?master_name=NAME&addr=… (see
	// url.go), with the Redis client's query parameters and retryd's own
	// appendfsync=always (the same as RequireAppendFsyncAlways).
	URL string
	// RequireAppendFsyncAlways makes the store refuse a Redis master that
	// does not run appendonly yes with appendfsync always, the setting under
	// which no acknowledged decision is lost when Redis crashes: at Open,
	// and on every connection after it (see health.go).
	RequireAppendFsyncAlways bool
	// KeyPrefix is put before every key and channel, so that several
	// independent retryd deployments (or tests) share one Redis.
	KeyPrefix string
	// Options are the settings every store takes; EventLogSize is
	// roughly how many events each stream keeps.
	store.Options
}

// SchemaError is data written by a key layout other than the one this
// store uses: an older or newer retryd, or another number of partitions.
type SchemaError struct {
	// Key is the schema key, Found its value, Want the layout's.
	Key, Found, Want string
	// Migrate is the value of the URL parameter migrate that converts the
	// data found, when this retryd can ("" when it cannot).
	Migrate string
}

func (e *SchemaError) Error() string {
	if e.Migrate != "" {
		return fmt.Sprintf("redis store: %s holds schema %q, the layout of an older retryd, but this store URL's "+
			"key layout is schema %q; retryd converts it only when asked to: stop every retryd that uses this "+
			"Redis, then start one with %s=%s added to the store URL (see docs/storage.md, Schema versions)",
			e.Key, e.Found, e.Want, migrateParam, e.Migrate)
	}
	return fmt.Sprintf("redis store: %s holds schema %q, but this store URL's key layout is schema %q; "+
		"retryd does not convert data on its own: use the URL (and the retryd version) that wrote it, "+
		"migrate it explicitly, or use another database or key prefix",
		e.Key, e.Found, e.Want)
}

// Store is the Redis store. Create it with Open; Stop ends its streams and
// timers, Close also releases the connections.
type Store struct {
	cfg    Config
	target *target // where rdb points (url.go)
	rdb    redis.UniversalClient
	keys   layout
	known  *known // what this replica knows of the keys commits check
	// decodeAlways makes commits decode every session from its known
	// snapshot instead of reusing the session the last commit wrote it
	// from (tests; see knownValue.sess).
	decodeAlways bool
	// contention[p] is until when commits to partition p read first
	// (unix nanoseconds; see known.go).
	contention []atomic.Int64
	pubsub     *redis.PubSub
	notify     *notifier
	// queues[p] holds partition p's transitions waiting for a group
	// commit (see update).
	queues []*queue

	// awaiting counts this replica's connected AwaitRetry streams; stats
	// is the last population read (see stats.go).
	awaiting atomic.Int64
	// resumed is when (on the decision clock, unix nanoseconds) Redis
	// answered the timer poller again after it had been away.
	resumed atomic.Int64
	// postponed counts the timers postponed for damaged data (see
	// postpone).
	postponed atomic.Int64
	statsMu   sync.Mutex
	stats     store.Stats

	closing  chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// Open connects to Redis, checks that it answers and that its data has
// this retryd's schema (writing the schema version into an empty
// database), and starts the timer poller and the notification subscriber.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	target, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	cfg.RequireAppendFsyncAlways = cfg.RequireAppendFsyncAlways || target.own.fsyncAlways
	cfg.Options = cfg.Options.WithDefaults()
	var onConnect func(context.Context, *redis.Conn) error
	if cfg.RequireAppendFsyncAlways {
		onConnect = requireDurable(target.String())
	}
	s := &Store{cfg: cfg, target: target, rdb: target.client(onConnect), known: newKnown(),
		notify: newNotifier(), closing: make(chan struct{})}
	if err := s.check(ctx); err != nil {
		s.rdb.Close()
		return nil, err
	}
	s.contention = make([]atomic.Int64, s.keys.partitions())
	s.queues = make([]*queue, s.keys.partitions())
	for p := range s.queues {
		s.queues[p] = &queue{}
	}
	s.pubsub = s.rdb.Subscribe(ctx, s.keys.notifyChannel())
	cctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if _, err := s.pubsub.Receive(cctx); err != nil {
		s.pubsub.Close()
		s.rdb.Close()
		return nil, fmt.Errorf("redis store: subscribing to notifications at %s: %w", target, err)
	}
	s.wg.Add(2)
	go s.runNotifications()
	go s.runTimers()
	return s, nil
}

// check connects: it finds out whether the URL's host is a Cluster node
// (then the store becomes a Cluster client), chooses the key layout, and
// checks the schema.
func (s *Store) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := s.ping(ctx); err != nil {
		return err
	}
	if s.target.standalone != nil {
		info, err := s.rdb.Info(ctx, "cluster").Result()
		if err != nil {
			return fmt.Errorf("redis store: INFO cluster at %s: %w", s.target, err)
		}
		if strings.Contains(info, "cluster_enabled:1") {
			opts, err := clusterOf(s.target.standalone)
			if err != nil {
				return err
			}
			onConnect := s.target.onConnect
			s.rdb.Close()
			s.target = &target{cluster: opts, own: s.target.own}
			s.rdb = s.target.client(onConnect)
			if err := s.ping(ctx); err != nil {
				return err
			}
		}
	}
	switch n := s.target.own.partitions; {
	case s.target.cluster != nil:
		s.keys = partitionedLayout(s.cfg.KeyPrefix, cmp.Or(n, DefaultClusterPartitions))
	case n > 0:
		s.keys = partitionedLayout(s.cfg.KeyPrefix, n)
	default:
		s.keys = singleLayout(s.cfg.KeyPrefix)
	}
	return s.checkSchema(ctx)
}

// ping sends Open's first command, with errors that say what is wrong.
func (s *Store) ping(ctx context.Context) error {
	err := s.rdb.Ping(ctx).Err()
	if err == nil {
		return nil
	}
	if de := (*durabilityError)(nil); errors.As(err, &de) {
		return de // the connection hook refused it (health.go)
	}
	if s.target.standalone != nil && strings.Contains(err.Error(), "SELECT is not allowed in cluster mode") {
		return fmt.Errorf("redis store: %s is a Redis Cluster node, which has database 0 only; the store URL names database %d",
			s.target, s.target.standalone.DB)
	}
	if s.target.cluster != nil && strings.Contains(err.Error(), "cluster support disabled") {
		return fmt.Errorf("redis store: the store URL lists several addresses (%s=) and no %s, which makes it a "+
			"Redis Cluster URL, but %s is not a Cluster node (for Sentinel, add %s=NAME): %w",
			sentinelAddrParam, masterNameParam, s.target, masterNameParam, err)
	}
	return fmt.Errorf("redis store: Redis at %s does not answer PING: %w", s.target, s.target.explain(ctx, err))
}

// checkSchema writes the layout's schema into an empty database and
// refuses data of another.
func (s *Store) checkSchema(ctx context.Context) error {
	key := s.cfg.KeyPrefix + "retryd:schema"
	want := s.keys.schema()
	if err := s.rdb.SetNX(ctx, key, want, 0).Err(); err != nil {
		return fmt.Errorf("redis store: writing %s at %s: %w", key, s.target, err)
	}
	found, err := s.rdb.Get(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("redis store: reading %s at %s: %w", key, s.target, err)
	}
	if found == want {
		return nil
	}
	for _, v := range s.keys.olderVersions() {
		if found != s.keys.schemaOf(v) {
			continue
		}
		if s.target.own.migrate != v {
			return &SchemaError{Key: key, Found: found, Want: want, Migrate: strconv.Itoa(v)}
		}
		return s.migrate(ctx, key, v)
	}
	return &SchemaError{Key: key, Found: found, Want: want}
}

// Partitions returns the number of partitions of the key layout: 1 in the
// single layout (see layout.go).
func (s *Store) Partitions() int { return s.keys.partitions() }

// Stop ends every AwaitRetry stream with Cancelled (reason shutdown) and
// every WatchEvents stream, and stops the timer poller. Nothing is
// recorded: shutdown is not a decision. It is idempotent.
func (s *Store) Stop() {
	s.stopOnce.Do(func() {
		close(s.closing)
		s.pubsub.Close()
	})
	s.wg.Wait()
}

// Close stops the store and closes its connections.
func (s *Store) Close() error {
	s.Stop()
	return s.rdb.Close()
}

func unavailable(op string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("redis store: %s: %w: %w", op, store.ErrUnavailable, err)
}

// bounded returns ctx limited to the store URL's unavailable_after: one
// Redis round trip of a call waits no longer for a Redis that does not
// answer (see failFast).
func (s *Store) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.target.own.unavailableAfter)
}

// unavailableWithin is unavailable for an error of a round trip made under
// bounded(ctx): the bound running out is Redis not answering in time
// (ErrUnavailable), while ctx's own end stays the caller's.
func (s *Store) unavailableWithin(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// Not wrapped: the caller's deadline did not pass, so the edge
		// must not answer DEADLINE_EXCEEDED.
		return fmt.Errorf("redis store: %s: no answer within %s=%v (%v): %w",
			op, unavailableAfterParam, s.target.own.unavailableAfter, err, store.ErrUnavailable)
	}
	return unavailable(op, err)
}

// env is the engine's environment for a group's transactions, without
// the retry id generator (see sessionEnv).
func (s *Store) env() engine.Env {
	return engine.Env{Now: s.cfg.Now(), Rand: s.cfg.Rand}
}

// sessionEnv is env for a transaction of one session of partition p: its
// new retry ids name the session, or p (see layout.retryID).
func (s *Store) sessionEnv(env engine.Env, p int, sessionID string) engine.Env {
	env.NewID = func() string { return s.keys.retryID(p, s.cfg.NewID(), sessionID) }
	return env
}

func notFound(format string, args ...any) error {
	return &engine.Error{Kind: engine.KindNotFound, Message: fmt.Sprintf(format, args...)}
}
