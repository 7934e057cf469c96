// Package sim runs fleets of simulated agent loops against providers that
// fail, on a simulated clock: no goroutines, no sleeping, the same numbers
// on every run. Each agent sends a model request, and on a failure asks a
// Decider (retryd) what to do: wait for the scheduled retry and start it
// when the Decider says so, or give the operation up and start the next.
// The results say what the providers saw — first attempts and retries per
// second — and how long the retry backlog took to drain after an outage.
package sim

import (
	"container/heap"
	"math/rand/v2"
	"strconv"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
)

// Epoch is the simulated clock's start, unless a Scenario names another.
var Epoch = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

// Scenario is one simulated fleet.
type Scenario struct {
	// Agents is how many agent loops run; agent i uses provider i mod
	// len(Providers).
	Agents    int
	Providers []Provider
	// Policy is every agent's retry policy (inline in each FailedStep).
	Policy *retrydv1.RetryPolicy
	// Duration is how long the simulation runs.
	Duration time.Duration
	// SuccessLatency and FailureLatency are how long a request takes to
	// succeed (a model's answer) or to fail (a 429 or 503 comes fast).
	SuccessLatency, FailureLatency time.Duration
	// Period is how often an agent starts an operation: the next one starts
	// Period after the last one started, or when it ends if it took longer.
	// Work arrives at this rate whatever the provider does, so giving an
	// operation up early does not make the agent send more.
	Period time.Duration
	// Seed makes the agents' random draws; the same seed gives the same run.
	Seed uint64
	// Start is the clock at time 0; zero means Epoch.
	Start time.Time
}

// Provider is one simulated model provider.
type Provider struct {
	Name string
	// Every request started within [OutageStart, OutageEnd) fails: half
	// with 429 (RATE_LIMIT, with RetryAfter when set), half with 503
	// (SERVER). OutageEnd <= OutageStart means no outage.
	OutageStart, OutageEnd time.Duration
	RetryAfter             time.Duration
	// BackgroundFailure is the share of requests outside the outage that
	// fail with 503.
	BackgroundFailure float64
}

func (p Provider) hasOutage() bool { return p.OutageEnd > p.OutageStart }

// outcome draws the result of a request started at t.
func (p Provider) outcome(t time.Duration, rng *rand.Rand) outcome {
	down := p.hasOutage() && t >= p.OutageStart && t < p.OutageEnd
	switch {
	case down && rng.IntN(2) == 0:
		o := outcome{code: "RATE_LIMIT", status: 429}
		if p.RetryAfter > 0 {
			o.retryAfterMs = proto.Int64(p.RetryAfter.Milliseconds())
		}
		return o
	case down, rng.Float64() < p.BackgroundFailure:
		return outcome{code: "SERVER", status: 503}
	}
	return outcome{ok: true}
}

type outcome struct {
	ok           bool
	code         string
	status       int32
	retryAfterMs *int64
}

// agent is one simulated agent loop.
type agent struct {
	id       int
	provider int
	session  string
	turn     uint64
	rng      *rand.Rand
	retryID  string
	last     outcome
	// opStart is when the current operation started; scheduledAt when its
	// pending retry was scheduled.
	opStart, scheduledAt time.Duration
}

type eventKind int

const (
	evAttempt eventKind = iota // start the operation's first request
	evOutcome                  // a request's outcome arrives
	evDue                      // a scheduled retry is due
)

type event struct {
	at    time.Duration
	seq   uint64
	agent int
	kind  eventKind
}

// queue orders events by time, then by the order they were pushed, so that
// a run is the same every time.
type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *queue) Pop() (x any) { n := len(*q); x, *q = (*q)[n-1], (*q)[:n-1]; return x }
func (q *queue) peek() event  { return (*q)[0] }
func (q *queue) empty() bool  { return len(*q) == 0 }

// run is one simulation in progress.
type run struct {
	sc      Scenario
	d       Decider
	start   time.Time
	now     time.Duration
	seq     uint64
	q       queue
	agents  []*agent
	results []ProviderResult
}

