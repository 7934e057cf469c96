package engine

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Longer runs of TestRandomSessionsKeepTheInvariants, e.g.
//
//	go test -run RandomSessions ./engine/ -args -random.seeds=2000 -random.ops=500
var (
	randomSeeds = flag.Int("random.seeds", 0, "seeds of TestRandomSessionsKeepTheInvariants; 0: the default")
	randomOps   = flag.Int("random.ops", 0, "operations per seed of TestRandomSessionsKeepTheInvariants; 0: the default")
)

// TestRandomSessionsKeepTheInvariants is a property test of the engine:
// random sequences of failed-step reports, starts, cancellations (of the
// pending retry, of a whole session), successes, restores from a
// snapshot and reverted transitions, over three sessions whose reports
// use every mode, every downstream phase and replay value, set and
// unset, and several spellings of each policy. Each seed draws its own
// sequence from a fixed PCG stream, so a failure names the seed and the
// operation that reproduce it.
//
// After every operation, the events it logged must pass the invariant
// checker (the one `retryd verify` runs): whatever the engine accepts
// schedules at most one retry per step. A refused operation logs nothing,
// and a report that means the same as one already answered for the
// session's latest step (the test's own reading of "the same meaning":
// the fields that decide, defaults resolved, the policy by its key,
// downstream only in always mode) gets that answer again and logs nothing.
func TestRandomSessionsKeepTheInvariants(t *testing.T) {
	t.Parallel()
	seeds, ops := 150, 300
	if testing.Short() {
		seeds = 50
	}
	if *randomSeeds > 0 {
		seeds = *randomSeeds
	}
	if *randomOps > 0 {
		ops = *randomOps
	}
	policies := spelledPolicies(t)
	for seed := range uint64(seeds) {
		if !runRandomSessions(t, seed, ops, policies) {
			return // the first failing seed is enough to read
		}
	}
}

// spelled is one policy, resolved, with equivalent ways a report can name
// it: inline protos that resolve to the same canonical key, a policy name,
// or nothing (the server's default for the provider).
type spelled struct {
	policy    *policy.Policy
	spellings []*retrydv1.FailedStepRequest // only PolicySource is set
}

func spelledPolicies(t *testing.T) []spelled {
	inline := func(p *retrydv1.RetryPolicy) *retrydv1.FailedStepRequest {
		return &retrydv1.FailedStepRequest{PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: p}}
	}
	named := func(name string) *retrydv1.FailedStepRequest {
		return &retrydv1.FailedStepRequest{PolicySource: &retrydv1.FailedStepRequest_PolicyName{PolicyName: name}}
	}
	backoff := func(explicit bool) *retrydv1.Backoff {
		b := &retrydv1.Backoff{InitialDelayMs: proto.Uint64(2), MaxDelayMs: proto.Uint64(8), JitterRatio: proto.Float64(0)}
		if explicit {
			b.Multiplier, b.Jitter = proto.Float64(2), retrydv1.Jitter_JITTER_SYMMETRIC
		}
		return b
	}
	groups := [][]*retrydv1.RetryPolicy{
		{ // normal, two retries
			{MaxRetries: proto.Uint32(2), Backoff: backoff(false)},
			{Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(2), Backoff: backoff(true),
				RetryableCodes: []string{"TRANSPORT", "TIMEOUT", "SERVER", "RATE_LIMIT", "EMPTY_RESPONSE"},
				MinAttemptMs:   proto.Uint64(100)},
		},
		{ // schedule, three retries
			{Mode: retrydv1.Mode_MODE_SCHEDULE, MaxRetries: proto.Uint32(3), Schedule: []uint64{1, 2}},
			{Mode: retrydv1.Mode_MODE_SCHEDULE, MaxRetries: proto.Uint32(3), Schedule: []uint64{1, 2},
				RetryAfterOverCap: retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_LOCAL},
		},
		{ // always, unlimited
			{Mode: retrydv1.Mode_MODE_ALWAYS, Backoff: backoff(false)},
			{Mode: retrydv1.Mode_MODE_ALWAYS, Backoff: backoff(true), MinAttemptMs: proto.Uint64(100)},
		},
	}
	var out []spelled
	for i, g := range groups {
		sp := spelled{policy: resolve(t, g[0])}
		for _, p := range g {
			if k := resolve(t, p).Key; k != sp.policy.Key {
				t.Fatalf("policy group %d: spellings resolve to %q and %q", i, sp.policy.Key, k)
			}
			sp.spellings = append(sp.spellings, inline(p))
		}
		sp.spellings = append(sp.spellings, named(fmt.Sprintf("policy-%d", i)))
		if i == 0 { // the server's default for every provider
			sp.spellings = append(sp.spellings, &retrydv1.FailedStepRequest{})
		}
		out = append(out, sp)
	}
	return out
}

