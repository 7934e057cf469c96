package engine

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"slices"
	"time"

	statev1 "github.com/retryd/retryd/gen/retryd/state/v1"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Snapshot returns the session's whole state in the storage schema, for a
// durable store to write. It shares the session's immutable records (a
// restored retry's messages, the failure, the policy, stored responses),
// so marshal it before the session changes again. Connected awaiters are
// runtime state and are not part of it.
func (s *Session) Snapshot() *statev1.Session {
	out := s.SnapshotWithoutRetries()
	for _, r := range s.retries {
		out.Retries = append(out.Retries, r.Snapshot())
	}
	return out
}

// SnapshotWithoutRetries is Snapshot with Retries left empty, for a store
// that encodes each retained retry itself (Retries, Retry.Snapshot), in
// order, after the rest: retries is the highest-numbered field but
// revision, so those bytes are the whole Snapshot's.
func (s *Session) SnapshotWithoutRetries() *statev1.Session {
	out := &statev1.Session{Id: s.ID, UpdatedAt: timestamp(s.Updated())}
	if s.seen {
		out.Latest = &statev1.Position{Turn: s.latest.turn, Step: s.latest.step}
	}
	for i := range s.records { // in phase order
		rec := &s.records[i]
		out.Records = append(out.Records, &statev1.StepRecord{
			Phase: rec.phase, Fingerprint: bytes.Clone(rec.fingerprint[:]), Response: rec.Response(s.ID),
		})
	}
	retained := make(map[*Retry]bool, len(s.retries))
	for _, r := range s.retries {
		retained[r] = true
	}
	for _, c := range s.sortedChains() {
		pc := &statev1.Chain{
			Key:       &statev1.ChainKey{Provider: c.Key.Provider, PolicyKey: c.Key.PolicyKey},
			Mode:      c.Mode,
			Retries:   c.Retries,
			Open:      c.Open,
			UpdatedAt: timestamp(fromUnixNano(c.updated)),
			Attempts:  slices.Clone(c.attemptList()),
		}
		if c.Max != nil {
			pc.MaxRetries = proto.Uint32(*c.Max)
		}
		if c.Latest != nil {
			pc.LatestRetryId = c.Latest.ID
			if !retained[c.Latest] {
				pc.LatestUnretained = c.Latest.Snapshot()
			}
		}
		out.Chains = append(out.Chains, pc)
	}
	if s.pending != nil {
		out.PendingRetryId = s.pending.ID
	}
	if d := s.delegation; d != nil {
		out.Delegation = &statev1.Position{Turn: d.turn, Step: d.step}
	}
	if c := s.cancelled; c != nil {
		out.CancelledDelegation = &statev1.Position{Turn: c.turn, Step: c.step}
	}
	return out
}

// Snapshot returns the retry in the storage schema, as Snapshot writes each
// retained one. A terminal retry's state never changes again.
func (r *Retry) Snapshot() *statev1.Retry {
	return &statev1.Retry{
		Chain:     &statev1.ChainKey{Provider: r.chain.Key.Provider, PolicyKey: r.chain.Key.PolicyKey},
		Status:    r.Status,
		Scheduled: r.Scheduled(),
		Started:   r.Started(),
		Cancelled: r.Cancelled(),
		FleetKey:  r.fleetKey,
	}
}

