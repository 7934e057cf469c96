package engine

import (
	"errors"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/proto"
)

// recorder is one session under test with every event it logged, numbered
// as a store numbers them, and checked by the invariant checker as it goes.
type recorder struct {
	t       *testing.T
	s       *Session
	checker *invariant.Checker
	seq     uint64
	i       int
	policy  *policy.Policy // the test's, for helpers that report
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{t: t, s: NewSession("s", base), checker: invariant.New()}
}

func (r *recorder) env() Env { r.i++; return env(r.i) }

// log numbers evs, commits the session and checks the events.
func (r *recorder) log(evs []*retrydv1.Event) {
	r.t.Helper()
	for _, ev := range evs {
		r.seq++
		ev.Sequence = r.seq
		for _, v := range r.checker.Add(ev) {
			r.t.Errorf("invariant: %s", v)
		}
	}
	r.s.Commit()
}

func (r *recorder) fail(req *retrydv1.FailedStepRequest, p *policy.Policy) (FailOutcome, error) {
	r.t.Helper()
	out, err := r.s.Fail(r.env(), Failure{Request: req, Policy: p})
	r.log(out.Events)
	return out, err
}

func (r *recorder) start() {
	r.t.Helper()
	ev := r.s.Start(r.env(), r.s.Pending(), nil).Event
	if ev == nil {
		r.t.Fatal("the pending retry did not start")
	}
	r.log([]*retrydv1.Event{ev})
}

func (r *recorder) cancel() {
	r.t.Helper()
	r.log(r.s.Cancel(r.env(), r.s.Pending(), retrydv1.CancelReason_CANCEL_REASON_REQUESTED, nil).Events)
}

func (r *recorder) cancelAll() {
	r.t.Helper()
	ca := r.s.CancelAll(r.env(), nil)
	_, _, evs := ca.States, ca.Delegation, ca.Events
	r.log(evs)
}

func (r *recorder) succeed(turn, step uint64) {
	r.t.Helper()
	_, evs, err := r.s.Succeed(r.env(), turn, step)
	if err != nil {
		r.t.Fatalf("Succeed: %v", err)
	}
	r.log(evs)
}

func stepReport(turn, step uint64, code string, d retrydv1.Downstream) *retrydv1.FailedStepRequest {
	return &retrydv1.FailedStepRequest{SessionId: "s", Turn: turn, Step: step, Provider: "p",
		Failure: &retrydv1.Failure{Code: code}, Downstream: d}
}

func kindOf(err error) ErrorKind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

// TestOneRetryPerStep: once a step is answered, reporting it again with
// another downstream phase does not open a second step record in normal
// and schedule modes, whatever became of the first retry: the report gets
// the recorded answer, and nothing is scheduled.
func TestOneRetryPerStep(t *testing.T) {
	t.Parallel()
	modes := map[string]*retrydv1.RetryPolicy{
		"normal": {MaxRetries: proto.Uint32(2), Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(2), MaxDelayMs: proto.Uint64(4), JitterRatio: proto.Float64(0)}},
		"schedule": {Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{2, 4}},
	}
	afters := map[string]func(r *recorder){
		"started":                    func(r *recorder) { r.start() },
		"cancelled":                  func(r *recorder) { r.cancel() },
		"cancelled with the session": func(r *recorder) { r.cancelAll() },
		"started and succeeded":      func(r *recorder) { r.start(); r.succeed(1, 1) },
		"pending":                    func(*recorder) {},
	}
	phases := []retrydv1.Downstream{
		retrydv1.Downstream_DOWNSTREAM_DECLINED, retrydv1.Downstream_DOWNSTREAM_HANDLED,
		retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED,
	}
	for mode, rp := range modes {
		for after, do := range afters {
			for _, phase := range phases {
				t.Run(mode+"/"+after+"/"+phase.String(), func(t *testing.T) {
					t.Parallel()
					p := resolve(t, rp)
					r := newRecorder(t)
					first, err := r.fail(stepReport(1, 1, "SERVER", 0), p)
					if err != nil || first.Scheduled == nil {
						t.Fatalf("first report: %v, %v; want a schedule", err, first.Response)
					}
					do(r)
					again, err := r.fail(stepReport(1, 1, "SERVER", phase), p)
					if err != nil {
						t.Fatalf("the report with downstream %s: %v, want the recorded answer", phase, err)
					}
					if len(again.Events) != 0 || again.Scheduled != nil {
						t.Errorf("the report with downstream %s changed the session: %d events, scheduled %v",
							phase, len(again.Events), again.Scheduled != nil)
					}
					if !proto.Equal(again.Response, first.Response) {
						t.Errorf("the report with downstream %s answered\n%v\nwant the recorded\n%v", phase, again.Response, first.Response)
					}
				})
			}
		}
	}
}