// meaning is the test's own reading of what a report means: two reports
// with the same meaning must get the same answer.
type meaning struct {
	turn, step       uint64
	provider, policy string
	code             string
	downstream       retrydv1.Downstream
	replay           retrydv1.Replay
	deadline         int64
}

func meaningOf(req *retrydv1.FailedStepRequest, p *policy.Policy) meaning {
	m := meaning{turn: req.GetTurn(), step: req.GetStep(), provider: req.GetProvider(), code: req.GetFailure().GetCode(),
		replay: req.GetReplay(), deadline: -1}
	if m.replay == retrydv1.Replay_REPLAY_UNSPECIFIED {
		m.replay = retrydv1.Replay_REPLAY_SAFE
	}
	if p != nil {
		m.policy = p.Key
		if p.Mode == retrydv1.Mode_MODE_ALWAYS {
			m.downstream = req.GetDownstream()
			if m.downstream == retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED {
				m.downstream = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
			}
		}
	}
	if d := req.GetDeadline(); d != nil {
		m.deadline = d.AsTime().UnixNano()
	}
	return m
}

// randomSession is one session of a random run, with the test's model of
// its latest step's answers.
type randomSession struct {
	s       *Session
	home    int // the policy most of its reports use
	latest  position
	seen    bool
	answers map[meaning]*retrydv1.FailedStepResponse
	reports []report // reports of the latest step, to send again
}

type report struct {
	req *retrydv1.FailedStepRequest
	p   int // index into the policies, -1 for none
}