// timestamp maps the zero time to an absent timestamp, so that a restore
// gives back the zero time.
func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// RestoreSession rebuilds a session from its Snapshot; the session takes
// ownership of snap. A restored retry has no awaiters and nothing Settled.
// A snapshot that
// does not describe a consistent session (a pending retry that is not
// retained, a retry of an unknown chain, …) is an error: the store's data
// is damaged, and retryd must not guess.
func RestoreSession(snap *statev1.Session) (*Session, error) {
	if snap.GetId() == "" {
		return nil, fmt.Errorf("engine: restore: session without an id")
	}
	s := NewSession(snap.GetId(), timeOf(snap.GetUpdatedAt()))
	bad := func(format string, args ...any) error {
		return fmt.Errorf("engine: restore session %q: %s", s.ID, fmt.Sprintf(format, args...))
	}
	if l := snap.GetLatest(); l != nil {
		s.latest, s.seen = position{l.GetTurn(), l.GetStep()}, true
	}
	for _, rec := range snap.GetRecords() {
		if !s.seen {
			return nil, bad("a step record without a latest position")
		}
		if len(rec.GetFingerprint()) != sha256.Size {
			return nil, bad("step record fingerprint of %d bytes, want %d", len(rec.GetFingerprint()), sha256.Size)
		}
		if rec.GetResponse() == nil {
			return nil, bad("step record (downstream %s) without its response", rec.GetPhase())
		}
		if s.record(rec.GetPhase()) != nil {
			return nil, bad("two step records for downstream %s", rec.GetPhase())
		}
		r := stepRecord{phase: rec.GetPhase(), event: rec.GetResponse().GetEvent(), response: rec.GetResponse()}
		if r.event != nil && proto.Equal(responseOf(r.event), r.response) {
			r.response = nil // the usual record: keep the event only
		}
		copy(r.fingerprint[:], rec.GetFingerprint())
		s.setRecord(r)
	}
	latest := make(map[*Chain]*statev1.Chain, len(snap.GetChains()))
	for _, pc := range snap.GetChains() {
		if pc.GetKey() == nil {
			return nil, bad("a chain without its key")
		}
		key := ChainKey{Provider: pc.GetKey().GetProvider(), PolicyKey: pc.GetKey().GetPolicyKey()}
		if s.chain(key) != nil {
			return nil, bad("two chains %s / %s", key.Provider, key.PolicyKey)
		}
		c := s.addChain(key) // the first in a chainBlock, as a new session's
		c.Mode, c.Retries, c.Open = pc.GetMode(), pc.GetRetries(), pc.GetOpen()
		c.updated = unixNano(timeOf(pc.GetUpdatedAt()))
		if a := pc.GetAttempts(); len(a) > 0 {
			c.attempts = &a
		}
		if pc.MaxRetries != nil {
			c.Max = proto.Uint32(pc.GetMaxRetries())
		}
		latest[c] = pc
	}
	byID := make(map[string]*Retry, len(snap.GetRetries()))
	for _, pr := range snap.GetRetries() {
		r, err := s.restoreRetry(pr)
		if err != nil {
			return nil, err
		}
		if byID[r.ID] != nil {
			return nil, bad("two retained retries with id %s", r.ID)
		}
		byID[r.ID] = r
		s.retries = append(s.retries, r)
	}
	if len(s.retries) > MaxRetainedRetries {
		return nil, bad("%d retained retries, at most %d are kept", len(s.retries), MaxRetainedRetries)
	}
	if id := snap.GetPendingRetryId(); id != "" {
		if s.pending = byID[id]; s.pending == nil {
			return nil, bad("pending retry %s is not among the retained retries", id)
		}
	}
	for _, r := range s.retries {
		if (r.Status == retrydv1.RetryStatus_RETRY_STATUS_PENDING) != (r == s.pending) {
			return nil, bad("retry %s is %s but the session's pending retry is %q", r.ID, r.Status, snap.GetPendingRetryId())
		}
	}
	for c, pc := range latest {
		id := pc.GetLatestRetryId()
		switch {
		case id == "" && pc.GetLatestUnretained() != nil:
			return nil, bad("chain %s / %s has an unretained latest retry but no latest id", c.Key.Provider, c.Key.PolicyKey)
		case id == "":
		case pc.GetLatestUnretained() != nil:
			r, err := s.restoreRetry(pc.GetLatestUnretained())
			if err != nil {
				return nil, err
			}
			if r.ID != id || r.chain != c || r.Status == retrydv1.RetryStatus_RETRY_STATUS_PENDING || byID[id] != nil {
				return nil, bad("chain %s / %s: unretained latest retry %s does not match (id %s, %s)",
					c.Key.Provider, c.Key.PolicyKey, id, r.ID, r.Status)
			}
			c.Latest = r
		default:
			if c.Latest = byID[id]; c.Latest == nil || c.Latest.chain != c {
				return nil, bad("chain %s / %s: latest retry %s is not a retained retry of the chain", c.Key.Provider, c.Key.PolicyKey, id)
			}
		}
	}
	if d := snap.GetDelegation(); d != nil {
		s.delegation = &position{d.GetTurn(), d.GetStep()}
	}
	if c := snap.GetCancelledDelegation(); c != nil {
		s.cancelled = &position{c.GetTurn(), c.GetStep()}
	}
	return s, nil
}