// TestAlwaysModeHandshakeHasOneFollowUp: always mode keeps two records of
// a step, the report that asks downstream recovery first and its one
// follow-up; a second follow-up with the other answer is a conflict, and
// so is a follow-up that was not asked for.
func TestAlwaysModeHandshakeHasOneFollowUp(t *testing.T) {
	t.Parallel()
	notAsked, declined, handled := retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, retrydv1.Downstream_DOWNSTREAM_DECLINED, retrydv1.Downstream_DOWNSTREAM_HANDLED
	delegateFirst := retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST
	type call struct {
		d        retrydv1.Downstream
		code     string
		schedule bool                    // the answer schedules a retry
		reason   retrydv1.DelegateReason // else the delegation's reason
		kind     ErrorKind               // or it is refused
		before   func(r *recorder)       // runs first
	}
	tests := []struct {
		name  string
		calls []call
	}{
		{"declined then handled", []call{
			{d: notAsked, code: "SERVER", reason: delegateFirst},
			{d: declined, code: "SERVER", schedule: true},
			{d: handled, code: "SERVER", kind: KindConflict, before: (*recorder).start},
			{d: declined, code: "SERVER", schedule: true},
			{d: notAsked, code: "SERVER", reason: delegateFirst},
		}},
		{"handled then declined", []call{
			{d: notAsked, code: "SERVER", reason: delegateFirst},
			{d: handled, code: "SERVER", reason: retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED},
			{d: declined, code: "SERVER", kind: KindConflict},
		}},
		{"handled first, then declined", []call{
			{d: handled, code: "SERVER", reason: retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_HANDLED},
			{d: declined, code: "SERVER", kind: KindConflict},
			{d: notAsked, code: "SERVER", kind: KindConflict},
		}},
		{"declined first, then handled", []call{
			{d: declined, code: "SERVER", schedule: true},
			{d: handled, code: "SERVER", kind: KindConflict, before: (*recorder).cancel},
			{d: notAsked, code: "SERVER", kind: KindConflict},
		}},
		{"not asked answered otherwise", []call{
			{d: notAsked, code: "ABORTED", reason: retrydv1.DelegateReason_DELEGATE_REASON_CODE_NOT_RETRYABLE},
			{d: declined, code: "ABORTED", kind: KindConflict},
		}},
		{"follow-up after a success", []call{
			{d: notAsked, code: "SERVER", reason: delegateFirst},
			{d: declined, code: "SERVER", kind: KindConflict, before: func(r *recorder) { r.succeed(1, 1) }},
		}},
		{"follow-up after the delegation was cancelled", []call{
			{d: notAsked, code: "SERVER", reason: delegateFirst},
			{d: declined, code: "SERVER", kind: KindClosed, before: (*recorder).cancelAll},
			{d: notAsked, code: "SERVER", reason: delegateFirst},
		}},
	}
	always := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := resolve(t, always)
			r := newRecorder(t)
			answers := map[retrydv1.Downstream]*retrydv1.FailedStepResponse{}
			for i, c := range tt.calls {
				if c.before != nil {
					c.before(r)
				}
				out, err := r.fail(stepReport(1, 1, c.code, c.d), p)
				switch {
				case c.kind != 0:
					if kindOf(err) != c.kind || len(out.Events) != 0 {
						t.Fatalf("call %d (%s): %v with %d events, want refused with kind %d", i, c.d, err, len(out.Events), c.kind)
					}
					continue
				case err != nil:
					t.Fatalf("call %d (%s): %v", i, c.d, err)
				case c.schedule != (out.Response.GetDecision().GetSchedule() != nil):
					t.Fatalf("call %d (%s): %v, want schedule %t", i, c.d, out.Response, c.schedule)
				case !c.schedule && out.Response.GetDecision().GetDelegate().GetReason() != c.reason:
					t.Fatalf("call %d (%s): %v, want delegate %s", i, c.d, out.Response, c.reason)
				}
				if prev, ok := answers[c.d]; ok {
					if !proto.Equal(prev, out.Response) || len(out.Events) != 0 {
						t.Fatalf("call %d (%s) repeats a report: %v with %d events, want the recorded %v",
							i, c.d, out.Response, len(out.Events), prev)
					}
				}
				answers[c.d] = out.Response
			}
		})
	}
}

