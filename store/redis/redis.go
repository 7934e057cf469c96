// Package redis is retryd's shared store: every session lives in one Redis
// (7 or later; standalone, a master that Redis Sentinel fails over, or a
// Redis Cluster), so several retryd replicas serve one fleet.
//
// A session's whole state is one key holding the engine's snapshot
// (retryd.state.v1.Session). Every change is optimistic: take what this
// replica knows of the session key (the session its last commit wrote, or
// a snapshot to decode; known.go), its partition's sequence counter and
// the session's awaiter entries, run the engine's transition, then one
// server-side script (commit.go) checks that none of them changed and
// writes the new snapshot, its events (on the session's stream and on the
// partition's stream), its timer and a pub/sub notification — atomically,
// or not at all. A commit that lost a race is run again on fresh state, a bounded
// number of times; past that, or when Redis cannot be reached, the call
// fails with service.ErrUnavailable and nothing changed.
//
// Key layouts (layout.go). In the single layout (the default on
// standalone Redis and Sentinel) there is one partition: one counter
// numbers every event of every session, gapless and strictly increasing
// across every replica in commit order, and doubles as the stream ids
// (SEQ-0), so WatchEvents resumes after any sequence. The price is that
// all writes of one Redis are ordered through that counter: a replica
// commits its callers' transitions in groups, one group at a time, and
// groups of different replicas committed at the same moment conflict and
// are retried. The partitioned layout (Redis Cluster, or ?partitions=N)
// has a counter, timer set, stream and group-commit queue per partition,
// all under the partition's hash tag, so a transaction touches one slot
// and partitions commit independently; events are numbered per partition
// (watch.go).
//
// Timers (a pending retry's due or abandon time, a session's expiry) are
// members of the partitions' sorted sets, polled by every replica; the
// transaction that moves a retry from pending to started or cancelled, or
// that expires a session (logging its open chains as closed, reason
// expired), succeeds on exactly one replica (expiry.go). Every AwaitRetry
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
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/fleet"
	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var _ service.Store = (*Store)(nil)

// SchemaVersion is the version of the single key layout, stored in
// retryd:schema; PartitionedSchemaVersion that of the partitioned one,
// stored with its number of partitions (see layout.go).
const (
	SchemaVersion            = 1
	PartitionedSchemaVersion = 2
)

// DefaultEventLogSize is roughly how many events the global stream keeps.
const DefaultEventLogSize = 100_000

const (
	// maxAttempts bounds how often a transaction that lost a race is run
	// again before the call fails with service.ErrUnavailable.
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
	// ChainTTL is how long an idle session is kept. Default 1h.
	ChainTTL time.Duration
	// AbandonGrace is how long a due retry waits for an awaiter. Default 60s.
	AbandonGrace time.Duration
	// EventLogSize is roughly how many events each stream keeps.
	EventLogSize int
	// Now replaces time.Now (tests).
	Now func() time.Time
	// NewID replaces the random retry id generator (tests).
	NewID func() string
	// Rand replaces the jitter source (tests).
	Rand interface{ Float64() float64 }
	// Log receives what the store notices on its own (a session whose
	// data it cannot read); nil discards it.
	Log *slog.Logger
}

// SchemaError is data written by a key layout other than the one this
// store uses: an older or newer retryd, or another number of partitions.
type SchemaError struct {
	// Key is the schema key, Found its value, Want the layout's.
	Key, Found, Want string
}

