package retryd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The shared conformance vectors (testdata/conformance/*.json, schema in
// its README.md) are scripted scenarios that the Go client and the
// TypeScript client (clients/ts/test/vectors.ts) both play against a live
// retryd: adding a vector adds a test in both languages.

// conformanceVector is one scripted scenario.
type conformanceVector struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Session     string            `json:"session"`
	Steps       []conformanceStep `json:"steps"`
}

// conformanceStep is one call of a scenario and what it must answer.
type conformanceStep struct {
	Op           string            `json:"op"`
	Comment      string            `json:"comment"`
	Request      json.RawMessage   `json:"request"`
	DeadlineInMs *int64            `json:"deadlineInMs"`
	Save         string            `json:"save"`
	AbortAfterMs *int64            `json:"abortAfterMs"`
	Retry        string            `json:"retry"`
	RetryID      string            `json:"retryId"`
	SessionID    string            `json:"sessionId"`
	Expect       conformanceExpect `json:"expect"`
}

// conformanceExpect is what a step must answer; only the fields present
// are checked. Line is the UI line RenderRetry renders from the scheduled
// event (renderRetryLine in the TypeScript client).
type conformanceExpect struct {
	Error                *conformanceError     `json:"error"`
	Decision             string                `json:"decision"`
	Outcome              string                `json:"outcome"`
	RetryNumber          *uint32               `json:"retryNumber"`
	MaxRetries           conformanceMaxRetries `json:"maxRetries"`
	DelayMs              *uint64               `json:"delayMs"`
	DelayMsMin           *uint64               `json:"delayMsMin"`
	DelayMsMax           *uint64               `json:"delayMsMax"`
	DelaySource          string                `json:"delaySource"`
	Mode                 string                `json:"mode"`
	PolicyKey            string                `json:"policyKey"`
	Reason               string                `json:"reason"`
	SameRetryAs          string                `json:"sameRetryAs"`
	Line                 string                `json:"line"`
	CancelReason         string                `json:"cancelReason"`
	Terminal             string                `json:"terminal"`
	Retries              *[]conformanceRetry   `json:"retries"`
	DelegationsCancelled *uint32               `json:"delegationsCancelled"`
	Closed               *[]conformanceClosed  `json:"closed"`
}

type conformanceError struct {
	Code            string   `json:"code"`
	Reason          string   `json:"reason"`
	Retry           string   `json:"retry"`
	FieldViolations []string `json:"fieldViolations"`
}

type conformanceRetry struct {
	Retry        string `json:"retry"`
	Status       string `json:"status"`
	CancelReason string `json:"cancelReason"`
}

type conformanceClosed struct {
	Provider  string  `json:"provider"`
	PolicyKey *string `json:"policyKey"`
	Reason    string  `json:"reason"`
	Retries   uint32  `json:"retries"`
}

// conformanceMaxRetries is the expected finite budget: absent from the
// JSON (not checked), null (unlimited: the field must be absent) or a
// number.
type conformanceMaxRetries struct {
	set       bool
	unlimited bool
	value     uint32
}

func (m *conformanceMaxRetries) UnmarshalJSON(b []byte) error {
	m.set = true
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		m.unlimited = true
		return nil
	}
	return json.Unmarshal(b, &m.value)
}

// conformanceSaved is a scheduled retry a step saved under a name.
type conformanceSaved struct {
	schedule   *retrydv1.Schedule
	turn, step uint64
}

func loadConformanceVectors(t *testing.T) []conformanceVector {
	t.Helper()
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "testdata", "conformance", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	var out []conformanceVector
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var v conformanceVector
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		if want := strings.TrimSuffix(filepath.Base(f), ".json"); v.Name != want {
			t.Fatalf("%s: name %q must match the file name", filepath.Base(f), v.Name)
		}
		if v.Session == "" || len(v.Steps) == 0 {
			t.Fatalf("%s: session and steps are required", filepath.Base(f))
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		t.Fatal("no conformance vectors in testdata/conformance")
	}
	return out
}

// TestConformance runs every shared vector through the Go client against
// one live retryd, one parallel subtest per vector, then the invariant
// checker over the server's whole event log.
func TestConformance(t *testing.T) {
	t.Parallel()
	vectors := loadConformanceVectors(t)
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The vectors' server config protects the fleet vector's providers.
	srv := retrydtest.Start(t, "--config", filepath.Join(root, "testdata", "conformance", "retryd.yaml"))
	client, err := retryd.New(srv.Addr, retryd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	t.Run("vectors", func(t *testing.T) {
		for _, v := range vectors {
			t.Run(v.Name, func(t *testing.T) {
				t.Parallel()
				runConformanceVector(t, client, v)
			})
		}
	})
	retrydtest.Verify(t, srv.Conn(t))
}

// TestConformanceCoverage keeps the vectors covering what they must: every
// mode, delegate reason, delay source and FAILED_PRECONDITION reason, both
// Retry-After forms, and each op and recover outcome.
func TestConformanceCoverage(t *testing.T) {
	t.Parallel()
	vectors := loadConformanceVectors(t)
	if len(vectors) < 12 {
		t.Errorf("only %d vectors", len(vectors))
	}
	sessions := make(map[string]string)
	seen := make(map[string]bool)
	for _, v := range vectors {
		if other, dup := sessions[v.Session]; dup {
			t.Errorf("%s and %s share session %q", other, v.Name, v.Session)
		}
		sessions[v.Session] = v.Name
		for _, s := range v.Steps {
			e := s.Expect
			seen["op:"+s.Op] = true
			for _, name := range []string{e.Mode, e.Reason, e.DelaySource} {
				if name != "" {
					seen[name] = true
				}
			}
			if e.Error != nil && e.Error.Reason != "" {
				seen["error:"+e.Error.Reason] = true
			}
			if e.Outcome != "" {
				seen["outcome:"+e.Outcome] = true
			}
			if e.Terminal != "" {
				seen["terminal:"+e.Terminal] = true
			}
			if e.DelayMsMin != nil || e.DelayMsMax != nil {
				seen["jitter-bounds"] = true
			}
			if e.SameRetryAs != "" {
				seen["same-retry"] = true
			}
			var req struct {
				Failure map[string]json.RawMessage `json:"failure"`
			}
			if len(s.Request) > 0 {
				if err := json.Unmarshal(s.Request, &req); err != nil {
					t.Fatalf("%s: %v", v.Name, err)
				}
			}
			if _, ok := req.Failure["providerRetryAfterMs"]; ok {
				seen["retry-after:ms"] = true
			}
			if _, ok := req.Failure["retryAfter"]; ok {
				seen["retry-after:header"] = true
			}
		}
	}
	var want []string
	for _, names := range []map[int32]string{retrydv1.Mode_name, retrydv1.DelegateReason_name, retrydv1.DelaySource_name} {
		for n, name := range names {
			if n != 0 {
				want = append(want, name)
			}
		}
	}
	for _, r := range []string{retryd.ReasonRetryPending, retryd.ReasonStaleStep, retryd.ReasonStepRecordConflict, retryd.ReasonDelegationCancelled} {
		want = append(want, "error:"+r)
	}
	for _, op := range []string{"failedStep", "recover", "awaitRetry", "cancelRetries", "stepSucceeded"} {
		want = append(want, "op:"+op)
	}
	want = append(want, "outcome:retry", "outcome:delegate", "outcome:aborted", "terminal:started", "terminal:cancelled",
		"jitter-bounds", "same-retry", "retry-after:ms", "retry-after:header")
	slices.Sort(want)
	for _, w := range want {
		if !seen[w] {
			t.Errorf("no vector covers %s", w)
		}
	}
}

func runConformanceVector(t *testing.T, client *retryd.Client, v conformanceVector) {
	saved := make(map[string]conformanceSaved)
	lookup := func(where, name string) conformanceSaved {
		t.Helper()
		s, ok := saved[name]
		if !ok {
			t.Fatalf("%s: no retry saved as %q", where, name)
		}
		return s
	}
	for i, step := range v.Steps {
		where := fmt.Sprintf("step %d (%s)", i+1, step.Op)
		if step.Comment != "" {
			where = fmt.Sprintf("step %d (%s: %s)", i+1, step.Op, step.Comment)
		}
		runConformanceStep(t, client, v, where, step, saved, lookup)
		if t.Failed() {
			return
		}
	}
}

// runConformanceStep plays one step of v; saved holds the retries earlier
// steps saved by name.
func runConformanceStep(t *testing.T, client *retryd.Client, v conformanceVector, where string, step conformanceStep, saved map[string]conformanceSaved, lookup func(string, string) conformanceSaved) {
	exp := step.Expect
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	switch step.Op {
	case "failedStep":
		req := conformanceFailedStep(t, where, v, step)
		resp, err := client.FailedStep(ctx, req)
		if conformanceCheckError(t, where, err, exp, lookup) {
			break
		}
		switch d := resp.GetDecision().GetOutcome().(type) {
		case *retrydv1.Decision_Schedule:
			if exp.Decision != "" && exp.Decision != "schedule" {
				t.Fatalf("%s: want %s, got schedule %v", where, exp.Decision, d.Schedule)
			}
			conformanceCheckSchedule(t, where, req, d.Schedule, resp.GetEvent(), exp, lookup)
			if step.Save != "" {
				saved[step.Save] = conformanceSaved{d.Schedule, req.GetTurn(), req.GetStep()}
			}
		case *retrydv1.Decision_Delegate:
			if exp.Decision != "" && exp.Decision != "delegate" {
				t.Fatalf("%s: want %s, got delegate %v", where, exp.Decision, d.Delegate)
			}
			conformanceCheckDelegate(t, where, req, d.Delegate.GetReason(), resp.GetEvent(), exp)
		default:
			t.Fatalf("%s: neither schedule nor delegate: %v", where, resp)
		}

	case "recover":
		req := conformanceFailedStep(t, where, v, step)
		rctx, rcancel := ctx, context.CancelFunc(func() {})
		if step.AbortAfterMs != nil {
			rctx, rcancel = context.WithTimeout(ctx, time.Duration(*step.AbortAfterMs)*time.Millisecond)
		}
		out, err := client.Recover(rctx, req)
		rcancel()
		switch {
		case exp.Outcome == "aborted":
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: want the abort (context deadline), got %v (%+v)", where, err, out)
			}
			conformanceCheckSchedule(t, where, req, out.Schedule, out.Event, exp, lookup)
			c := out.Cancelled
			if c == nil || c.GetRetryId() != out.Schedule.GetRetryId() {
				t.Fatalf("%s: want the retry cancelled after the abort, got %+v", where, out)
			}
			if exp.CancelReason != "" && c.GetReason().String() != exp.CancelReason {
				t.Errorf("%s: cancel reason %v, want %s", where, c.GetReason(), exp.CancelReason)
			}
		case conformanceCheckError(t, where, err, exp, lookup):
		case out.Retry:
			conformanceCheckOutcome(t, where, "retry", exp)
			conformanceCheckSchedule(t, where, req, out.Schedule, out.Event, exp, lookup)
			conformanceCheckStarted(t, where, out.Started, conformanceSaved{out.Schedule, req.GetTurn(), req.GetStep()})
		case out.Delegate != nil:
			conformanceCheckOutcome(t, where, "delegate", exp)
			conformanceCheckDelegate(t, where, req, out.Delegate.GetReason(), out.Event, exp)
		case out.Cancelled != nil:
			conformanceCheckOutcome(t, where, "cancelled", exp)
			conformanceCheckSchedule(t, where, req, out.Schedule, out.Event, exp, lookup)
			if exp.CancelReason != "" && out.Cancelled.GetReason().String() != exp.CancelReason {
				t.Errorf("%s: cancel reason %v, want %s", where, out.Cancelled.GetReason(), exp.CancelReason)
			}
		default:
			t.Fatalf("%s: empty outcome %+v", where, out)
		}
		if step.Save != "" && out.Schedule != nil {
			saved[step.Save] = conformanceSaved{out.Schedule, req.GetTurn(), req.GetStep()}
		}

	case "awaitRetry":
		id := step.RetryID
		var target *conformanceSaved
		if step.Retry != "" {
			s := lookup(where, step.Retry)
			target, id = &s, s.schedule.GetRetryId()
		}
		term, err := client.AwaitRetry(ctx, id)
		if conformanceCheckError(t, where, err, exp, lookup) {
			break
		}
		switch m := term.GetMessage().(type) {
		case *retrydv1.AwaitRetryResponse_Started:
			if exp.Terminal != "" && exp.Terminal != "started" {
				t.Fatalf("%s: want %s, got started %v", where, exp.Terminal, m.Started)
			}
			if target == nil {
				t.Fatalf("%s: started for a retry the vector did not save", where)
			}
			conformanceCheckStarted(t, where, m.Started, *target)
			if exp.RetryNumber != nil && m.Started.GetRetryNumber() != *exp.RetryNumber {
				t.Errorf("%s: retry number %d, want %d", where, m.Started.GetRetryNumber(), *exp.RetryNumber)
			}
		case *retrydv1.AwaitRetryResponse_Cancelled:
			c := m.Cancelled
			if exp.Terminal != "" && exp.Terminal != "cancelled" {
				t.Fatalf("%s: want %s, got cancelled %v", where, exp.Terminal, c)
			}
			if c.GetRetryId() != id {
				t.Errorf("%s: cancelled retry id %q, want %q", where, c.GetRetryId(), id)
			}
			if exp.CancelReason != "" && c.GetReason().String() != exp.CancelReason {
				t.Errorf("%s: cancel reason %v, want %s", where, c.GetReason(), exp.CancelReason)
			}
			if exp.RetryNumber != nil && c.GetRetryNumber() != *exp.RetryNumber {
				t.Errorf("%s: retry number %d, want %d", where, c.GetRetryNumber(), *exp.RetryNumber)
			}
		default:
			t.Fatalf("%s: not a terminal message: %v", where, term)
		}

	case "cancelRetries":
		var resp *retrydv1.CancelRetriesResponse
		var err error
		if step.Retry != "" {
			resp, err = client.CancelRetry(ctx, lookup(where, step.Retry).schedule.GetRetryId())
		} else {
			session := step.SessionID
			if session == "" {
				session = v.Session
			}
			resp, err = client.CancelSession(ctx, session)
		}
		if conformanceCheckError(t, where, err, exp, lookup) {
			break
		}
		if exp.Retries != nil {
			var got, want []string
			for _, r := range resp.GetRetries() {
				got = append(got, fmt.Sprintf("%s %v %s", r.GetRetryId(), r.GetStatus(), conformanceCancelReason(r)))
			}
			for _, r := range *exp.Retries {
				want = append(want, fmt.Sprintf("%s %s %s", lookup(where, r.Retry).schedule.GetRetryId(), r.Status, r.CancelReason))
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: retries\n got %q\nwant %q", where, got, want)
			}
		}
		if exp.DelegationsCancelled != nil && resp.GetDelegationsCancelled() != *exp.DelegationsCancelled {
			t.Errorf("%s: %d delegations cancelled, want %d", where, resp.GetDelegationsCancelled(), *exp.DelegationsCancelled)
		}

	case "stepSucceeded":
		req := &retrydv1.StepSucceededRequest{}
		if len(step.Request) > 0 {
			if err := protojson.Unmarshal(step.Request, req); err != nil {
				t.Fatalf("%s: request: %v", where, err)
			}
		}
		if req.SessionId == "" {
			req.SessionId = v.Session
		}
		resp, err := client.StepSucceeded(ctx, req)
		if conformanceCheckError(t, where, err, exp, lookup) {
			break
		}
		if exp.Closed != nil {
			var got, want []string
			for j, c := range resp.GetClosed() {
				key := ""
				if j < len(*exp.Closed) && (*exp.Closed)[j].PolicyKey != nil {
					key = c.GetPolicyKey()
				}
				got = append(got, fmt.Sprintf("%s [%s] %v %d", c.GetProvider(), key, c.GetReason(), c.GetRetries()))
			}
			for _, c := range *exp.Closed {
				key := ""
				if c.PolicyKey != nil {
					key = *c.PolicyKey
				}
				want = append(want, fmt.Sprintf("%s [%s] %s %d", c.Provider, key, c.Reason, c.Retries))
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: closed chains\n got %q\nwant %q", where, got, want)
			}
		}

	default:
		t.Fatalf("%s: unknown op %q", where, step.Op)
	}
}

func conformanceFailedStep(t *testing.T, where string, v conformanceVector, step conformanceStep) *retrydv1.FailedStepRequest {
	t.Helper()
	req := &retrydv1.FailedStepRequest{}
	if err := protojson.Unmarshal(step.Request, req); err != nil {
		t.Fatalf("%s: request: %v", where, err)
	}
	if req.SessionId == "" {
		req.SessionId = v.Session
	}
	if step.DeadlineInMs != nil {
		req.Deadline = timestamppb.New(time.Now().Add(time.Duration(*step.DeadlineInMs) * time.Millisecond))
	}
	return req
}

func conformanceCheckOutcome(t *testing.T, where, got string, exp conformanceExpect) {
	t.Helper()
	if exp.Outcome != "" && exp.Outcome != got {
		t.Fatalf("%s: outcome %s, want %s", where, got, exp.Outcome)
	}
}

// conformanceCheckSchedule checks a schedule decision against exp, and
// that its event is the scheduled record of that very decision.
func conformanceCheckSchedule(t *testing.T, where string, req *retrydv1.FailedStepRequest, s *retrydv1.Schedule, ev *retrydv1.Event, exp conformanceExpect, lookup func(string, string) conformanceSaved) {
	t.Helper()
	if s == nil {
		t.Fatalf("%s: no schedule decision", where)
	}
	if exp.Reason != "" {
		t.Fatalf("%s: want delegate %s, got schedule %v", where, exp.Reason, s)
	}
	if s.GetRetryId() == "" {
		t.Errorf("%s: schedule without a retry id", where)
	}
	if exp.RetryNumber != nil && s.GetRetryNumber() != *exp.RetryNumber {
		t.Errorf("%s: retry number %d, want %d", where, s.GetRetryNumber(), *exp.RetryNumber)
	}
	if m := exp.MaxRetries; m.set {
		switch {
		case m.unlimited && s.MaxRetries != nil:
			t.Errorf("%s: max retries %d, want unlimited", where, s.GetMaxRetries())
		case !m.unlimited && (s.MaxRetries == nil || s.GetMaxRetries() != m.value):
			t.Errorf("%s: max retries %v, want %d", where, s.MaxRetries, m.value)
		}
	}
	if exp.DelayMs != nil && s.GetDelayMs() != *exp.DelayMs {
		t.Errorf("%s: delay %d ms, want %d", where, s.GetDelayMs(), *exp.DelayMs)
	}
	if exp.DelayMsMin != nil && s.GetDelayMs() < *exp.DelayMsMin {
		t.Errorf("%s: delay %d ms < %d", where, s.GetDelayMs(), *exp.DelayMsMin)
	}
	if exp.DelayMsMax != nil && s.GetDelayMs() > *exp.DelayMsMax {
		t.Errorf("%s: delay %d ms > %d", where, s.GetDelayMs(), *exp.DelayMsMax)
	}
	if exp.DelaySource != "" && s.GetDelaySource().String() != exp.DelaySource {
		t.Errorf("%s: delay source %v, want %s", where, s.GetDelaySource(), exp.DelaySource)
	}
	if exp.Mode != "" && s.GetMode().String() != exp.Mode {
		t.Errorf("%s: mode %v, want %s", where, s.GetMode(), exp.Mode)
	}
	if exp.PolicyKey != "" && s.GetPolicyKey() != exp.PolicyKey {
		t.Errorf("%s: policy key %q, want %q", where, s.GetPolicyKey(), exp.PolicyKey)
	}
	if exp.SameRetryAs != "" {
		if want := lookup(where, exp.SameRetryAs).schedule.GetRetryId(); s.GetRetryId() != want {
			t.Errorf("%s: retry id %q, want the retry %q", where, s.GetRetryId(), want)
		}
	}
	if ev.GetSessionId() != req.GetSessionId() {
		t.Errorf("%s: event session %q, want %q", where, ev.GetSessionId(), req.GetSessionId())
	}
	sc := ev.GetScheduled()
	if sc == nil {
		t.Fatalf("%s: event %v is not a scheduled record", where, ev)
	}
	if sc.GetRetryId() != s.GetRetryId() || sc.GetRetryNumber() != s.GetRetryNumber() ||
		(sc.MaxRetries == nil) != (s.MaxRetries == nil) || sc.GetMaxRetries() != s.GetMaxRetries() ||
		sc.GetDelayMs() != s.GetDelayMs() || sc.GetDelaySource() != s.GetDelaySource() ||
		sc.GetPolicyKey() != s.GetPolicyKey() || !sc.GetDueAt().AsTime().Equal(s.GetDueAt().AsTime()) ||
		sc.GetTurn() != req.GetTurn() || sc.GetStep() != req.GetStep() || sc.GetProvider() != req.GetProvider() {
		t.Errorf("%s: scheduled record %v does not match schedule %v of request %v", where, sc, s, req)
	}
	if exp.Line != "" && retryd.RenderRetry(sc) != exp.Line {
		t.Errorf("%s: UI line %q, want %q", where, retryd.RenderRetry(sc), exp.Line)
	}
}

func conformanceCheckDelegate(t *testing.T, where string, req *retrydv1.FailedStepRequest, reason retrydv1.DelegateReason, ev *retrydv1.Event, exp conformanceExpect) {
	t.Helper()
	if exp.RetryNumber != nil {
		t.Fatalf("%s: want schedule retry %d, got delegate %v", where, *exp.RetryNumber, reason)
	}
	if exp.Reason != "" && reason.String() != exp.Reason {
		t.Errorf("%s: delegate reason %v, want %s", where, reason, exp.Reason)
	}
	if ev.GetSessionId() != req.GetSessionId() {
		t.Errorf("%s: event session %q, want %q", where, ev.GetSessionId(), req.GetSessionId())
	}
	d := ev.GetDelegated()
	if d == nil || d.GetReason() != reason || d.GetTurn() != req.GetTurn() || d.GetStep() != req.GetStep() {
		t.Errorf("%s: event %v is not the delegated record of %v", where, ev, reason)
	}
}

func conformanceCheckStarted(t *testing.T, where string, st *retrydv1.RetryStarted, target conformanceSaved) {
	t.Helper()
	s := target.schedule
	if st.GetRetryId() != s.GetRetryId() || st.GetRetryNumber() != s.GetRetryNumber() ||
		st.GetTurn() != target.turn || st.GetStep() != target.step {
		t.Errorf("%s: started %v does not match retry %v of turn %d step %d", where, st, s, target.turn, target.step)
	}
	if st.GetStartedAt().AsTime().Before(s.GetDueAt().AsTime()) {
		t.Errorf("%s: started at %v, before the due time %v", where, st.GetStartedAt().AsTime(), s.GetDueAt().AsTime())
	}
}

// conformanceCheckError checks err against exp.Error and reports whether
// the step ended in an (expected) error.
func conformanceCheckError(t *testing.T, where string, err error, exp conformanceExpect, lookup func(string, string) conformanceSaved) bool {
	t.Helper()
	want := exp.Error
	switch {
	case err == nil && want == nil:
		return false
	case want == nil:
		t.Fatalf("%s: %v", where, err)
	case err == nil:
		t.Fatalf("%s: want error %s %s, got none", where, want.Code, want.Reason)
	}
	if got := conformanceCodeName(status.Code(err).String()); got != want.Code {
		t.Errorf("%s: code %s, want %s (%v)", where, got, want.Code, err)
	}
	if want.Reason != "" && retryd.ErrorReason(err) != want.Reason {
		t.Errorf("%s: error reason %q, want %q (%v)", where, retryd.ErrorReason(err), want.Reason, err)
	}
	if want.Retry != "" {
		id, ok := retryd.IsRetryPending(err)
		if wantID := lookup(where, want.Retry).schedule.GetRetryId(); !ok || id != wantID {
			t.Errorf("%s: pending retry %q (%v), want %q", where, id, ok, wantID)
		}
	}
	if want.FieldViolations != nil {
		var got []string
		for field := range retryd.FieldViolations(err) {
			got = append(got, field)
		}
		slices.Sort(got)
		wantFields := slices.Sorted(slices.Values(want.FieldViolations))
		if !slices.Equal(got, wantFields) {
			t.Errorf("%s: field violations %q, want %q (%v)", where, got, wantFields, err)
		}
	}
	return true
}

// conformanceCodeName turns a grpc-go code name (FailedPrecondition) into
// the canonical upper-snake name the vectors use (FAILED_PRECONDITION).
func conformanceCodeName(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) && unicode.IsLower(rune(s[i-1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

func conformanceCancelReason(r *retrydv1.RetryState) string {
	if r.GetCancelled() == nil {
		return ""
	}
	return r.GetCancelled().GetReason().String()
}