// TestRefusalPrecedence pins which answer a report gets when several
// rules apply (docs/api.md, "Step records and refusal precedence"):
// STALE_STEP, then the recorded answer, then STEP_RECORD_CONFLICT or
// DELEGATION_CANCELLED, then RETRY_PENDING.
func TestRefusalPrecedence(t *testing.T) {
	t.Parallel()
	normal := &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(2), JitterRatio: proto.Float64(0)}}
	always := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS}
	notAsked, declined, handled := retrydv1.Downstream_DOWNSTREAM_NOT_ASKED, retrydv1.Downstream_DOWNSTREAM_DECLINED, retrydv1.Downstream_DOWNSTREAM_HANDLED
	const (
		recordedAnswer = -1 // the report gets the first report's answer
		newDecision    = -2 // the report is decided: a second record
	)
	type report struct {
		turn, step uint64
		code       string
		d          retrydv1.Downstream
		replay     retrydv1.Replay
	}
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		first  report
		then   func(r *recorder) // after the first report
		report report
		want   ErrorKind // or recordedAnswer, newDecision
	}{
		{"an exact repeat of an older step is stale", normal, report{1, 1, "SERVER", 0, 0},
			func(r *recorder) { r.start(); r.succeed(1, 2) }, report{1, 1, "SERVER", 0, 0}, KindStale},
		{"an older step is stale, not pending", normal, report{1, 2, "SERVER", 0, 0},
			nil, report{1, 1, "SERVER", 0, 0}, KindStale},
		{"an exact repeat while pending is answered", normal, report{1, 1, "SERVER", 0, 0},
			nil, report{1, 1, "SERVER", 0, 0}, recordedAnswer},
		{"an equivalent report while pending is answered", normal, report{1, 1, "SERVER", 0, 0},
			nil, report{1, 1, "SERVER", notAsked, retrydv1.Replay_REPLAY_SAFE}, recordedAnswer},
		{"another phase in normal mode is answered", normal, report{1, 1, "SERVER", 0, 0},
			(*recorder).start, report{1, 1, "SERVER", declined, 0}, recordedAnswer},
		{"other content while pending is a conflict, not pending", normal, report{1, 1, "SERVER", 0, 0},
			nil, report{1, 1, "TIMEOUT", 0, 0}, KindConflict},
		{"a newer step while pending is pending", normal, report{1, 1, "SERVER", 0, 0},
			nil, report{1, 2, "SERVER", 0, 0}, KindPending},
		{"the follow-up of an open handshake is decided", always, report{1, 1, "SERVER", 0, 0},
			nil, report{1, 1, "SERVER", declined, 0}, newDecision},
		{"a second follow-up is a conflict", always, report{1, 1, "SERVER", 0, 0},
			func(r *recorder) { r.fail(stepReport(1, 1, "SERVER", handled), r.policy) },
			report{1, 1, "SERVER", declined, 0}, KindConflict},
		{"the follow-up of a cancelled handshake is refused", always, report{1, 1, "SERVER", 0, 0},
			(*recorder).cancelAll, report{1, 1, "SERVER", declined, 0}, KindClosed},
		{"an exact repeat of a cancelled handshake is answered", always, report{1, 1, "SERVER", 0, 0},
			(*recorder).cancelAll, report{1, 1, "SERVER", notAsked, 0}, recordedAnswer},
		{"other content at a cancelled handshake is a conflict", always, report{1, 1, "SERVER", 0, 0},
			(*recorder).cancelAll, report{1, 1, "TIMEOUT", 0, 0}, KindConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRecorder(t)
			r.policy = resolve(t, tt.policy)
			send := func(rp report) (FailOutcome, error) {
				req := stepReport(rp.turn, rp.step, rp.code, rp.d)
				req.Replay = rp.replay
				return r.fail(req, r.policy)
			}
			first, err := send(tt.first)
			if err != nil {
				t.Fatal(err)
			}
			if tt.then != nil {
				tt.then(r)
			}
			out, err := send(tt.report)
			switch tt.want {
			case recordedAnswer:
				if err != nil || len(out.Events) != 0 || !proto.Equal(out.Response, first.Response) {
					t.Errorf("%v, %d events, answer %v; want the recorded answer %v", err, len(out.Events), out.Response, first.Response)
				}
			case newDecision:
				if err != nil || len(out.Events) == 0 {
					t.Errorf("%v, %d events; want a new decision", err, len(out.Events))
				}
			default:
				if kindOf(err) != tt.want || len(out.Events) != 0 {
					t.Errorf("%v, %d events; want refused with kind %d", err, len(out.Events), tt.want)
				}
			}
		})
	}
}