// runRandomSessions plays one seed; it reports false once the test failed.
func runRandomSessions(t *testing.T, seed uint64, ops int, policies []spelled) bool {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	checker := invariant.New()
	var seq uint64
	tick := 0
	var trail []operation // what ran, for the failure message
	failf := func(format string, args ...any) bool {
		t.Errorf("seed %d, operation %d: %s\nthe operations so far:%s",
			seed, len(trail), fmt.Sprintf(format, args...), operations(trail))
		return false
	}
	sessions := make([]*randomSession, 3)
	for i := range sessions {
		sessions[i] = &randomSession{s: NewSession(fmt.Sprintf("s%d", i), base), home: rng.IntN(len(policies)),
			answers: map[meaning]*retrydv1.FailedStepResponse{}}
	}
	// logged numbers and checks the events of an accepted transition.
	logged := func(rs *randomSession, evs []*retrydv1.Event) bool {
		for _, ev := range evs {
			seq++
			ev.Sequence = seq
			if vs := checker.Add(ev); len(vs) > 0 {
				return failf("the engine accepted what the invariant checker refuses: %v\nevent: %v", vs, ev)
			}
		}
		rs.s.Commit()
		return true
	}
	advance := func(rs *randomSession, pos position) {
		if !rs.seen || rs.latest.less(pos) {
			rs.latest, rs.seen = pos, true
			clear(rs.answers)
			rs.reports = rs.reports[:0]
		}
	}
	for range ops {
		tick++
		e := Env{Now: base.Add(time.Duration(tick) * time.Second), Rand: fixedRand(rng.Float64()), NewID: newIDs(tick)}
		rs := sessions[rng.IntN(len(sessions))]
		switch op := rng.IntN(100); {
		case op < 60: // a report; some of them reverted
			rep := randomReport(rng, rs, policies)
			var p *policy.Policy
			if rep.p >= 0 {
				p = policies[rep.p].policy
			}
			req := rep.req
			trail = append(trail, operation{session: rs.s.ID, what: "Fail", req: req})
			if op >= 55 {
				cp := rs.s.Checkpoint()
				rs.s.Fail(e, Failure{Request: req, Policy: p})
				rs.s.Revert(cp)
				trail[len(trail)-1].what = "Fail (reverted)"
				continue
			}
			m := meaningOf(req, p)
			want, answered := rs.answers[m]
			if pos := (position{req.GetTurn(), req.GetStep()}); !rs.seen || pos != rs.latest {
				answered = false
			}
			out, err := rs.s.Fail(e, Failure{Request: req, Policy: p})
			switch {
			case err != nil && len(out.Events) > 0:
				return failf("a refused report logged %d events: %v", len(out.Events), err)
			case err != nil && answered:
				return failf("a report that means the same as an answered one was refused: %v", err)
			case err != nil:
				trail[len(trail)-1].err = err
				continue
			case answered && (len(out.Events) > 0 || !proto.Equal(out.Response, want)):
				return failf("a report that means the same as an answered one got\n%v\nwith %d events, want the recorded\n%v",
					out.Response, len(out.Events), want)
			case !answered && len(out.Events) == 0:
				return failf("a report that means something new was answered from a record: %v", out.Response)
			}
			if !logged(rs, out.Events) {
				return false
			}
			trail[len(trail)-1].resp = out.Response
			advance(rs, position{req.GetTurn(), req.GetStep()})
			rs.answers[m] = out.Response
			rs.reports = append(rs.reports, rep)
		case op < 75:
			if r := rs.s.Pending(); r != nil {
				trail = append(trail, operation{session: rs.s.ID, what: "Start " + r.ID})
				ev := rs.s.Start(e, r, nil).Event
				if ev == nil {
					return failf("the pending retry %s did not start", r.ID)
				}
				if !logged(rs, []*retrydv1.Event{ev}) {
					return false
				}
			}
		case op < 82:
			if r := rs.s.Pending(); r != nil {
				trail = append(trail, operation{session: rs.s.ID, what: "Cancel " + r.ID})
				if !logged(rs, rs.s.Cancel(e, r, retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil).Events) {
					return false
				}
			}
		case op < 86:
			trail = append(trail, operation{session: rs.s.ID, what: "CancelAll"})
			ca := rs.s.CancelAll(e, nil)
			_, _, evs := ca.States, ca.Delegation, ca.Events
			if !logged(rs, evs) {
				return false
			}
		case op < 94:
			pos := randomPosition(rng, rs)
			trail = append(trail, operation{session: rs.s.ID, what: "Succeed", pos: pos})
			_, evs, err := rs.s.Succeed(e, pos.turn, pos.step)
			if err != nil {
				trail[len(trail)-1].err = err
				if len(evs) > 0 {
					return failf("a refused success logged %d events: %v", len(evs), err)
				}
				continue
			}
			if !logged(rs, evs) {
				return false
			}
			advance(rs, pos)
		default:
			trail = append(trail, operation{session: rs.s.ID, what: "restored from its snapshot"})
			rs.s = roundTrip(t, rs.s)
		}
	}
	return true
}

// newIDs returns an id source whose ids no other tick repeats.
func newIDs(tick int) func() string {
	n := 0
	return func() string {
		n++
		return fmt.Sprintf("r%d-%d", tick, n)
	}
}

// operation is one step of a random run, kept to be printed if it fails.
type operation struct {
	session, what string
	pos           position                     // of a success
	req           *retrydv1.FailedStepRequest  // of a report
	resp          *retrydv1.FailedStepResponse // its answer
	err           error                        // or its refusal
}

func operations(ops []operation) string {
	var b strings.Builder
	for _, op := range ops {
		fmt.Fprintf(&b, "\n  %s %s", op.session, op.what)
		switch {
		case op.req != nil:
			fmt.Fprintf(&b, " %v", op.req)
		case op.what == "Succeed":
			fmt.Fprintf(&b, " %d/%d", op.pos.turn, op.pos.step)
		}
		switch {
		case op.err != nil:
			fmt.Fprintf(&b, " → %v", op.err)
		case op.resp != nil:
			b.WriteString(" → " + decisionOf(op.resp))
		}
	}
	return b.String()
}