func (e *SchemaError) Error() string {
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
	// gate is fleet protection's start gate (see fleet.go).
	gate atomic.Pointer[service.StartGate]

	// awaiting counts this replica's connected AwaitRetry streams; stats
	// is the last population read (see stats.go).
	awaiting atomic.Int64
	// resumed is when (on the decision clock, unix nanoseconds) Redis
	// answered the timer poller again after it had been away.
	resumed atomic.Int64
	statsMu sync.Mutex
	stats   service.Stats

	closing  chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

type globalRand struct{}

func (globalRand) Float64() float64 { return mrand.Float64() }

// Open connects to Redis, checks that it answers and that its data has
// this retryd's schema (writing the schema version into an empty
// database), and starts the timer poller and the notification subscriber.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	target, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	cfg.RequireAppendFsyncAlways = cfg.RequireAppendFsyncAlways || target.own.fsyncAlways
	if cfg.ChainTTL <= 0 {
		cfg.ChainTTL = time.Hour
	}
	if cfg.AbandonGrace <= 0 {
		cfg.AbandonGrace = time.Minute
	}
	if cfg.EventLogSize <= 0 {
		cfg.EventLogSize = DefaultEventLogSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NewID == nil {
		cfg.NewID = rand.Text
	}
	if cfg.Rand == nil {
		cfg.Rand = globalRand{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
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
	s.pubsub = s.rdb.PSubscribe(ctx, s.keys.channelPattern())
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
			onConnect := s.target.standalone.OnConnect
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
	if found != want {
		return &SchemaError{Key: key, Found: found, Want: want}
	}
	return nil
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

// timerMember names a pending retry in the timer set: retry ids never hold
// a space, session ids come after it.
func timerMember(sessionID, retryID string) string { return retryID + " " + sessionID }

func unavailable(op string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("redis store: %s: %w: %w", op, service.ErrUnavailable, err)
}

// env is the engine's environment for a transaction of partition p: its
// new retry ids name p.
func (s *Store) env(p int) engine.Env {
	newID := s.cfg.NewID
	if s.keys.partitioned() {
		newID = func() string { return s.keys.retryID(p, s.cfg.NewID()) }
	}
	return engine.Env{Now: s.cfg.Now(), Rand: s.cfg.Rand, NewID: newID}
}

// txn is one transaction's view of a session and what it changes.
type txn struct {
	id string
	// keptSession is the session, nil when it does not exist (create it
	// to write one), and its retry index expiries as this replica last
	// wrote them (nil: unknown, write them all); write updates them.
	keptSession
	awaiters map[string]int64
	expired  []string // awaiter entries whose lease ended, deleted on a save
	env      engine.Env
	before   population // the session's population as read

	save bool // write the session's snapshot
	// gone is the session as it was when it expired in this transaction
	// (sess is then nil, unless a later transition of the group created
	// the session anew): its keys are deleted, its events still logged.
	gone      *engine.Session
	write     bool // write anything at all
	events    []*retrydv1.Event
	forgotten []*engine.Retry
	timers    map[string]*float64 // member → score; nil removes it
	// fleets are the fleet states the group read (see fleet.go), shared
	// by every transition of the group; all are saved with it.
	fleets map[string]*fleet.ProviderState
}

func (t *txn) changed(evs ...*retrydv1.Event) {
	t.save, t.write = true, true
	t.events = append(t.events, evs...)
}

func (t *txn) setTimer(r *engine.Retry, at time.Time) { t.timer(r.ID, score(at)) }

// score is a time's score in the timer set.
func score(at time.Time) *float64 {
	v := float64(at.UnixMilli())
	return &v
}

func (t *txn) clearTimer(retryID string) { t.timer(retryID, nil) }

func (t *txn) timer(retryID string, score *float64) {
	if t.timers == nil {
		t.timers = map[string]*float64{}
	}
	t.timers[timerMember(t.id, retryID)] = score
	t.write = true
}

// queue is one partition's transitions waiting for a group commit;
// leading is set while one caller commits a group (see update).
type queue struct {
	mu      sync.Mutex
	reqs    []*request
	leading bool
}

// request is one call's transition, waiting for a group commit.
type request struct {
	id    string
	fleet string // the fleet state the transition decides with, if any
	fn    func(*txn) error
	done  chan error    // the outcome
	lead  chan struct{} // this caller now commits the next group
}

// update runs fn on the session in an optimistic transaction and returns
// once it is committed; fn's own errors are returned as they are, and
// nothing of fn is written then.
//
// Every commit checks its partition's sequence counter, so a replica
// commits a partition's transitions in groups, one group at a time: the
// callers queue, one of them (the leader) takes up to maxGroup of them,
// runs them in one read and one commit script (again on fresh state whenever another
// replica won the race, at most maxAttempts times), hands every caller its
// outcome and passes the lead on. Partitions commit independently. The
// commit runs under its own timeout, not the caller's context: a caller
// that left must not strand the queue.
func (s *Store) update(ctx context.Context, id string, fn func(*txn) error) error {
	return s.updateWithFleet(ctx, id, "", fn)
}

// updateWithFleet is update for a transition that also decides with the
// fleet state under fleetKey (when not empty): it is read and saved in the
// same transaction.
func (s *Store) updateWithFleet(ctx context.Context, id, fleetKey string, fn func(*txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := s.keys.partition(id)
	q := s.queues[p]
	req := &request{id: id, fleet: fleetKey, fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	q.mu.Lock()
	q.reqs = append(q.reqs, req)
	if !q.leading {
		q.leading = true
		req.lead <- struct{}{}
	}
	q.mu.Unlock()
	for {
		select {
		case err := <-req.done:
			return err
		case <-req.lead:
			s.lead(p)
		}
	}
}

// lead commits the group at the head of partition p's queue (the leader's
// own request is its first) and passes the lead to the next caller.
func (s *Store) lead(p int) {
	q := s.queues[p]
	q.mu.Lock()
	n := min(len(q.reqs), maxGroup)
	group := slices.Clone(q.reqs[:n])
	q.reqs = slices.Delete(q.reqs, 0, n)
	q.mu.Unlock()

	errs := s.commitGroup(p, group)
	for i, r := range group {
		r.done <- errs[i]
	}

	q.mu.Lock()
	if len(q.reqs) > 0 {
		q.reqs[0].lead <- struct{}{}
	} else {
		q.leading = false
	}
	q.mu.Unlock()
}

// commitGroup runs a group of partition p's transitions in one optimistic
// commit (apply, commit.go), again on fresh state while another replica
// changed what it read, and returns each one's outcome.
func (s *Store) commitGroup(p int, group []*request) []error {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	errs := make([]error, len(group))
	for attempt := range maxAttempts {
		err := s.apply(ctx, p, group, errs)
		switch {
		case err == nil:
			return errs
		case !errors.Is(err, errConflict):
			if !errors.Is(err, service.ErrUnavailable) {
				err = unavailable("committing", err)
			}
			for i := range errs {
				errs[i] = err
			}
			return errs
		}
		time.Sleep(time.Duration(mrand.Int64N(int64(attempt+1) * int64(200*time.Microsecond))))
	}
	for i := range errs {
		errs[i] = fmt.Errorf("redis store: %d transactions lost to concurrent writers: %w", maxAttempts, service.ErrUnavailable)
	}
	return errs
}

// loaded is one session as a transaction reads it.
type loaded struct {
	// sess is nil when the session does not exist or is damaged; indexed
	// are its retry index expiries as this replica last wrote them, nil
	// for a session decoded from its snapshot.
	keptSession
	// awaiters counts the live awaiter entries per retry; expired names the
	// entries whose lease ended (see awaiters.go).
	awaiters map[string]int64
	expired  []string
	// damaged is why a session's data could not be read.
	damaged error
}

// load reads sessions with their awaiter counts (GetChains, AwaitRetry:
// a commit decides on what the replica knows instead, see recall). A
// session whose data is damaged is nil, with its error in damaged.
func (s *Store) load(ctx context.Context, ids []string) ([]loaded, error) {
	gets := make([]*redis.StringCmd, len(ids))
	aws := make([]*redis.MapStringStringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, id := range ids {
			gets[i] = pl.Get(ctx, s.keys.sessionKey(id))
			aws[i] = pl.HGetAll(ctx, s.keys.awaitersKey(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, unavailable("reading sessions", err)
	}
	// Leases are wall-clock times of the replicas, not the decision clock.
	now := time.Now().UnixMilli()
	out := make([]loaded, len(ids))
	for i, id := range ids {
		b, err := gets[i].Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, unavailable("reading session", err)
		}
		out[i] = decodeSession(id, b, aws[i].Val(), now)
	}
	return out, nil
}

// decodeSession makes a loaded session of its snapshot (nil or empty: no
// session) and awaiter entries; leases are compared with now (unix ms).
func decodeSession(id string, b []byte, fields map[string]string, now int64) loaded {
	var l loaded
	l.awaiters, l.expired = countAwaiters(fields, now)
	if len(b) == 0 {
		return l
	}
	snap := &statev1.Session{}
	if err := proto.Unmarshal(b, snap); err != nil {
		l.damaged = fmt.Errorf("redis store: session %q is damaged: %w", id, err)
		return l
	}
	sess, err := engine.RestoreSession(snap)
	if err != nil {
		l.damaged = fmt.Errorf("redis store: %w", err)
		return l
	}
	for _, r := range sess.Retries() {
		r.Awaiters = int(l.awaiters[r.ID])
	}
	l.sess = sess
	return l
}

// recall makes the group's sessions of what this replica knows of them
// (known.go) — the session its last commit wrote a snapshot from when it
// still knows that one (knownValue.sess), else the known snapshot
// decoded — and adds the checks that what it knows still holds — of
// their keys and of the partition's counter — to c.
func (s *Store) recall(c *commit, p int, ids []string) (out []loaded, last uint64) {
	counter := s.known.get(s.keys.seqKey(p)).raw
	c.checkValue(s.keys.seqKey(p), counter)
	now := time.Now().UnixMilli()
	out = make([]loaded, len(ids))
	for i, id := range ids {
		v := s.known.take(s.keys.sessionKey(id))
		fields := s.known.get(s.keys.awaitersKey(id)).fields
		c.checkLarge(s.keys.sessionKey(id), v.raw, v.revision)
		c.checkHash(s.keys.awaitersKey(id), fields)
		if v.sess != nil && !s.decodeAlways {
			out[i] = reuseSession(v.keptSession, fields, now)
		} else {
			out[i] = decodeSession(id, []byte(v.raw), fields, now)
		}
	}
	return out, counterValue(counter)
}

// reuseSession is decodeSession for a session this replica's last commit
// wrote the known snapshot from (knownValue.sess): the same session and
// retry index expiries, with the awaiter counts of now.
func reuseSession(kept keptSession, fields map[string]string, now int64) loaded {
	l := loaded{keptSession: kept}
	l.awaiters, l.expired = countAwaiters(fields, now)
	for _, r := range kept.sess.Retries() {
		r.Awaiters = int(l.awaiters[r.ID])
	}
	return l
}

// loadOne reads one session (nil when it does not exist).
func (s *Store) loadOne(ctx context.Context, id string) (*engine.Session, error) {
	out, err := s.load(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	return out[0].sess, out[0].damaged
}

// apply runs a group's transitions on freshly read sessions and, if any
// changed something, writes them all in one commit script, provided
// nothing it read changed meanwhile (errConflict otherwise). errs receives
// each transition's own refusal; an error returned fails the whole group.
func (s *Store) apply(ctx context.Context, p int, group []*request, errs []error) error {
	var ids []string
	index := map[string]int{}
	for _, r := range group {
		if _, ok := index[r.id]; !ok {
			index[r.id] = len(ids)
			ids = append(ids, r.id)
		}
	}
	var fleetKeys []string
	for _, r := range group {
		if r.fleet != "" && !slices.Contains(fleetKeys, r.fleet) {
			fleetKeys = append(fleetKeys, r.fleet)
		}
	}
	if s.contended(p) {
		if err := s.refresh(ctx, p, ids, fleetKeys); err != nil {
			return err
		}
	}
	c := newCommit()
	sessions, last := s.recall(c, p, ids)
	fleets := s.recallFleets(c, p, fleetKeys)
	env := s.env(p)
	var gateErr error
	if g := s.gate.Load(); g != nil {
		if fleets == nil {
			fleets = map[string]*fleet.ProviderState{}
		}
		env.Gate = func(r *engine.Retry, now time.Time) (time.Time, bool) {
			key, ok := (*g).FleetKey(r.SessionID, r.Provider())
			if !ok {
				return time.Time{}, false
			}
			return (*g).Start(r.SessionID, r.Provider(), s.recallFleet(c, p, fleets, key), now)
		}
	}
	txns := make([]*txn, len(ids))
	for i, id := range ids {
		l := sessions[i]
		txns[i] = &txn{id: id, keptSession: l.keptSession, awaiters: l.awaiters, expired: l.expired, env: env,
			before: populationOf(l.sess), fleets: fleets}
	}
	for i, r := range group {
		// Damaged data refuses the calls that touch it, and only them.
		if errs[i] = sessions[index[r.id]].damaged; errs[i] == nil {
			errs[i] = r.fn(txns[index[r.id]])
		}
	}
	if gateErr != nil {
		return gateErr
	}
	base := s.sequenceBase(last)
	seq := base
	write := false
	for _, t := range txns {
		write = write || t.write
		for _, ev := range t.events {
			seq++
			ev.Sequence = seq
		}
	}
	if seq == base {
		seq = last // no events: the counter stays
	}
	// Even a group that writes nothing runs the script, with its checks
	// alone: its answers (a repeated report's, a refusal) were decided on
	// what this replica knew, which the checks confirm.
	if write {
		if err := s.writeAll(ctx, c, p, txns, fleets, seq, last); err != nil {
			return err
		}
	}
	for i, t := range txns {
		// A transition that changed nothing (a repeated report, a refusal,
		// a timer set again) leaves the session as its known snapshot has
		// it, as the memory store keeps it: it stays the key's session.
		if !t.save && t.gone == nil && t.sess != nil && t.sess == sessions[i].sess {
			c.keep(s.keys.sessionKey(t.id), t.keptSession)
		}
	}
	switch current, err := c.run(ctx, s.rdb); {
	case err == nil:
		for _, t := range txns {
			if t.sess != nil {
				t.sess.Commit()
			}
		}
		c.remember(s.known)
		return nil
	case errors.Is(err, errConflict):
		s.known.learn(c.list, current)
		s.conflicted(p)
		return err
	default:
		// Whether the script ran is unknown: so are the keys' values.
		s.known.forget(c.checkedKeys())
		return unavailable("writing sessions", err)
	}
}

// writeAll adds a group's writes to its commit: the sessions' (see
// write), the counter, the fleet states and the population counters.
func (s *Store) writeAll(ctx context.Context, c *commit, p int, txns []*txn, fleets map[string]*fleet.ProviderState, seq, last uint64) error {
	var pop population
	for _, t := range txns {
		var snap []byte
		var spans []retrySpan
		if t.save && t.sess != nil {
			var err error
			if snap, spans, err = encodeSession(t.sess, t.keptSession); err != nil {
				return fmt.Errorf("redis store: encoding session %q: %w", t.id, err)
			}
		}
		if err := s.write(ctx, c, p, t, snap, spans); err != nil {
			return err
		}
		if snap != nil {
			t.snap = unsafe.String(unsafe.SliceData(snap), len(snap)) // see commit.Set
			c.keep(s.keys.sessionKey(t.id), t.keptSession)
		}
		pop = pop.add(t.delta())
	}
	if seq != last {
		c.Set(ctx, s.keys.seqKey(p), seq, 0)
	}
	if err := s.writeFleets(ctx, c, p, fleets); err != nil {
		return err
	}
	s.count(ctx, c, p, pop)
	return nil
}

// keyTTL is how long Redis keeps a session's keys after a write. Expiry
// itself is a timer (see expiry.go); the key TTL is only the backstop that
// bounds Redis' memory when no replica runs to handle that timer, so it
// lasts ttlMargin longer.
func (s *Store) keyTTL(sess *engine.Session, now time.Time) time.Duration {
	return max(s.expiresAt(sess).Sub(now), 0) + ttlMargin
}

// indexedRetry is until when a retained retry's index key lives, in
// Unix milliseconds of the replica's clock, as the replica last wrote it,
// and where the retry's encoding is in the snapshot written then (see
// encodeSession).
type indexedRetry struct {
	id    string
	until int64
	retrySpan
}

// retrySpan is where a terminal retry's encoding (statev1.Retry) is in a
// snapshot the replica wrote; n is 0 for a pending retry, whose state
// will still change.
type retrySpan struct{ off, n int32 }

// Field numbers of statev1.Session that encodeSession writes itself.
var (
	retriesField  = fieldNumber("retries")
	revisionField = fieldNumber("revision")
)

func fieldNumber(name protoreflect.Name) protowire.Number {
	return (&statev1.Session{}).ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

// encodeSession returns sess's snapshot, encoded and ending with a fresh
// revision (see checkLarge), and where each retained retry's encoding is
// in it, in sess.Retries' order. The bytes are those of Snapshot with
// that revision. A terminal retry never changes, so its encoding is
// copied from the snapshot prev was written to when prev says where it
// is there, instead of being built and encoded again: on a long session
// the retained retries (up to engine.MaxRetainedRetries) are most of the
// snapshot, and encoding them all was most of the cost of a write.
func encodeSession(sess *engine.Session, prev keptSession) ([]byte, []retrySpan, error) {
	skeleton := sess.SnapshotWithoutRetries()
	retries := sess.Retries()
	// Each retry is the bytes of its encoding in prev.snap, or a message
	// to encode, of size n.
	type part struct {
		copied string
		msg    *statev1.Retry
		n      int
	}
	parts := make([]part, len(retries))
	head := skeleton.SizeVT()
	size := head + protowire.SizeTag(revisionField) + protowire.SizeBytes(revisionLen)
	for i, r := range retries {
		if sp, ok := prev.span(r.ID); ok {
			parts[i] = part{copied: prev.snap[sp.off : sp.off+sp.n], n: int(sp.n)}
		} else {
			msg := r.Snapshot()
			parts[i] = part{msg: msg, n: msg.SizeVT()}
		}
		size += protowire.SizeTag(retriesField) + protowire.SizeBytes(parts[i].n)
	}
	b := make([]byte, head, size)
	if _, err := skeleton.MarshalToSizedBufferVT(b); err != nil {
		return nil, nil, err
	}
	spans := make([]retrySpan, len(retries))
	for i, r := range retries {
		b = protowire.AppendTag(b, retriesField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(parts[i].n))
		at := len(b)
		if parts[i].msg == nil {
			b = append(b, parts[i].copied...)
		} else {
			b = b[:at+parts[i].n]
			if _, err := parts[i].msg.MarshalToSizedBufferVT(b[at:]); err != nil {
				return nil, nil, err
			}
		}
		if r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			spans[i] = retrySpan{int32(at), int32(parts[i].n)}
		}
	}
	b = protowire.AppendTag(b, revisionField, protowire.BytesType)
	b = protowire.AppendBytes(b, newRevision())
	return b, spans, nil
}

// span returns where retry id's encoding is in k.snap, if k recorded it.
func (k keptSession) span(id string) (retrySpan, bool) {
	for _, x := range k.indexed {
		if x.id == id {
			return x.retrySpan, x.n > 0 && k.snap != ""
		}
	}
	return retrySpan{}, false
}

// indexRetries adds to a commit the writes that keep each retained
// retry's index key (retry id → session id, for AwaitRetry and
// CancelRetries by id) alive at least as long as the session key, which
// the commit sets to live ttl from now.
//
// Each index key written lives one chain TTL longer than that, and a key
// is written again only once less than half a chain TTL of that lead is
// left (or when this replica does not know it: a session decoded from its
// snapshot has no expiries, so every key is written). Refreshing every
// key on every write cost a SET per retained retry, up to
// engine.MaxRetainedRetries of them per decision on a long session, for
// keys that were nowhere near expiring. The half-TTL margin also absorbs
// a step back of this replica's clock between two commits. An index key
// outliving its session is harmless: lookups read the session, and
// forgetting a session deletes its retries' keys (forget); the TTL only
// bounds Redis' memory when no replica runs.
//
// spans are where each retry's encoding is in the snapshot written, which
// the new expiries keep with them (see encodeSession).
func (s *Store) indexRetries(ctx context.Context, pl *commit, p int, t *txn, ttl time.Duration, spans []retrySpan) {
	now := t.env.Now.UnixMilli()
	need := now + ms(ttl)      // the session key's expiry
	lead := ms(s.cfg.ChainTTL) // how much longer an index key lives
	retries := t.sess.Retries()
	indexed := make([]indexedRetry, len(retries))
	for i, r := range retries {
		until := int64(0)
		for _, x := range t.indexed {
			if x.id == r.ID {
				until = x.until
				break
			}
		}
		if until < need+lead/2 {
			until = need + lead
			pl.Set(ctx, s.keys.retryKey(p, r.ID), t.id, time.Duration(until-now)*time.Millisecond)
		}
		indexed[i] = indexedRetry{r.ID, until, spans[i]}
	}
	t.indexed = indexed
}

// write adds one session's changes to a commit; spans are where snap
// holds each retained retry (see encodeSession).
func (s *Store) write(ctx context.Context, pl *commit, p int, t *txn, snap []byte, spans []retrySpan) error {
	id := t.id
	ttl := s.cfg.ChainTTL + ttlMargin
	if t.gone != nil {
		s.forget(ctx, pl, p, t)
	}
	if snap != nil {
		ttl = s.keyTTL(t.sess, t.env.Now)
		pl.setSnapshot(ctx, s.keys.sessionKey(id), snap, ttl)
		s.indexRetries(ctx, pl, p, t, ttl, spans)
		if len(t.expired) > 0 {
			pl.HDel(ctx, s.keys.awaitersKey(id), t.expired...)
		}
		pl.PExpire(ctx, s.keys.awaitersKey(id), ttl)
		t.timer(expiryTimer, score(s.expiresAt(t.sess)))
	}
	for _, r := range t.forgotten {
		pl.Del(ctx, s.keys.retryKey(p, r.ID))
	}
	for _, ev := range t.events {
		b, err := ev.MarshalVT()
		if err != nil {
			return fmt.Errorf("redis store: encoding event: %w", err)
		}
		sid := strconv.FormatUint(ev.GetSequence(), 10) + "-0"
		pl.XAdd2(ctx, s.keys.streamKey(id), s.cfg.EventLogSize, s.keys.eventsKey(p), s.partitionLogSize(), sid, b)
	}
	if len(t.events) > 0 {
		pl.PExpire(ctx, s.keys.streamKey(id), ttl)
	}
	for m, at := range t.timers {
		if at == nil {
			pl.ZRem(ctx, s.keys.timersKey(p), m)
		} else {
			pl.ZAdd(ctx, s.keys.timersKey(p), *at, m)
		}
	}
	if t.save || t.gone != nil {
		pl.Publish(ctx, s.keys.channel(id), "")
	}
	return nil
}

func notFound(format string, args ...any) error {
	return &engine.Error{Kind: engine.KindNotFound, Message: fmt.Sprintf(format, args...)}
}

// FailedStep implements service.Store.
func (s *Store) FailedStep(ctx context.Context, f engine.Failure) (engine.FailOutcome, error) {
	var out engine.FailOutcome
	if err := s.updateWithFleet(ctx, f.Request.GetSessionId(), f.FleetKey, decide(f, &out)); err != nil {
		return engine.FailOutcome{}, err
	}
	return out, nil
}

// decide is FailedStep's transition; it leaves its outcome in out.
func decide(f engine.Failure, out *engine.FailOutcome) func(*txn) error {
	return func(t *txn) error {
		if t.sess == nil {
			t.sess = engine.NewSession(t.id, t.env.Now)
		}
		if f.FleetKey != "" && f.Fleet != nil {
			f.Fleet.Bind(t.fleets[f.FleetKey])
		}
		var err error
		if *out, err = t.sess.Fail(t.env, f); err != nil {
			return err
		}
		if len(out.Events) == 0 {
			return nil // a repeated report changes nothing
		}
		t.changed(out.Events...)
		t.forgotten = out.Forgotten
		if r := out.Scheduled; r != nil {
			t.setTimer(r, r.Due())
		}
		return nil
	}
}

// sessionOf looks a retry id of a session in scope (see service.InScope)
// up in the retry index.
func (s *Store) sessionOf(ctx context.Context, scope, retryID string) (string, error) {
	p, ok := s.keys.retryPartition(retryID)
	if !ok {
		return "", notFound("no retry %s", retryID)
	}
	id, err := s.rdb.Get(ctx, s.keys.retryKey(p, retryID)).Result()
	if errors.Is(err, redis.Nil) || err == nil && !service.InScope(scope, id) {
		return "", notFound("no retry %s", retryID)
	}
	if err != nil {
		return "", unavailable("reading the retry index", err)
	}
	return id, nil
}

// retry reads a retained retry, with its awaiter count.
func (s *Store) retry(ctx context.Context, sessionID, retryID string) (*engine.Retry, error) {
	sess, err := s.loadOne(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	var r *engine.Retry
	if sess != nil {
		r = sess.Retry(retryID)
	}
	if r == nil {
		return nil, notFound("no retry %s", retryID)
	}
	return r, nil
}

// fire moves a due retry on: Start when an agent awaits it, Cancel
// (abandoned) when its grace passed with none, otherwise it sets the
// retry's next timer. A terminal or forgotten retry leaves the timer set.
func (s *Store) fire(ctx context.Context, sessionID, retryID string) error {
	return s.update(ctx, sessionID, func(t *txn) error {
		var r *engine.Retry
		if t.sess != nil {
			r = t.sess.Retry(retryID)
		}
		now := t.env.Now
		switch {
		case r == nil || r.Status != retrydv1.RetryStatus_RETRY_STATUS_PENDING:
			t.clearTimer(retryID)
		case now.Before(r.Due()):
			t.setTimer(r, r.Due())
		case t.awaiters[retryID] > 0:
			if ev, ok := t.sess.Start(t.env, r); ok {
				t.changed(ev)
				t.clearTimer(retryID)
			} else {
				t.setTimer(r, r.HeldUntil()) // held by the start gate
			}
		case now.Before(s.abandonAt(r)):
			t.setTimer(r, s.abandonAt(r))
		default:
			t.changed(t.sess.Cancel(t.env, r, retrydv1.CancelReason_CANCEL_REASON_ABANDONED)...)
			t.clearTimer(retryID)
		}
		return nil
	})
}

// AwaitRetry implements service.Store.
func (s *Store) AwaitRetry(ctx context.Context, scope, retryID string, send func(*retrydv1.AwaitRetryResponse) error) error {
	sessionID, err := s.sessionOf(ctx, scope, retryID)
	if err != nil {
		return err
	}
	r, err := s.retry(ctx, sessionID, retryID)
	if err != nil {
		return err
	}
	if term := r.Terminal(); term != nil {
		if err := send(&retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_State{State: r.State()}}); err != nil {
			return err
		}
		return send(term)
	}
	a, err := s.attach(ctx, sessionID, retryID)
	if err != nil {
		return err
	}
	defer a.detach(ctx)
	// Read again: the count now includes this stream, and the retry may
	// have ended in between (then the loop below sends its end).
	if r, err = s.retry(ctx, sessionID, retryID); err != nil {
		return err
	}
	state := r.State()
	if r.Terminal() == nil && !s.cfg.Now().Before(r.Due()) {
		// Due already, and now an agent is here: this is the start. The
		// stream still reports the pending state first, then Started.
		if err := s.fire(ctx, sessionID, retryID); err != nil {
			return err
		}
	}
	if err := send(&retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_State{State: state}}); err != nil {
		return err
	}
	recheck := time.NewTicker(recheckInterval)
	defer recheck.Stop()
	for {
		notified, release := s.notify.watch(sessionID)
		if err := a.renewIfDue(ctx); err != nil {
			release()
			return err
		}
		r, err := s.retry(ctx, sessionID, retryID)
		if err != nil {
			release()
			return err
		}
		if term := r.Terminal(); term != nil {
			release()
			return send(term)
		}
		if !s.cfg.Now().Before(r.Due()) {
			// Due and still pending although this stream awaits it: its
			// timer found no live awaiter (this one's lease had run out
			// while it was late). Start it now rather than at the abandon
			// timer.
			if err := s.fire(ctx, sessionID, retryID); err != nil {
				release()
				return err
			}
		}
		select {
		case <-notified:
		case <-recheck.C:
		case <-ctx.Done():
			release()
			return ctx.Err()
		case <-s.closing:
			release()
			return send(r.ShutdownCancelled())
		}
		release()
	}
}

// CancelRetry implements service.Store.
func (s *Store) CancelRetry(ctx context.Context, scope, retryID string) (*retrydv1.CancelRetriesResponse, error) {
	sessionID, err := s.sessionOf(ctx, scope, retryID)
	if err != nil {
		return nil, err
	}
	var state *retrydv1.RetryState
	err = s.update(ctx, sessionID, func(t *txn) error {
		var r *engine.Retry
		if t.sess != nil {
			r = t.sess.Retry(retryID)
		}
		if r == nil {
			return notFound("no retry %s", retryID)
		}
		if evs := t.sess.Cancel(t.env, r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED); len(evs) > 0 {
			t.changed(evs...)
			t.clearTimer(retryID)
		}
		state = r.State()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &retrydv1.CancelRetriesResponse{Retries: []*retrydv1.RetryState{state}}, nil
}

// CancelSession implements service.Store.
func (s *Store) CancelSession(ctx context.Context, sessionID string) (*retrydv1.CancelRetriesResponse, error) {
	resp := &retrydv1.CancelRetriesResponse{}
	err := s.update(ctx, sessionID, func(t *txn) error {
		if t.sess == nil {
			return notFound("no session %s", sessionID)
		}
		pending := t.sess.Pending()
		states, delegation, evs := t.sess.CancelAll(t.env)
		t.changed(evs...)
		if pending != nil {
			t.clearTimer(pending.ID)
		}
		resp.Retries, resp.DelegationsCancelled = states, 0
		if delegation {
			resp.DelegationsCancelled = 1
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// StepSucceeded implements service.Store. A success on a session retryd
// has never seen records nothing.
func (s *Store) StepSucceeded(ctx context.Context, req *retrydv1.StepSucceededRequest) (*retrydv1.StepSucceededResponse, error) {
	resp := &retrydv1.StepSucceededResponse{}
	err := s.update(ctx, req.GetSessionId(), func(t *txn) error {
		if t.sess == nil {
			return nil
		}
		closed, evs, err := t.sess.Succeed(t.env, req.GetTurn(), req.GetStep())
		if err != nil {
			return err
		}
		t.changed(evs...) // even without events the latest position moved
		resp.Closed = closed
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// GetChains implements service.Store.
func (s *Store) GetChains(ctx context.Context, sessionID string) (*retrydv1.GetChainsResponse, error) {
	sess, err := s.loadOne(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	if sess == nil {
		return nil, notFound("no session %s", sessionID)
	}
	return sess.Chains(), nil
}

// WatchEvents implements service.Store: a session's events come from its
// stream, all events from the partition's stream, or with several
// partitions from all of theirs merged in sequence order (watchAll).
func (s *Store) WatchEvents(ctx context.Context, req *retrydv1.WatchEventsRequest, send func(*retrydv1.Event) error) error {
	key := s.keys.eventsKey(0)
	switch {
	case req.GetSessionId() != "":
		key = s.keys.streamKey(req.GetSessionId())
	case s.keys.partitions() > 1:
		return s.watchAll(ctx, req, send)
	}
	after := req.GetAfterSequence()
	recheck := time.NewTicker(recheckInterval)
	defer recheck.Stop()
	for {
		notified, release := s.notify.watch(req.GetSessionId())
		msgs, err := s.rdb.XRangeN(ctx, key, strconv.FormatUint(after+1, 10)+"-0", "+", readBatch).Result()
		if err != nil {
			release()
			return unavailable("reading events", err)
		}
		for _, m := range msgs {
			ev, err := decodeEvent(m)
			if err != nil {
				release()
				return err
			}
			if err := send(ev); err != nil {
				release()
				return err
			}
			after = ev.GetSequence()
		}
		if len(msgs) == readBatch {
			release()
			continue
		}
		if req.GetStopAtEnd() {
			release()
			return nil
		}
		select {
		case <-notified:
		case <-recheck.C:
		case <-ctx.Done():
			release()
			return ctx.Err()
		case <-s.closing:
			release()
			return service.ErrShutdown
		}
		release()
	}
}

func decodeEvent(m redis.XMessage) (*retrydv1.Event, error) {
	v, ok := m.Values["e"].(string)
	if !ok {
		return nil, fmt.Errorf("redis store: event %s has no payload", m.ID)
	}
	ev := &retrydv1.Event{}
	if err := proto.Unmarshal([]byte(v), ev); err != nil {
		return nil, fmt.Errorf("redis store: event %s is damaged: %w", m.ID, err)
	}
	return ev, nil
}

// runTimers polls the timer set for due retries and moves each on.
func (s *Store) runTimers() {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		cancel()
	}()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	lost := false // the last poll failed: Redis was away
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		due, err := s.dueTimers(ctx)
		if err != nil {
			// Redis is away: nothing can start or be abandoned until it is
			// back. Ask again a little later.
			lost = true
			s.reloadSlots(ctx)
			select {
			case <-s.closing:
				return
			case <-time.After(recheckInterval):
			}
			continue
		}
		if lost {
			lost = false
			s.resumed.Store(s.cfg.Now().UnixNano())
		}
		s.fireAll(ctx, due)
	}
}

// reloadSlots has a Cluster client reread the slot map now, once a command
// failed: a master may have died and its replica taken over, which the
// client learns on its own only from a MOVED reply or its periodic reload.
func (s *Store) reloadSlots(ctx context.Context) {
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		c.ReloadState(ctx)
	}
}

// dueTimers reads up to pollBatch due timers of every partition, in one
// pipeline (on Cluster, one per master).
func (s *Store) dueTimers(ctx context.Context) ([][]string, error) {
	now := strconv.FormatInt(s.cfg.Now().UnixMilli(), 10)
	cmds := make([]*redis.StringSliceCmd, s.keys.partitions())
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for p := range cmds {
			cmds[p] = pl.ZRangeArgs(ctx, redis.ZRangeArgs{
				Key: s.keys.timersKey(p), ByScore: true, Start: "-inf", Stop: now, Count: pollBatch,
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	due := make([][]string, len(cmds))
	for p, c := range cmds {
		due[p] = c.Val()
	}
	return due, nil
}

// abandonAt is when a pending retry nobody awaits is cancelled as
// abandoned: the abandon grace after it fell due, or, when it fell due
// while this replica could not reach Redis, the grace after Redis answered
// again, since no agent could attach in between (as the file store gives
// a whole grace after a restart).
func (s *Store) abandonAt(r *engine.Retry) time.Time {
	from := r.Due()
	if resumed := time.Unix(0, s.resumed.Load()); resumed.After(from) {
		from = resumed
	}
	return from.Add(s.cfg.AbandonGrace)
}

// fireAll handles due timers (due[p] are partition p's), each in a
// goroutine of its own so that they share group commits, and returns once
// all are handled. A failure leaves the timer in the set: the next poll
// tries again, or, when the session's data is damaged, the poll after
// damagedRetry (see postpone).
func (s *Store) fireAll(ctx context.Context, due [][]string) {
	var wg sync.WaitGroup
	for p, members := range due {
		for _, m := range members {
			retryID, sessionID, ok := strings.Cut(m, " ")
			switch {
			case !ok || s.keys.partition(sessionID) != p:
				s.rdb.ZRem(ctx, s.keys.timersKey(p), m)
			case retryID == expiryTimer:
				wg.Go(func() { s.postpone(ctx, p, m, sessionID, s.expireSession(ctx, sessionID)) })
			default:
				wg.Go(func() { s.postpone(ctx, p, m, sessionID, s.fire(ctx, sessionID, retryID)) })
			}
		}
	}
	wg.Wait()
}

// damagedRetry is how long a timer of a session whose data cannot be read
// waits before it is tried again.
const damagedRetry = time.Minute

// postpone handles a timer's failure: when the session's data is damaged
// (anything but Redis being unavailable), trying again at the next poll
// would only fail again, every 10 ms; the timer moves damagedRetry on
// instead, with a warning, and the session's other calls keep failing as
// they do until someone repairs or deletes its key.
func (s *Store) postpone(ctx context.Context, p int, member, sessionID string, err error) {
	if err == nil || errors.Is(err, service.ErrUnavailable) || ctx.Err() != nil {
		return
	}
	at := s.cfg.Now().Add(damagedRetry)
	if zerr := s.rdb.ZAdd(ctx, s.keys.timersKey(p), redis.Z{Score: *score(at), Member: member}).Err(); zerr != nil {
		return
	}
	s.cfg.Log.Warn("redis store: a timer of a session whose data cannot be read; trying again later",
		"session", sessionID, "err", err, "retry_at", at)
}

// runNotifications fans the subscription's messages out to local awaiters
// and watchers.
func (s *Store) runNotifications() {
	defer s.wg.Done()
	for msg := range s.pubsub.Channel() {
		if id, ok := s.keys.sessionOfChannel(msg.Channel); ok {
			s.notify.wake(id)
		}
	}
}

// notifier wakes local waiters of a session (and every waiter of all
// sessions) when a replica changed it.
type notifier struct {
	mu       sync.Mutex
	sessions map[string]*waiters
	all      chan struct{}
}

type waiters struct {
	ch   chan struct{}
	refs int
}

func newNotifier() *notifier {
	return &notifier{sessions: map[string]*waiters{}, all: make(chan struct{})}
}

// watch returns a channel closed at the next change of the session (of any
// session when id is empty); call release once done with it.
func (n *notifier) watch(id string) (<-chan struct{}, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if id == "" {
		return n.all, func() {}
	}
	w := n.sessions[id]
	if w == nil {
		w = &waiters{ch: make(chan struct{})}
		n.sessions[id] = w
	}
	w.refs++
	return w.ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if w.refs--; w.refs == 0 && n.sessions[id] == w {
			delete(n.sessions, id)
		}
	}
}

func (n *notifier) wake(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if w := n.sessions[id]; w != nil {
		close(w.ch)
		w.ch = make(chan struct{})
	}
	close(n.all)
	n.all = make(chan struct{})
}
