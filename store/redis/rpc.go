package redis

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/await"
)

// The backend's primitives (store.Backend): a transaction is a group
// commit's transition (update), a read is of the session's key, a retry
// is found by the id that names its session or by the retry index.

// Update implements store.Backend.
func (s *Store) Update(ctx context.Context, id, fleetKey string, tr store.Transition) error {
	return s.updateWithFleet(ctx, id, fleetKey, func(t *txn) error { return tr.Apply(t) })
}

// Read implements store.Backend.
func (s *Store) Read(ctx context.Context, id string, fn func(*engine.Session) error) error {
	sess, err := s.loadOne(ctx, id)
	if err != nil {
		return err
	}
	return fn(sess)
}

// Now implements store.Backend.
func (s *Store) Now() time.Time { return s.cfg.Now() }

// Closing implements store.Backend.
func (s *Store) Closing() <-chan struct{} { return s.closing }

// Locate implements store.Backend: the session a retry id names, or the
// retry index's.
func (s *Store) Locate(ctx context.Context, retryID string) (string, error) {
	if id, ok := retrySession(retryID); ok {
		return id, nil
	}
	p, ok := s.keys.retryPartition(retryID)
	if !ok {
		return "", notFound("no retry %s", retryID)
	}
	bctx, cancel := s.bounded(ctx)
	defer cancel()
	id, err := s.rdb.Get(bctx, s.keys.retryKey(p, retryID)).Result()
	if errors.Is(err, redis.Nil) {
		return "", notFound("no retry %s", retryID)
	}
	if err != nil {
		return "", s.unavailableWithin(ctx, "reading the retry index", err)
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

// Await implements store.Backend.
func (s *Store) Await(sessionID, retryID string) await.Store {
	return &awaitStore{s: s, sessionID: sessionID, retryID: retryID}
}

// awaitStore is the store as the await protocol sees it, for one stream
// of the retry Look found: a retry is read from its session's key, an
// awaiter is a leased entry in the session's awaiter hash (awaiters.go),
// and a start is the timer's transition (fire).
type awaitStore struct {
	s                  *Store
	sessionID, retryID string
	due                time.Time // the retry's, as Look found it
}

func view(r *engine.Retry) await.View {
	return await.View{State: r.State(), Terminal: r.Terminal(), Due: r.Due()}
}

// Look implements await.Store.
func (a *awaitStore) Look(ctx context.Context) (await.View, error) {
	r, err := a.s.retry(ctx, a.sessionID, a.retryID)
	if err != nil {
		return await.View{}, err
	}
	a.due = r.Due()
	return view(r), nil
}

// Attach implements await.Store: the retry is read again once the
// awaiter's entry is written, so that its count includes this stream.
func (a *awaitStore) Attach(ctx context.Context) (await.Awaiter, await.View, error) {
	s, sessionID, retryID := a.s, a.sessionID, a.retryID
	aw, err := s.attach(ctx, sessionID, retryID, a.due)
	if err != nil {
		return nil, await.View{}, err
	}
	aw.sessionID, aw.retryID = sessionID, retryID
	r, err := s.retry(ctx, sessionID, retryID)
	if err != nil {
		aw.Detach()
		return nil, await.View{}, err
	}
	return aw, view(r), nil
}

// Start implements await.Awaiter.
func (a *awaiter) Start(ctx context.Context) error { return a.s.fire(ctx, a.sessionID, a.retryID) }

// Wait implements await.Awaiter: it reads the retry whenever a
// notification says its session changed, or every recheckInterval (a
// notification lost while the subscription reconnected), renewing the
// awaiter's lease as it goes.
func (a *awaiter) Wait(ctx context.Context) (*retrydv1.AwaitRetryResponse, error) {
	s := a.s
	recheck := time.NewTicker(recheckInterval)
	defer recheck.Stop()
	for {
		notified, release := s.notify.watch(a.sessionID)
		if err := a.renewIfDue(ctx); err != nil {
			release()
			return nil, err
		}
		r, err := s.retry(ctx, a.sessionID, a.retryID)
		if err != nil {
			release()
			return nil, err
		}
		if term := r.Terminal(); term != nil {
			release()
			return term, nil
		}
		if !s.cfg.Now().Before(r.Due()) {
			// Due and still pending although this stream awaits it: its
			// timer found no live awaiter (this one's lease had run out
			// while it was late). Start it now rather than at the abandon
			// timer.
			if err := s.fire(ctx, a.sessionID, a.retryID); err != nil {
				release()
				return nil, err
			}
		}
		select {
		case <-notified:
		case <-recheck.C:
		case <-ctx.Done():
			release()
			return nil, ctx.Err()
		case <-s.closing:
			release()
			return r.ShutdownCancelled(), nil
		}
		release()
	}
}

// Events implements store.Backend: all events come from the partition's
// stream, or with several partitions from all of theirs merged in
// sequence order (mergedReader); a session's are those of its partition's
// stream that name it. Each event is appended once, to its partition's
// stream: a stream per session as well would double the appends of every
// decision and hold a whole stream node per session, for the rarer reader
// of one session, who reads past the other sessions' events instead, as
// the memory store's log does.
func (s *Store) Events(sessionID string, after uint64) store.EventReader {
	if sessionID == "" && s.keys.partitions() > 1 {
		return s.newMergedReader(after)
	}
	return &streamReader{s: s, session: sessionID, key: s.keys.eventsKey(s.keys.partition(sessionID)), after: after}
}

// streamReader reads one partition's stream.
type streamReader struct {
	s       *Store
	session string
	key     string
	after   uint64
}

// Next implements store.EventReader: a notification lost while the
// subscription reconnected is made up for by reading again every
// recheckInterval.
func (r *streamReader) Next(ctx context.Context) (store.Batch, error) {
	notified, release := r.s.notify.watch(r.session)
	msgs, err := r.s.rdb.XRangeN(ctx, r.key, strconv.FormatUint(r.after+1, 10)+"-0", "+", readBatch).Result()
	if err != nil {
		release()
		return store.Batch{}, unavailable("reading events", err)
	}
	var out []*retrydv1.Event
	for _, m := range msgs {
		evs, err := decodeEvents(m, r.after)
		if err != nil {
			release()
			return store.Batch{}, err
		}
		for _, ev := range evs {
			r.after = ev.GetSequence()
			if r.session == "" || ev.GetSessionId() == r.session {
				out = append(out, ev)
			}
		}
	}
	return store.Batch{Events: out, More: len(msgs) == readBatch, Wake: notified, Recheck: recheckInterval,
		Release: release}, nil
}

// Held implements store.EventReader: one stream is read in order.
func (*streamReader) Held() bool { return false }
