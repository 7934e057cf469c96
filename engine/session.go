package engine

import (
	"cmp"
	"slices"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ChainKey identifies a retry chain within a session.
type ChainKey struct {
	Provider  string
	PolicyKey string
}

// Chain is the retry history of one (session, provider, policy key).
type Chain struct {
	Key     ChainKey
	Mode    retrydv1.Mode
	Max     *uint32
	Retries uint32
	Open    bool
	Latest  *Retry
	// updated is when a transition last changed it, in Unix nanoseconds.
	updated int64
	// attempts are the W3C traceparents of the chain's failed attempts,
	// oldest first, at most MaxChainAttempts; nil when there are none.
	// The slice is never modified in place (a new attempt replaces it), so
	// a Checkpoint shares it, and a chain costs one pointer, not a slice
	// header, for it.
	attempts *[]string
}

// attemptList returns the chain's attempt traceparents, oldest first;
// callers must not modify the slice.
func (c *Chain) attemptList() []string {
	if c.attempts == nil {
		return nil
	}
	return *c.attempts
}

type position struct{ turn, step uint64 }

func (p position) less(q position) bool {
	return p.turn < q.turn || p.turn == q.turn && p.step < q.step
}

// Session is one agent session's retry state.
type Session struct {
	ID string
	// updated is when a transition last changed it, in Unix nanoseconds
	// (see Updated).
	updated int64

	latest     position
	seen       bool
	records    []stepRecord // for the latest position only, by phase
	chains     []*Chain     // by key (chainOrder); most sessions have one
	pending    *Retry
	delegation *position // always mode: a downstream_first answer awaiting its follow-up
	cancelled  *position // a delegation cancelled at this position
	retries    []*Retry  // oldest first, at most MaxRetainedRetries
	// settled are the retries terminal since the last Commit, not yet
	// released (see Settled). A session has one pending retry, so a commit
	// almost always releases at most one: it is kept in settledOne, in the
	// session itself (it fits in Session's size class, and in
	// sessionBlock's). When a second settles before the Commit, they all
	// move to settledMore, made then and reused (a pointer: most sessions
	// never need it).
	settledOne  [1]*Retry
	settledMore *[]*Retry
}

// sessionBlock is a new session with room for the step record of its
// first failure. In a storm of first failures every FailedStep makes a
// session, and the block is one allocation instead of two for the same
// bytes: it fills the 224-byte size class that the session and the
// records slice's first element took together. The records slice starts
// with a capacity of one in the block, so a second record grows it as
// append would have, leaving the block's element unused while the session
// lives.
type sessionBlock struct {
	session Session
	records [1]stepRecord
}

// chainBlock is a session's first chain with room for the first element of
// its chains and retries slices, like sessionBlock (one allocation instead
// of three, in the 96-byte size class the three took together). It is not
// part of sessionBlock because a first failure that is delegated makes no
// chain: that block would then be in the 320-byte class for nothing.
type chainBlock struct {
	chain   Chain
	chains  [1]*Chain
	retries [1]*Retry
}

// NewSession returns an empty session.
func NewSession(id string, now time.Time) *Session {
	b := &sessionBlock{session: Session{ID: id, updated: unixNano(now)}}
	b.session.records = b.records[:0]
	return &b.session
}

// Updated is when a transition last changed the session.
func (s *Session) Updated() time.Time { return fromUnixNano(s.updated) }

// unixNano and fromUnixNano store a time as Unix nanoseconds, the zero
// time as 0 (a restored session without a time has the zero time).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func chainOrder(c *Chain, k ChainKey) int {
	return cmp.Or(cmp.Compare(c.Key.Provider, k.Provider), cmp.Compare(c.Key.PolicyKey, k.PolicyKey))
}

// chain returns the session's chain with key k, or nil.
func (s *Session) chain(k ChainKey) *Chain {
	if i, ok := slices.BinarySearchFunc(s.chains, k, chainOrder); ok {
		return s.chains[i]
	}
	return nil
}

// addChain adds a new chain with key k, which the session does not have
// yet, and returns it for the caller to fill in. The session's first
// chain comes in a chainBlock, a new one each time, so that a chain a
// Revert undid is never used again (its retry may still point to it).
func (s *Session) addChain(k ChainKey) *Chain {
	if len(s.chains) == 0 {
		b := &chainBlock{chain: Chain{Key: k}}
		b.chains[0] = &b.chain
		s.chains = b.chains[:]
		if cap(s.retries) == 0 { // a chain's retries come after it
			s.retries = b.retries[:0]
		}
		return &b.chain
	}
	c := &Chain{Key: k}
	i, _ := slices.BinarySearchFunc(s.chains, k, chainOrder)
	s.chains = slices.Insert(s.chains, i, c)
	return c
}

// record returns the latest position's record of phase, or nil.
func (s *Session) record(phase retrydv1.Downstream) *stepRecord {
	for i := range s.records {
		if s.records[i].phase == phase {
			return &s.records[i]
		}
	}
	return nil
}

