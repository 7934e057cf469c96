package store

import (
	"time"

	"github.com/retryd/retryd/engine"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Tick is the timer rule: it moves the session's pending retry r on when
// its timer fires. A due retry starts when an agent awaits it (awaited),
// unless fleet protection holds it back; one nobody awaited is cancelled
// as abandoned at abandonAt (its due time plus the abandon grace, or later
// when the backend could not have let an agent attach in between). It
// returns when r next needs its timer, or the zero time once r ended.
//
// Backends call it from their timers and from the await protocol's Start,
// in a transaction of r's session.
func Tick(t Txn, r *engine.Retry, awaited bool, abandonAt time.Time) time.Time {
	sess, env := t.Session(), t.Env()
	switch {
	case env.Now.Before(r.Due()):
		if awaited {
			return r.Due()
		}
		return abandonAt
	case awaited:
		out := sess.Start(env, r, fleetOf(t, r))
		save(t, out.Fleet)
		if out.Event == nil {
			return out.HeldUntil // held by fleet protection
		}
		t.Record(out.Event)
		return time.Time{}
	case env.Now.Before(abandonAt):
		return abandonAt
	default:
		out := sess.Cancel(env, r, retrydv1.CancelReason_CANCEL_REASON_ABANDONED, fleetOf(t, r))
		t.Record(out.Events...)
		save(t, out.Fleet)
		return time.Time{}
	}
}
