// Package file is retryd's durable store for a single node: the memory
// store's sessions, timers and event log, with every change written to an
// embedded bbolt database (one file, DIR/retryd.db) and synced to disk
// before anyone can observe it. A decision an agent received survives a
// crash of the process or the machine; restarted on the same directory,
// retryd continues every chain, retry number and pending retry where it
// stopped.
//
// Concurrent changes share a write transaction and its sync (bbolt's
// DB.Batch): under load, many decisions pay for one fsync.
//
// The data carries a schema version. Open refuses data of any other
// version with an error naming both; retryd never converts data on its
// own, so a change of the schema ships with an explicit migration.
package file

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/retryd/retryd/engine"
	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/memory"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

var _ store.Backend = (*Store)(nil)

// SchemaVersion is the version of the data layout this retryd reads and
// writes: buckets meta, sessions (session id → retryd.state.v1.Session)
// and events (big-endian sequence → retryd.v1.Event).
const SchemaVersion = 1

// FileName is the database file inside the store's directory.
const FileName = "retryd.db"

// batchDelay is how long a write waits for others to share its transaction
// and sync (bbolt's MaxBatchDelay; its default is 10ms). Writes that arrive
// while a sync is under way queue behind it and form the next batch anyway,
// so a short delay costs a lone decision little and a storm loses nothing.
const batchDelay = 2 * time.Millisecond

// lockTimeout bounds the wait for the database's file lock: another process
// holding it is an error, not a reason to hang.
const lockTimeout = 2 * time.Second

var (
	bucketMeta       = []byte("meta")
	bucketSessions   = []byte("sessions")
	bucketEvents     = []byte("events")
	keySchemaVersion = []byte("schema_version")
	keyLastSequence  = []byte("last_sequence")
)

// SchemaError is data written by a schema version this retryd does not
// read.
type SchemaError struct {
	// Path is the database file.
	Path string
	// Found is the version the data was written with, as stored.
	Found string
	// Want is SchemaVersion.
	Want int
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("file store %s holds data of schema version %s, but this retryd reads schema version %d; "+
		"it does not convert data on its own: migrate it explicitly or start with another directory", e.Path, e.Found, e.Want)
}

// Store is the durable single-node store. Create it with Open and release
// it with Close.
type Store struct {
	// Store is the in-memory state every call is served from; Persist
	// writes each change through to the database first. Its Close ends the
	// streams (awaiters hear Cancelled(shutdown)) but leaves the database
	// open for calls still draining.
	*memory.Store

	db        *bolt.DB
	path      string
	retain    uint64
	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating if need be) the store in dir and loads its state:
// every session, the retained events, and the sequence numbering. It fails
// when the directory or database cannot be opened or locked, when the data
// has another schema version, or when a stored session is damaged.
// cfg.Persist and cfg.Restore are the store's own; other fields are used
// as memory.New uses them.
func Open(dir string, cfg memory.Config) (*Store, error) {
	if dir == "" {
		return nil, errors.New("file store: empty directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout, FreelistType: bolt.FreelistMapType})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("file store %s is locked by another process (another retryd on the same directory?)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("file store %s: %w", path, err)
	}
	db.MaxBatchDelay = batchDelay
	cfg.Options = cfg.Options.WithDefaults()
	s := &Store{db: db, path: path, retain: uint64(cfg.EventLogSize)}
	state, err := s.load()
	if err != nil {
		db.Close()
		return nil, err
	}
	cfg.Persist = s.persist
	cfg.Restore = state
	s.Store = memory.New(cfg)
	return s, nil
}

// load checks the schema version (writing it into a new database) and
// reads the whole state.
func (s *Store) load() (*memory.State, error) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			empty := true
			_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
			if !empty {
				return fmt.Errorf("file store %s: not a retryd store (no %s bucket)", s.path, bucketMeta)
			}
			for _, name := range [][]byte{bucketMeta, bucketSessions, bucketEvents} {
				if _, err := tx.CreateBucket(name); err != nil {
					return err
				}
			}
			return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte(strconv.Itoa(SchemaVersion)))
		}
		found := meta.Get(keySchemaVersion)
		if found == nil {
			return &SchemaError{Path: s.path, Found: "(none)", Want: SchemaVersion}
		}
		if string(found) != strconv.Itoa(SchemaVersion) {
			v := string(found)
			if _, err := strconv.ParseUint(v, 10, 32); err != nil {
				v = strconv.Quote(v)
			}
			return &SchemaError{Path: s.path, Found: v, Want: SchemaVersion}
		}
		if tx.Bucket(bucketSessions) == nil || tx.Bucket(bucketEvents) == nil {
			return fmt.Errorf("file store %s: a bucket of schema version %d is missing", s.path, SchemaVersion)
		}
		return nil
	})
	if err != nil {
		var se *SchemaError
		if errors.As(err, &se) {
			return nil, err
		}
		return nil, fmt.Errorf("file store %s: %w", s.path, err)
	}
	state := &memory.State{}
	err = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyLastSequence); v != nil {
			if len(v) != 8 {
				return fmt.Errorf("%s of %d bytes, want 8", keyLastSequence, len(v))
			}
			state.LastSequence = binary.BigEndian.Uint64(v)
		}
		err := tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			var snap statev1.Session
			if err := proto.Unmarshal(v, &snap); err != nil {
				return fmt.Errorf("session %q: %w", k, err)
			}
			if snap.GetId() != string(k) {
				return fmt.Errorf("session %q is stored under key %q", snap.GetId(), k)
			}
			sess, err := engine.RestoreSession(&snap)
			if err != nil {
				return err
			}
			state.Sessions = append(state.Sessions, sess)
			return nil
		})
		if err != nil {
			return err
		}
		c := tx.Bucket(bucketEvents).Cursor()
		from := uint64(1)
		if state.LastSequence > s.retain {
			from = state.LastSequence - s.retain + 1
		}
		for k, v := c.Seek(sequenceKey(from)); k != nil; k, v = c.Next() {
			ev := &retrydv1.Event{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("event %x: %w", k, err)
			}
			if len(k) != 8 || ev.GetSequence() != binary.BigEndian.Uint64(k) || ev.GetSequence() > state.LastSequence {
				return fmt.Errorf("event %d is stored under key %x (last sequence %d)", ev.GetSequence(), k, state.LastSequence)
			}
			state.Events = append(state.Events, ev)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("file store %s: damaged data: %w", s.path, err)
	}
	return state, nil
}

func sequenceKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

type record struct{ key, value []byte }

// persist is the memory store's Persist hook: it writes the changes in a
// batched transaction and returns once that transaction is synced.
func (s *Store) persist(changes []memory.Change) error {
	// Marshal now, under the callers' shard locks: the snapshots share the
	// sessions' records, which may change once the locks are released.
	var sessions, events []record
	var last uint64
	for _, c := range changes {
		r := record{key: []byte(c.SessionID)}
		if c.Session != nil {
			b, err := c.Session.MarshalVT() // protobuf-go's bytes (see server/codec.go), faster
			if err != nil {
				return fmt.Errorf("file store: session %q: %w", c.SessionID, err)
			}
			r.value = b
		}
		sessions = append(sessions, r)
		for _, ev := range c.Events {
			b, err := ev.MarshalVT()
			if err != nil {
				return fmt.Errorf("file store: event %d: %w", ev.GetSequence(), err)
			}
			events = append(events, record{key: sequenceKey(ev.GetSequence()), value: b})
			last = max(last, ev.GetSequence())
		}
	}
	// Batch may run this function more than once (alone, when another
	// function of its batch failed): it must be idempotent.
	err := s.db.Batch(func(tx *bolt.Tx) error {
		sb, eb, mb := tx.Bucket(bucketSessions), tx.Bucket(bucketEvents), tx.Bucket(bucketMeta)
		for _, r := range sessions {
			var err error
			if r.value == nil {
				err = sb.Delete(r.key)
			} else {
				err = sb.Put(r.key, r.value)
			}
			if err != nil {
				return err
			}
		}
		for _, r := range events {
			if err := eb.Put(r.key, r.value); err != nil {
				return err
			}
		}
		if last == 0 {
			return nil
		}
		// Writes of different sessions may commit out of sequence order.
		top := last
		if v := mb.Get(keyLastSequence); len(v) == 8 && binary.BigEndian.Uint64(v) >= top {
			top = binary.BigEndian.Uint64(v)
		} else if err := mb.Put(keyLastSequence, sequenceKey(top)); err != nil {
			return err
		}
		// Keep the newest events only, as the log does.
		if top <= s.retain {
			return nil
		}
		cutoff := sequenceKey(top - s.retain)
		c := eb.Cursor()
		for k, _ := c.First(); k != nil && string(k) <= string(cutoff); k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("file store %s: %w", s.path, err)
	}
	return nil
}

// Close ends every stream (as memory.Store.Close does), stops the timers,
// then closes the database. Calls that are still running fail once the
// database is closed: stop serving first.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		_ = s.Store.Close() // never fails
		s.closeErr = s.db.Close()
	})
	return s.closeErr
}

// Path returns the database file.
func (s *Store) Path() string { return s.path }
