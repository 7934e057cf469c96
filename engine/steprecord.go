package engine

import (
	"crypto/sha256"
	"sync"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// A step has at most two step records, and so at most one decision that
// can schedule a retry:
//
//   - the first report of the step opens its record, whatever its mode
//     and downstream phase;
//   - in always mode, a first report answered downstream_first (the
//     handshake is open) is followed by one report with downstream
//     DECLINED or HANDLED, which opens the step's second record;
//   - any other report of the step is answered from a record that has the
//     same meaning (the recorded answer) or refused: STEP_RECORD_CONFLICT,
//     or DELEGATION_CANCELLED for a follow-up whose handshake was
//     cancelled.
//
// "The same meaning" is sameReport's fingerprint: defaults resolved, the
// policy by its canonical key, and the downstream phase only where it
// decides anything (always mode). So in normal and schedule modes a
// report of an answered step with another phase gets the recorded
// answer; it cannot open a second record and schedule a second retry.

// reportDomain starts every encoding that reportFingerprint hashes, so
// that it never equals a request's own encoding (encodingFingerprint).
const reportDomain = "retryd.v1 FailedStep report by meaning\x00"

// reportFingerprint is the SHA-256 of what a report means, the step
// record's fingerprint: two reports that the engine must answer alike
// have the same one. Every field of FailedStepRequest and its Failure
// is encoded, always and in a fixed order (so the encoding is
// unambiguous), with
//   - the policy as the canonical key of the policy that decides (p),
//     however the request named it (inline, by name, or the server's
//     default), and none when no provider was named (nothing decides);
//   - downstream resolved (unset is NOT_ASKED) in always mode, and left
//     out in every other mode, where it decides nothing;
//   - replay resolved (unset is SAFE).
//
// Fields this version does not know are left out: they cannot change its
// answer. TestReportFingerprintCoversEveryField keeps the list complete.
func reportFingerprint(req *retrydv1.FailedStepRequest, p *policy.Policy) [sha256.Size]byte {
	buf := fingerprintBufs.Get().(*[]byte)
	defer fingerprintBufs.Put(buf)
	b := append((*buf)[:0], reportDomain...)
	b = protowire.AppendString(b, req.GetSessionId())
	b = protowire.AppendVarint(b, req.GetTurn())
	b = protowire.AppendVarint(b, req.GetStep())
	b = protowire.AppendString(b, req.GetLogicalTurnId())
	b = protowire.AppendString(b, req.GetProvider())
	b = appendPresent(b, p != nil)
	if p != nil {
		b = protowire.AppendString(b, p.Key)
	}
	fl := req.GetFailure()
	b = protowire.AppendString(b, fl.GetCode())
	b = protowire.AppendString(b, fl.GetMessage())
	b = protowire.AppendVarint(b, uint64(fl.GetHttpStatus()))
	b = appendPresent(b, fl.ProviderRetryAfterMs != nil)
	b = protowire.AppendVarint(b, uint64(fl.GetProviderRetryAfterMs()))
	b = appendPresent(b, fl.RetryAfter != nil)
	b = protowire.AppendString(b, fl.GetRetryAfter())
	b = protowire.AppendVarint(b, uint64(p.DecidingPhase(req.GetDownstream())))
	dl := req.GetDeadline()
	b = appendPresent(b, dl != nil)
	b = protowire.AppendVarint(b, uint64(dl.GetSeconds()))
	b = protowire.AppendVarint(b, uint64(dl.GetNanos()))
	b = protowire.AppendVarint(b, uint64(policy.ReplayOf(req.GetReplay())))
	*buf = b
	return sha256.Sum256(b)
}

func appendPresent(b []byte, present bool) []byte {
	return protowire.AppendVarint(b, protowire.EncodeBool(present))
}

// fingerprintBufs are encoding buffers for the fingerprints.
var fingerprintBufs = sync.Pool{New: func() any { return new([]byte) }}

// encodingFingerprint is the SHA-256 of a report's deterministic
// encoding: the fingerprint step records had before they were compared by
// meaning, which a store may still hold. A record that has it answers a
// report with exactly those bytes. It is encoded by the generated encoder
// (see server/codec.go), whose bytes are protobuf-go's deterministic ones
// for retryd's messages, which have no maps
// (TestEncodingFingerprintIsTheDeterministicEncodings).
func encodingFingerprint(req *retrydv1.FailedStepRequest) [sha256.Size]byte {
	buf := fingerprintBufs.Get().(*[]byte)
	defer fingerprintBufs.Put(buf)
	size := req.SizeVT()
	if cap(*buf) < size {
		*buf = make([]byte, size)
	}
	b := (*buf)[:size]
	if n, err := req.MarshalToSizedBufferVT(b); err != nil || n != size {
		// A validated request always encodes; fall back to the text form.
		b = append((*buf)[:0], req.String()...)
		*buf = b
	}
	return sha256.Sum256(b)
}

// recorded returns the latest position's record of a report with
// fingerprint fp, or nil. A record stored with the report's encoding
// fingerprint (by an earlier version) matches a byte-identical report.
func (s *Session) recorded(fp [sha256.Size]byte, req *retrydv1.FailedStepRequest) *stepRecord {
	for i := range s.records {
		if s.records[i].fingerprint == fp {
			return &s.records[i]
		}
	}
	enc := encodingFingerprint(req)
	for i := range s.records {
		if s.records[i].fingerprint == enc {
			return &s.records[i]
		}
	}
	return nil
}

// openRecord says whether a report of the latest position, with downstream
// phase and no record of its meaning, may open a step record: nil if it
// may (the position has no record yet, or the report is the follow-up of
// an open always-mode handshake), else the refusal.
func (s *Session) openRecord(pos position, phase retrydv1.Downstream) *Error {
	if len(s.records) == 0 {
		return nil
	}
	if phase == retrydv1.Downstream_DOWNSTREAM_DECLINED || phase == retrydv1.Downstream_DOWNSTREAM_HANDLED {
		switch {
		case s.delegation != nil && *s.delegation == pos:
			return nil
		case s.cancelled != nil && *s.cancelled == pos:
			return errorf(KindClosed, "the open delegation of turn %d step %d was cancelled", pos.turn, pos.step)
		}
		return errorf(KindConflict,
			"turn %d step %d was already answered and has no open downstream handshake: "+
				"a report with downstream %s is a different report of an answered step", pos.turn, pos.step, phase)
	}
	return errorf(KindConflict, "turn %d step %d was already reported with different content", pos.turn, pos.step)
}

// stepRecord is the answer to one report of the session's latest step,
// kept so that a report that means the same gets the same answer (see
// steprecord.go for which reports open a record). It keeps the
// decision's event (the log's own record, numbered once the store appends
// it) and not the response: a FailedStepResponse is that event plus a
// decision whose every field is also in the event, so responseOf rebuilds
// it, and an idle session does not hold a second copy of its decision.
//
// Once committed, a record of a scheduled decision drops even the event:
// the event is the session's id, its time, its sequence and the retry's
// RetryScheduled (which the retry can build again), so the record keeps
// the retry, the time and the sequence and rebuilds an equal event when it
// is asked (compact). Every pending chain has such a record, so this is
// what a million pending chains do not hold: an event, its oneof, its
// timestamp and the RetryScheduled with its due time.
type stepRecord struct {
	fingerprint [sha256.Size]byte
	phase       retrydv1.Downstream
	// event is the decision's event, nil once compact.
	event *retrydv1.Event
	// response is set only for a restored record whose stored response is
	// not the one responseOf builds; it is answered as stored.
	response *retrydv1.FailedStepResponse
	// retry is the retry a decision of this process scheduled (nil for a
	// delegation and for a restored record). A compact record's event is
	// the retry's: its sequence (Retry.seq) and time (the due time less
	// the delay).
	retry *Retry
}

// Response is the recorded answer.
func (r *stepRecord) Response(sessionID string) *retrydv1.FailedStepResponse {
	if r.response != nil {
		return r.response
	}
	return responseOf(r.eventOf(sessionID))
}

// eventOf returns the record's event, rebuilt when the record is compact.
func (r *stepRecord) eventOf(sessionID string) *retrydv1.Event {
	if r.event != nil {
		return r.event
	}
	x := new(struct { // the event, its oneof, its time and the record: one allocation
		ev   retrydv1.Event
		kind retrydv1.Event_Scheduled
		time timestamppb.Timestamp
		sb   scheduledBlock
		max  uint32
	})
	rt := r.retry
	at := rt.due - int64(rt.delayMs)*int64(time.Millisecond)
	x.time.Seconds, x.time.Nanos = at/1e9, int32(at%1e9)
	x.kind.Scheduled = rt.scheduledIn(&x.sb, &x.max)
	x.ev.Sequence, x.ev.SessionId, x.ev.Time, x.ev.Kind = rt.seq, sessionID, &x.time, &x.kind
	return &x.ev
}

// compact drops the event of a committed record of a decision that
// scheduled a retry (see stepRecord). Only a record this process made
// compacts: it knows its event is what eventOf rebuilds. A restored one
// keeps its event as stored.
func (r *stepRecord) compact() {
	if r.event == nil || r.retry == nil || r.retry.stored != nil {
		return
	}
	r.retry.seq = r.event.GetSequence()
	r.event = nil
}