// Run simulates sc against d and returns what each provider saw.
func Run(sc Scenario, d Decider) Result {
	r := &run{sc: sc, d: d, start: sc.Start}
	if r.start.IsZero() {
		r.start = Epoch
	}
	seconds := int((sc.Duration + time.Second - 1) / time.Second)
	for _, p := range sc.Providers {
		r.results = append(r.results, newProviderResult(p, seconds))
	}
	for i := range sc.Agents {
		a := &agent{id: i, provider: i % len(sc.Providers), session: "agent-" + strconv.Itoa(i),
			rng: rand.New(rand.NewPCG(sc.Seed, uint64(i)))}
		r.agents = append(r.agents, a)
		r.results[a.provider].Agents++
		// Agents start spread over one period.
		r.push(time.Duration(a.rng.Int64N(int64(sc.Period))), i, evAttempt)
	}
	for !r.q.empty() && r.q.peek().at < sc.Duration {
		e := heap.Pop(&r.q).(event)
		r.now = e.at
		r.handle(e)
	}
	return Result{Scenario: sc, Providers: r.results}
}

func (r *run) push(at time.Duration, agent int, kind eventKind) {
	r.seq++
	heap.Push(&r.q, event{at: at, seq: r.seq, agent: agent, kind: kind})
}

func (r *run) handle(e event) {
	a := r.agents[e.agent]
	switch e.kind {
	case evAttempt:
		a.opStart = r.now
		r.attempt(a, false)
	case evOutcome:
		r.outcome(a)
	case evDue:
		r.due(a)
	}
}

// attempt sends one request to the agent's provider.
func (r *run) attempt(a *agent, retry bool) {
	a.turn++
	p := r.sc.Providers[a.provider]
	res := &r.results[a.provider]
	res.countStart(r.now, retry)
	if retry && p.hasOutage() && r.now >= p.OutageEnd && a.scheduledAt < p.OutageEnd {
		res.Drain = max(res.Drain, r.now-p.OutageEnd)
	}
	a.last = p.outcome(r.now, a.rng)
	latency := r.sc.FailureLatency
	if a.last.ok {
		latency = r.sc.SuccessLatency
	}
	r.push(r.now+latency, a.id, evOutcome)
}

// outcome reports the request's outcome and acts on the answer.
func (r *run) outcome(a *agent) {
	res := &r.results[a.provider]
	name := r.sc.Providers[a.provider].Name
	now := r.start.Add(r.now)
	if a.last.ok {
		res.Successes++
		res.SuccessesPerSecond[int(r.now/time.Second)]++
		r.d.StepSucceeded(now, Success{Session: a.session, Turn: a.turn, Step: a.turn, Provider: name})
		r.endOperation(a)
		return
	}
	res.Failures++
	f := Failure{Session: a.session, Turn: a.turn, Step: a.turn, Provider: name, Policy: r.sc.Policy,
		Code: a.last.code, HTTPStatus: a.last.status, RetryAfterMs: a.last.retryAfterMs}
	dec := r.d.FailedStep(now, f)
	if !dec.Schedule && dec.Reason == "downstream_first" {
		// Always mode: no downstream recovery in this fleet; it declines.
		f.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
		dec = r.d.FailedStep(now, f)
	}
	if !dec.Schedule {
		res.Delegated[dec.Reason]++
		r.endOperation(a)
		return
	}
	res.Sources[dec.Source]++
	res.ScheduledPerSecond[int(r.now/time.Second)]++
	a.retryID, a.scheduledAt = dec.RetryID, r.now
	r.push(max(dec.DueAt.Sub(r.start), r.now), a.id, evDue)
}

// due awaits the agent's scheduled retry.
func (r *run) due(a *agent) {
	st := r.d.AwaitStart(r.start.Add(r.now), a.retryID)
	switch {
	case st.Now:
		r.attempt(a, true)
	case st.Cancelled:
		r.results[a.provider].Cancelled++
		r.endOperation(a)
	default:
		r.results[a.provider].Held++
		r.push(max(st.At.Sub(r.start), r.now+time.Millisecond), a.id, evDue)
	}
}

// endOperation ends the agent's operation, by success or by giving up, and
// schedules the next one Period after this one started (at once, if this
// one took longer).
func (r *run) endOperation(a *agent) {
	a.retryID = ""
	r.push(max(a.opStart+r.sc.Period, r.now), a.id, evAttempt)
}
