package redis

import (
	"fmt"

	"github.com/retryd/retryd/engine"
	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Snapshot codec. A session is stored as its engine snapshot
// (retryd.state.v1.Session); events are in events.go.

// damaged is the error of a session whose stored data does not decode: the
// one failure that trying again cannot mend (see postpone).
type damaged struct{ err error }

func (d damaged) Error() string { return d.err.Error() }
func (d damaged) Unwrap() error { return d.err }

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
		l.damaged = damaged{fmt.Errorf("redis store: session %q is damaged: %w", id, err)}
		return l
	}
	sess, err := engine.RestoreSession(snap)
	if err != nil {
		l.damaged = damaged{fmt.Errorf("redis store: %w", err)}
		return l
	}
	for _, r := range sess.Retries() {
		r.Awaiters = int(l.awaiters[r.ID])
	}
	l.sess = sess
	return l
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