func decisionOf(resp *retrydv1.FailedStepResponse) string {
	if s := resp.GetDecision().GetSchedule(); s != nil {
		return fmt.Sprintf("schedule %s (%d)", s.GetRetryId(), s.GetRetryNumber())
	}
	return "delegate " + resp.GetDecision().GetDelegate().GetReason().String()
}

// randomPosition draws the position of a report or success: mostly the
// latest step, else the next step or turn, now and then an older one.
func randomPosition(rng *rand.Rand, rs *randomSession) position {
	if !rs.seen {
		return position{1, 1}
	}
	l := rs.latest
	switch n := rng.IntN(100); {
	case n < 45:
		return l
	case n < 80:
		return position{l.turn, l.step + 1}
	case n < 90:
		return position{l.turn + 1, 1}
	case l.step > 1:
		return position{l.turn, l.step - 1}
	default:
		return position{l.turn - 1, l.step + 3}
	}
}

// randomReport draws a report: often the session's earlier report of its
// latest step sent again, as it was, spelled another way, or with another
// downstream phase or code; else a new report of a random position.
func randomReport(rng *rand.Rand, rs *randomSession, policies []spelled) report {
	if len(rs.reports) > 0 && rng.IntN(100) < 45 {
		prev := rs.reports[rng.IntN(len(rs.reports))]
		rep := report{req: proto.Clone(prev.req).(*retrydv1.FailedStepRequest), p: prev.p}
		switch rng.IntN(4) {
		case 0: // as it was
		case 1:
			respell(rng, rep, policies)
		case 2:
			rep.req.Downstream = randomDownstream(rng)
		default:
			rep.req.Failure.Code = randomCode(rng)
		}
		return rep
	}
	pos := randomPosition(rng, rs)
	rep := report{req: &retrydv1.FailedStepRequest{SessionId: rs.s.ID, Turn: pos.turn, Step: pos.step,
		Provider: "p", Failure: &retrydv1.Failure{Code: randomCode(rng), HttpStatus: 500}}, p: rs.home}
	switch n := rng.IntN(100); {
	case n < 15:
		rep.req.Provider = "q"
	case n < 20:
		rep.req.Provider, rep.p = "", -1 // nothing decides: no provider
	}
	if rep.p >= 0 && rng.IntN(100) < 25 {
		rep.p = rng.IntN(len(policies))
	}
	rep.req.Downstream = randomDownstream(rng)
	switch n := rng.IntN(100); {
	case n < 40:
		rep.req.Replay = retrydv1.Replay_REPLAY_SAFE
	case n < 45:
		rep.req.Replay = retrydv1.Replay_REPLAY_UNSAFE
	}
	if rng.IntN(100) < 5 {
		rep.req.Deadline = timestamppb.New(base.Add(time.Duration(rng.IntN(3600)) * time.Second))
	}
	respell(rng, rep, policies)
	return rep
}

// respell changes how a report says what it means: its policy's spelling,
// and downstream and replay between unset and their explicit defaults.
func respell(rng *rand.Rand, rep report, policies []spelled) {
	req := rep.req
	req.PolicySource = nil
	if rep.p >= 0 {
		sp := policies[rep.p].spellings
		req.PolicySource = proto.Clone(sp[rng.IntN(len(sp))]).(*retrydv1.FailedStepRequest).PolicySource
	}
	switch req.GetDownstream() {
	case retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED:
		req.Downstream = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
	case retrydv1.Downstream_DOWNSTREAM_NOT_ASKED:
		req.Downstream = retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED
	}
	switch req.GetReplay() {
	case retrydv1.Replay_REPLAY_UNSPECIFIED:
		req.Replay = retrydv1.Replay_REPLAY_SAFE
	case retrydv1.Replay_REPLAY_SAFE:
		req.Replay = retrydv1.Replay_REPLAY_UNSPECIFIED
	}
}

func randomDownstream(rng *rand.Rand) retrydv1.Downstream {
	return retrydv1.Downstream(rng.IntN(4)) // unset, not asked, declined, handled
}

func randomCode(rng *rand.Rand) string {
	switch n := rng.IntN(100); {
	case n < 60:
		return "SERVER"
	case n < 75:
		return "RATE_LIMIT"
	case n < 90:
		return "AUTH" // retried in always mode only
	default:
		return "ABORTED"
	}
}