func (s *Session) restoreRetry(pr *statev1.Retry) (*Retry, error) {
	sc := pr.GetScheduled()
	if sc.GetRetryId() == "" || sc.GetDueAt() == nil {
		return nil, fmt.Errorf("engine: restore session %q: a retry without its scheduled record", s.ID)
	}
	key := ChainKey{Provider: pr.GetChain().GetProvider(), PolicyKey: pr.GetChain().GetPolicyKey()}
	chain := s.chain(key)
	if chain == nil {
		return nil, fmt.Errorf("engine: restore session %q: retry %s belongs to unknown chain %s / %s",
			s.ID, sc.GetRetryId(), key.Provider, key.PolicyKey)
	}
	started, cancelled := pr.GetStarted(), pr.GetCancelled()
	r := &Retry{
		ID:          sc.GetRetryId(),
		SessionID:   s.ID,
		due:         sc.GetDueAt().AsTime().UnixNano(),
		Status:      pr.GetStatus(),
		mode:        sc.GetMode(),
		source:      sc.GetDelaySource(),
		retryNumber: sc.GetRetryNumber(),
		maxRetries:  sc.GetMaxRetries(),
		bounded:     sc.MaxRetries != nil,
		reason:      cancelled.GetReason(),
		turn:        sc.GetTurn(),
		step:        sc.GetStep(),
		delayMs:     sc.GetDelayMs(),
		failure:     sc.GetFailure(),
		policy:      sc.GetPolicy(),
		stored:      &storedRetry{sc, started, cancelled},
		fleetKey:    pr.GetFleetKey(),
		chain:       chain,
	}
	if started.GetStartedAt() != nil {
		r.startedAt = started.GetStartedAt().AsTime().UnixNano()
	}
	if lt, tp, dt := sc.GetLogicalTurnId(), sc.GetTraceparent(), sc.GetDetail(); lt != "" || tp != "" || dt != "" {
		r.text = &retryText{lt, tp, dt}
	}
	switch {
	case r.Status == retrydv1.RetryStatus_RETRY_STATUS_PENDING && started == nil && cancelled == nil:
	case r.Status == retrydv1.RetryStatus_RETRY_STATUS_STARTED && started != nil && cancelled == nil,
		r.Status == retrydv1.RetryStatus_RETRY_STATUS_CANCELLED && cancelled != nil && started == nil:
	default:
		return nil, fmt.Errorf("engine: restore session %q: retry %s has status %s with started=%t cancelled=%t",
			s.ID, r.ID, r.Status, started != nil, cancelled != nil)
	}
	return r, nil
}

// Checkpoint is a session's state at one moment, for undoing the
// transitions that follow it (Revert) when a store cannot make them
// durable. It keeps the session's own objects, so the retries and chains
// that a store, its timers and its awaiters point to stay the same objects.
type Checkpoint struct {
	session Session
	chains  []chainValue
	retries []retryValue
}

type chainValue struct {
	chain *Chain
	value Chain
}

type retryValue struct {
	retry     *Retry
	status    retrydv1.RetryStatus
	reason    retrydv1.CancelReason
	startedAt int64
}

// Checkpoint captures the session for a later Revert.
func (s *Session) Checkpoint() *Checkpoint {
	cp := &Checkpoint{session: *s}
	cp.session.records = slices.Clone(s.records)
	cp.session.chains = slices.Clone(s.chains)
	cp.session.retries = slices.Clone(s.retries)
	if s.settledMore != nil {
		settled := slices.Clone(*s.settledMore)
		cp.session.settledMore = &settled
	}
	for _, c := range s.chains {
		cp.chains = append(cp.chains, chainValue{c, *c}) // attempts are never modified in place
	}
	for _, r := range s.retries {
		cp.retries = append(cp.retries, retryValue{r, r.Status, r.reason, r.startedAt})
	}
	return cp
}

// Revert puts the session back as it was at cp, undoing every transition
// since: a retry scheduled since is forgotten, a retry started or cancelled
// since is pending again and no longer Settled (its awaiters were never
// released, as that waits for Commit). Use a checkpoint at most once, and
// only for the session that took it.
func (s *Session) Revert(cp *Checkpoint) {
	*s = cp.session
	for _, c := range cp.chains {
		*c.chain = c.value
	}
	for _, r := range cp.retries {
		r.retry.Status, r.retry.reason, r.retry.startedAt = r.status, r.reason, r.startedAt
	}
}