// setRecord records the answer of a phase not recorded yet, keeping the
// records in phase order.
func (s *Session) setRecord(rec stepRecord) {
	i := 0
	for i < len(s.records) && s.records[i].phase < rec.phase {
		i++
	}
	s.records = slices.Insert(s.records, i, rec)
}

// clearRecords forgets the records of an older position, keeping their
// storage for the next ones.
func (s *Session) clearRecords() {
	clear(s.records)
	s.records = s.records[:0]
}

// settle notes that r became terminal (see Settled).
func (s *Session) settle(r *Retry) {
	more := s.settledMore
	if s.settledOne[0] == nil && (more == nil || len(*more) == 0) {
		s.settledOne[0] = r
		return
	}
	if more == nil {
		more = new([]*Retry)
		s.settledMore = more
	}
	if first := s.settledOne[0]; first != nil {
		*more = append(*more, first)
		s.settledOne[0] = nil
	}
	*more = append(*more, r)
}

// Pending returns the session's scheduled retry that has not yet started or
// been cancelled, or nil.
func (s *Session) Pending() *Retry { return s.pending }

// Retry returns a retained retry by id, or nil.
func (s *Session) Retry(id string) *Retry {
	for _, r := range s.retries {
		if r.ID == id {
			return r
		}
	}
	return nil
}

// event stamps a new log record of the session with ts set to now (ts is
// allocated with the event); the store assigns its sequence when it
// appends it.
func (s *Session) event(env Env, ev *retrydv1.Event, ts *timestamppb.Timestamp) *retrydv1.Event {
	ts.Seconds, ts.Nanos = env.Now.Unix(), int32(env.Now.Nanosecond())
	ev.SessionId = s.ID
	ev.Time = ts
	return ev
}

func (s *Session) closeChain(env Env, c *Chain, reason retrydv1.CloseReason) *retrydv1.Event {
	c.Open = false
	c.updated = env.Now.UnixNano()
	x := new(struct { // the event, its oneof, the record and the time: one allocation
		ev     retrydv1.Event
		kind   retrydv1.Event_Closed
		closed retrydv1.ChainClosed
		time   timestamppb.Timestamp
	})
	x.closed.Provider, x.closed.PolicyKey, x.closed.Reason, x.closed.Retries = c.Key.Provider, c.Key.PolicyKey, reason, c.Retries
	x.kind.Closed = &x.closed
	x.ev.Kind = &x.kind
	return s.event(env, &x.ev, &x.time)
}

// sortedChains returns the session's chains in key order; callers must not
// modify the slice.
func (s *Session) sortedChains() []*Chain { return s.chains }

// Chains snapshots the session for GetChains.
func (s *Session) Chains() *retrydv1.GetChainsResponse {
	resp := &retrydv1.GetChainsResponse{Turn: s.latest.turn, Step: s.latest.step}
	for _, c := range s.sortedChains() {
		pc := &retrydv1.Chain{
			Provider: c.Key.Provider, PolicyKey: c.Key.PolicyKey, Mode: c.Mode,
			Retries: c.Retries, MaxRetries: c.Max, Open: c.Open, UpdatedAt: timestamppb.New(fromUnixNano(c.updated)),
		}
		if c.Latest != nil {
			pc.Latest = c.Latest.State()
		}
		resp.Chains = append(resp.Chains, pc)
	}
	return resp
}

// Expire closes the session's open chains (reason expired) before the
// store forgets the session, so the log shows why numbering restarts.
func (s *Session) Expire(env Env) []*retrydv1.Event {
	var evs []*retrydv1.Event
	for _, c := range s.sortedChains() {
		if c.Open {
			evs = append(evs, s.closeChain(env, c, retrydv1.CloseReason_CLOSE_REASON_EXPIRED))
		}
	}
	return evs
}

// OpenChains counts the session's open chains.
func (s *Session) OpenChains() int {
	n := 0
	for _, c := range s.chains {
		if c.Open {
			n++
		}
	}
	return n
}

// Retries returns the retained retries, oldest first.
func (s *Session) Retries() []*Retry { return s.retries }

// Settled returns the retries that became terminal since the last Commit
// or Revert, for the store to release their awaiters once the transitions
// are durable (at once when it keeps nothing), so that no agent hears of a
// start or cancellation that a crash could undo. The slice is valid until
// the next Commit.
func (s *Session) Settled() []*Retry {
	if s.settledOne[0] != nil {
		return s.settledOne[:]
	}
	if s.settledMore == nil {
		return nil
	}
	return *s.settledMore
}

// Commit ends the transitions since the last Commit or Revert: Settled is
// empty again, and the step records of scheduled decisions are compacted
// (see stepRecord): once committed, their events carry their final
// sequence.
func (s *Session) Commit() {
	for i := range s.records {
		s.records[i].compact()
	}
	s.settledOne[0] = nil
	if s.settledMore == nil {
		return
	}
	settled := *s.settledMore
	clear(settled)
	*s.settledMore = settled[:0]
}
