package service_test

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retryd/retryd/config"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store"
	"github.com/retryd/retryd/store/file"
	"github.com/retryd/retryd/store/memory"
	"github.com/retryd/retryd/store/redis"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Longer runs of TestStoresAgree and TestStoresAgreeConcurrently, e.g.
//
//	go test -run StoresAgree ./service/ -args -agree.seeds=100 -agree.calls=1000 -agree.rounds=150
var (
	agreeSeeds  = flag.Int("agree.seeds", 0, "seeds per variant of TestStoresAgree*; 0: the default")
	agreeCalls  = flag.Int("agree.calls", 0, "calls per seed of TestStoresAgree; 0: the default")
	agreeRounds = flag.Int("agree.rounds", 0, "rounds per seed of TestStoresAgreeConcurrently; 0: the default")
)

// TestStoresAgree is a differential test of the stores. One random
// script of calls, drawn as it runs (agreeGen), goes to the memory
// store, the file store, and pairs of Redis store replicas (on one
// Redis, on one Redis with 4 partitions, on a Redis Cluster), over real
// gRPC: failed steps, replays of a step, re-reports that contradict one,
// always-mode hand-offs, successes, cancellations by session and by
// retry, stale turns, reads and clock steps, by two tenants whose
// sessions have the same ids. Between calls the file store's process is
// restarted from its files now and then, and a Redis replica is replaced
// by a fresh one (which knows nothing and reads the snapshots the other
// wrote). Every answer, error or not, and the whole event log at the
// end must be the same on all of them, up to the retry ids (each
// deployment draws its own, so ids are compared by order of first
// appearance) and, with partitions, the sequences; the invariant checker
// must pass on every log.
//
// It runs once with inline policies only, and once with a policy file
// (a named policy, the default policy, a provider's policy) that turns
// on fleet protection, whose budgets and pacing the Redis replicas share
// through Redis; there the file store is not restarted, as its fleet
// state is its process's, and the partitioned layouts do not run, as the
// service refuses fleet protection over partitions.
//
// The clock is a fake one that only the script moves; backoffs are ten
// minutes or more, and the chain TTL and the abandon grace far longer
// than the script's clock steps, so no store's own timer fires during
// the test and races a call. A retry starts when its session's agent
// awaits it after the clock passed its due time. What is compared is the
// decision state each store keeps, and what each makes of it after a
// restart. The jitter source is constant, so a Redis replica that runs a
// transition again after a failed check draws nothing different.
func TestStoresAgree(t *testing.T) {
	seeds := 6
	ops := 300
	if testing.Short() {
		seeds, ops = 2, 150
	}
	seeds, ops = cmp.Or(*agreeSeeds, seeds), cmp.Or(*agreeCalls, ops)
	for _, v := range []struct {
		name     string
		policies string // a policy file, or none
	}{
		{"inline-policies", ""},
		{"policy-file-and-fleet", agreePolicyFile},
	} {
		for seed := range seeds {
			t.Run(v.name+"/seed="+strconv.Itoa(seed), func(t *testing.T) {
				t.Parallel()
				testStoresAgree(t, v.policies, uint64(seed), ops)
			})
		}
	}
}

// agreePolicyFile names a policy and sets the default one, and protects
// two providers: deepseek with a fleet budget, groq with the fleet-wide
// Retry-After. The circuit is off: its start gate holds due retries on
// the stores' own timers (see TestStoresAgree). Its backoffs are ten
// minutes or more as well.
const agreePolicyFile = `
policies:
  relay:
    mode: schedule
    schedule: [600000, 900000]
    tailDelayMs: 1200000
defaultPolicy:
  maxRetries: 3
  backoff: {initialDelayMs: 600000, maxDelayMs: 3600000, jitterRatio: 0.2}
providers:
  deepseek:
    fleet: {capacity: 3, refillPerSecond: 0.002, successCredit: 1, disableCircuit: true, maxFleetRetryAfterMs: 0}
  groq:
    retryPolicy:
      mode: always
      backoff: {initialDelayMs: 600000, maxDelayMs: 3600000}
    fleet: {disableBudget: true, disableCircuit: true, maxFleetRetryAfterMs: 3600000, spreadWindowMs: 0}
`

// testStoresAgree runs one script, drawn from seed, on every deployment.
func testStoresAgree(t *testing.T, policyFile string, seed uint64, ops int) {
	var policies *config.Policies
	if policyFile != "" {
		var err error
		if policies, err = config.Parse([]byte(policyFile)); err != nil {
			t.Fatal(err)
		}
	}
	gen := newAgreeGen(seed, policies != nil)
	start := time.Now().Truncate(time.Millisecond) // every deployment's clock starts here
	deps := []*deployment{
		memoryDeployment(t, start, policies),
		fileDeployment(t, start, policies),
		redisDeployment(t, "redis (two replicas, replaced)", redistest.Shared(t).URL(0), false, start, policies),
	}
	if policies == nil { // fleet protection is refused over partitions (TestFleetRefusedOnPartitions)
		deps = append(deps,
			redisDeployment(t, "redis partitions=4 (two replicas, replaced)", redistest.Shared(t).URL(0)+"?partitions=4", true, start, nil),
			redisDeployment(t, "redis cluster (two replicas, replaced)", redistest.SharedCluster(t).URL(), true, start, nil))
	}
	var script []agreeOp
	answers := make([]string, len(deps))
	for i := range ops {
		op := gen.next(func(tenant, session string) bool { return deps[0].pending(t, tenant, session) })
		script = append(script, op)
		for d, dep := range deps {
			answers[d] = dep.comparable(dep.canon(op, dep.do(t, op)))
		}
		for d := 1; d < len(deps); d++ {
			if want := deps[d].comparable(answers[0]); answers[d] != want {
				t.Fatalf("call %d, %s:\n%s answered\n  %s\n%s answered\n  %s\n(the calls before it: %v)",
					i, op, deps[0].name, want, deps[d].name, answers[d], script[max(0, i-8):i])
			}
		}
	}
	compareLogs(t, deps)
}

// compareLogs checks each tenant's event log on every deployment: not
// empty, no invariant violated, and the same as the reference's (deps[0])
// as the deployment's answers are compared.
func compareLogs(t *testing.T, deps []*deployment) {
	t.Helper()
	for _, tenant := range agreeTenants {
		var ref []*retrydv1.Event
		for d, dep := range deps {
			events := dep.events(t, tenant)
			if len(events) == 0 {
				t.Fatalf("%s: tenant %q: empty event log", dep.name, tenant)
			}
			for _, v := range invariant.Check(events) {
				t.Errorf("%s: tenant %q: invariant violation: %s", dep.name, tenant, v)
			}
			if d == 0 {
				ref = events
				continue
			}
			if got, want := dep.log(tenant, events, dep), deps[0].log(tenant, ref, dep); got != want {
				t.Errorf("tenant %q: the event logs of %s and %s differ: %s", tenant, deps[0].name, dep.name, firstDifference(want, got))
			}
		}
	}
}

// TestStoresAgreeConcurrently is TestStoresAgree with the calls of
// different sessions made at once, as a fleet makes them: the script
// runs in rounds, each one call per session (two tenants, three sessions
// each), all of a round's calls at once on every deployment but the
// reference, which makes them one by one. That is what the stores' group
// commits batch: several sessions' changes in one write (one Redis
// script, one file transaction), with conflicts between two Redis
// replicas that share the sequence counter or a partition. Each session's
// answers and events must be the memory store's, up to the ids and
// sequences (which the interleaving numbers). The clock moves between
// rounds only, so a retry is awaited once a later round finds it due.
// Inline policies only: a fleet budget is shared across sessions, so its
// answers would follow the interleaving.
func TestStoresAgreeConcurrently(t *testing.T) {
	seeds, rounds := 4, 40
	if testing.Short() {
		seeds, rounds = 1, 20
	}
	seeds, rounds = cmp.Or(*agreeSeeds, seeds), cmp.Or(*agreeRounds, rounds)
	for seed := range seeds {
		t.Run("seed="+strconv.Itoa(seed), func(t *testing.T) {
			t.Parallel()
			gen := newAgreeGen(uint64(seed), false)
			between := rand.New(rand.NewPCG(uint64(seed), 0xc0ffee)) // clock steps and restarts
			start := time.Now().Truncate(time.Millisecond)
			deps := []*deployment{
				memoryDeployment(t, start, nil),
				fileDeployment(t, start, nil),
				redisDeployment(t, "redis (two replicas, replaced)", redistest.Shared(t).URL(0), false, start, nil),
				redisDeployment(t, "redis partitions=4 (two replicas, replaced)", redistest.Shared(t).URL(0)+"?partitions=4", true, start, nil),
				redisDeployment(t, "redis cluster (two replicas, replaced)", redistest.SharedCluster(t).URL(), true, start, nil),
			}
			for _, d := range deps {
				d.perSession = true
			}
			pending := func(tenant, session string) bool { return deps[0].pending(t, tenant, session) }
			for round := range rounds {
				ops := make([]agreeOp, len(gen.sessions))
				for i := range ops {
					ops[i] = gen.nextFor(i, pending)
					if k := ops[i].kind; k == "advance" || k == "restart" { // between rounds only
						ops[i].kind = "chains"
					}
				}
				answers := make([][]string, len(deps))
				for d, dep := range deps {
					answers[d] = make([]string, len(ops))
					if d == 0 {
						for i, op := range ops {
							answers[d][i] = dep.comparable(dep.canon(op, dep.do(t, op)))
						}
						continue
					}
					var wg sync.WaitGroup
					for i, op := range ops {
						wg.Go(func() { answers[d][i] = dep.comparable(dep.canon(op, dep.do(t, op))) })
					}
					wg.Wait()
				}
				for d := 1; d < len(deps); d++ {
					for i, op := range ops {
						if want := deps[d].comparable(answers[0][i]); answers[d][i] != want {
							t.Fatalf("round %d, %s:\n%s answered\n  %s\n%s answered\n  %s\n(the round: %v)",
								round, op, deps[0].name, want, deps[d].name, answers[d][i], ops)
						}
					}
				}
				step := time.Duration(5+between.IntN(20)) * time.Minute
				restart := agreeOp{kind: "restart", replica: between.IntN(2)}
				restarting := between.IntN(5) == 0
				for _, dep := range deps {
					dep.advance(step)
					if restarting {
						dep.do(t, restart)
					}
				}
			}
			compareLogs(t, deps)
		})
	}
}

// firstDifference describes the first line where two logs differ.
func firstDifference(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d of %d and %d:\n  %s\n  %s", i+1, len(al), len(bl), x, y)
		}
	}
	return "none"
}

// agreeOp is one call of the script. Which fields matter depends on kind.
type agreeOp struct {
	kind     string // fail, await, succeed, cancel-session, cancel-retry, chains, provider, advance, restart
	tenant   string // the caller's tenant
	req      *retrydv1.FailedStepRequest
	session  string
	turn     uint64
	step     uint64
	nth      int           // cancel-retry: the nth retry id the deployment has answered (may not exist)
	advance  time.Duration // advance
	replica  int           // the replica that takes the call (mod the deployment's replicas)
	provider string        // provider
}

func (op agreeOp) String() string {
	who := op.session
	if op.tenant != "" {
		who = op.tenant + "/" + op.session
	}
	switch op.kind {
	case "fail":
		return fmt.Sprintf("fail{%s %d/%d %s %s ds=%s}", who, op.req.GetTurn(), op.req.GetStep(),
			op.req.GetProvider(), op.req.GetFailure().GetCode(), op.req.GetDownstream())
	case "cancel-retry":
		return fmt.Sprintf("cancel-retry{%s #%d}", who, op.nth)
	case "advance":
		return "advance{" + op.advance.String() + "}"
	case "restart":
		return fmt.Sprintf("restart{%d}", op.replica)
	case "provider":
		return "provider{" + op.provider + "}"
	}
	return fmt.Sprintf("%s{%s %d/%d}", op.kind, who, op.turn, op.step)
}

// agreePolicies are inline policies without jitter and with backoffs of
// ten minutes or more (see TestStoresAgree).
func agreePolicies() []*retrydv1.RetryPolicy {
	backoff := func(initial uint64) *retrydv1.Backoff {
		return &retrydv1.Backoff{InitialDelayMs: proto.Uint64(initial), MaxDelayMs: proto.Uint64(3_600_000),
			Multiplier: proto.Float64(2), JitterRatio: proto.Float64(0)}
	}
	return []*retrydv1.RetryPolicy{
		{Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(3), Backoff: backoff(600_000)},
		{Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: proto.Uint32(1), Backoff: backoff(900_000)},
		{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{600_000, 1_200_000}},
		{Mode: retrydv1.Mode_MODE_ALWAYS, Backoff: backoff(600_000)},
	}
}

// agreeGen draws the script's calls as an agent fleet would make them,
// mostly: a session reports its next failed step, and while a retry of
// it is pending its agent usually awaits it (moving the clock to its due
// time) or cancels it. It tracks each session's turn and step itself; it
// learns which sessions have a pending retry from the reference
// deployment, which every other one must agree with anyway.
type agreeGen struct {
	rng       *rand.Rand
	policies  []*retrydv1.RetryPolicy
	sessions  []agreeSession
	drawn     int
	codes     []string
	providers []string
	file      bool // agreePolicyFile is loaded
}

type agreeSession struct {
	turn, step uint64
	last       *retrydv1.FailedStepRequest // the latest report, for replays
}

// newAgreeGen returns the generator of seed's script; with file, the
// script also names agreePolicyFile's policy, leaves the policy to the
// file, reports for its groq provider and reads providers' fleet state.
func newAgreeGen(seed uint64, file bool) *agreeGen {
	g := &agreeGen{rng: rand.New(rand.NewPCG(seed, 0x5eed)), policies: agreePolicies(), file: file,
		sessions:  make([]agreeSession, 3*len(agreeTenants)),
		codes:     []string{"RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT", "INVALID_REQUEST", "HTTP_529"},
		providers: []string{"deepseek", "openai"}}
	if file {
		g.providers = append(g.providers, "groq")
	}
	for i := range g.sessions {
		g.sessions[i].turn = 1
	}
	return g
}

// agreeCaller is the context of a call as tenant ("": no tenant, as
// without authentication).
func agreeCaller(tenant string) context.Context {
	if tenant == "" {
		return context.Background()
	}
	return as(tenant)
}

// agreeTenants are the script's tenants ("" is the default one); each
// has sessions of the same ids as the others'.
var agreeTenants = []string{"", "acme"}

// next draws the next call; pending reports whether a tenant's session
// has a pending retry.
func (g *agreeGen) next(pending func(tenant, session string) bool) agreeOp {
	return g.nextFor(g.rng.IntN(len(g.sessions)), pending)
}

// nextFor draws the next call of the ith session.
func (g *agreeGen) nextFor(i int, pending func(tenant, session string) bool) agreeOp {
	g.drawn++
	rng := g.rng
	s := &g.sessions[i]
	tenant, id := agreeTenants[i%len(agreeTenants)], "agree-"+strconv.Itoa(i/len(agreeTenants))
	op := agreeOp{tenant: tenant, session: id, turn: s.turn, step: s.step, replica: rng.IntN(2)}
	if pending(tenant, id) {
		switch r := rng.IntN(100); {
		case r < 60:
			op.kind = "await"
			return op
		case r < 70:
			op.kind = "cancel-session"
			return op
		}
	}
	switch r := rng.IntN(100); {
	case r < 5: // the session's latest retry is awaited, pending or not
		op.kind = "await"
	case r < 55: // the next step fails
		s.step++
		f := &retrydv1.Failure{Code: g.codes[rng.IntN(len(g.codes))]}
		switch rng.IntN(8) {
		case 0: // a Retry-After under the policies' 1 h cap
			f.ProviderRetryAfterMs = proto.Int64(1_800_000)
		case 1: // and over it
			f.ProviderRetryAfterMs = proto.Int64(7_200_000)
		}
		req := &retrydv1.FailedStepRequest{SessionId: id, Turn: s.turn, Step: s.step,
			Provider: g.providers[rng.IntN(len(g.providers))], Failure: f}
		switch k := rng.IntN(len(g.policies) + 2); {
		case k < len(g.policies):
			p := g.policies[k]
			req.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: p}
			if p.GetMode() == retrydv1.Mode_MODE_ALWAYS {
				req.Downstream = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
			}
		case !g.file:
			req.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: g.policies[0]}
		case k == len(g.policies):
			req.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "relay"}
		default: // the provider's policy, or the default one
			if req.Provider == "groq" { // always mode
				req.Downstream = retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
			}
		}
		s.last = req
		op.kind, op.req = "fail", req
	case r < 65 && s.last != nil: // the latest report again: a replay, or its always-mode follow-up
		req := proto.CloneOf(s.last)
		if req.GetDownstream() == retrydv1.Downstream_DOWNSTREAM_NOT_ASKED && rng.IntN(2) == 0 {
			req.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
			s.last = req
		}
		op.kind, op.req = "fail", req
	case r < 68 && s.last != nil: // the latest step reported again with another failure
		req := proto.CloneOf(s.last)
		req.Failure = &retrydv1.Failure{Code: "EMPTY_RESPONSE"}
		op.kind, op.req = "fail", req
	case r < 70 && s.turn > 1: // a report for an earlier turn
		op.kind = "fail"
		op.req = &retrydv1.FailedStepRequest{SessionId: id, Turn: s.turn - 1, Step: 1, Provider: "deepseek",
			Failure: &retrydv1.Failure{Code: "SERVER"}, PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: g.policies[0]}}
	case r < 78: // the step succeeded; the next failure is step 1 of a new turn
		op.kind = "succeed"
		s.turn++
		s.step = 0
		s.last = nil
	case r < 83:
		op.kind = "cancel-session"
	case r < 88:
		op.kind, op.nth = "cancel-retry", rng.IntN(g.drawn/3+1)
	case r < 90:
		op.kind = "chains"
	case r < 93 && g.file:
		op.kind, op.provider = "provider", g.providers[rng.IntN(len(g.providers))]
	case r < 95: // time passes: enough for some backoffs to end
		op.kind, op.advance = "advance", time.Duration(rng.IntN(40))*time.Minute+time.Duration(rng.IntN(1000))*time.Millisecond
	case r < 97:
		op.kind, op.advance = "advance", time.Duration(rng.IntN(3000))*time.Millisecond
	default:
		op.kind = "restart"
	}
	if op.kind == "" { // a replay drawn before the session's first report
		op.kind = "chains"
	}
	return op
}

// deployment is one store, served by one or more replicas over gRPC.
type deployment struct {
	name string
	open func(t *testing.T, cfg memory.Config) (store.Backend, func() error)
	// restartable: a restart op replaces a replica (the memory store
	// would start empty, so it ignores them).
	restartable bool
	partitioned bool             // a Redis layout of several partitions
	perSession  bool             // sessions call at once: ids and sequences per session
	policies    *config.Policies // the policy file, or nil
	cfg         memory.Config
	replicas    []*agreeReplica
	// mu guards what follows: the stores read the clock and draw ids from
	// their own goroutines, and calls of several sessions at once
	// (TestStoresAgreeConcurrently) update the rest.
	mu     sync.Mutex
	now    time.Time // the fake clock
	nextID int
	// ids are the retry ids the deployment answered, by first appearance:
	// all of them in one book, or with perSession one book per session
	// (tenant/session), as the order across sessions is then the
	// scheduler's.
	ids   *idBook
	books map[string]*idBook
	// latest is each session's latest scheduled retry, and due when it
	// falls due.
	latest map[string]string
	due    map[string]time.Time
}

// idBook numbers retry ids by first appearance.
type idBook struct {
	ids  []string
	seen map[string]int
}

// canon replaces the retry ids in s by their numbers in b.
func (b *idBook) canon(s string) string {
	return agreeRetryID.ReplaceAllStringFunc(s, func(id string) string {
		n, ok := b.seen[id]
		if !ok {
			n = len(b.ids)
			b.seen[id] = n
			b.ids = append(b.ids, id)
		}
		return "R" + strconv.Itoa(n)
	})
}

// book returns the id book of a tenant's session.
func (d *deployment) book(tenant, session string) *idBook {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.perSession {
		return d.ids
	}
	b := d.books[tenant+"/"+session]
	if b == nil {
		b = &idBook{seen: map[string]int{}}
		d.books[tenant+"/"+session] = b
	}
	return b
}

type agreeReplica struct {
	client retrydv1.RetryServiceClient
	conn   *grpc.ClientConn
	close  func()
}

var (
	// agreeRetryID matches a retry id of the script's, with the session
	// or the partition the Redis store's layouts append.
	agreeRetryID = regexp.MustCompile(`rid-[0-9]+(-[0-9]+)?(_[A-Za-z0-9_-]+)?`)
	// agreeSequence matches an event's sequence in an answer.
	agreeSequence = regexp.MustCompile(`"sequence":\s*"[0-9]+"`)
)

func newDeployment(t *testing.T, name string, start time.Time, policies *config.Policies, replicas int, restartable bool,
	open func(t *testing.T, cfg memory.Config) (store.Backend, func() error)) *deployment {
	d := &deployment{name: name, open: open, now: start, policies: policies, restartable: restartable,
		ids: &idBook{seen: map[string]int{}}, books: map[string]*idBook{},
		latest: map[string]string{}, due: map[string]time.Time{}}
	d.cfg = memory.Config{Options: store.Options{
		Now: d.clock,
		NewID: func() string {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.nextID++
			return fmt.Sprintf("rid-%06d", d.nextID)
		},
		Rand: constRand{},
		// Far beyond the clock steps, so that neither falls due: the stores
		// time them with timers of their own, which a fake clock that
		// jumps does not drive alike.
		AbandonGrace: 1000 * time.Hour,
		ChainTTL:     1000 * time.Hour,
	}}
	for range replicas {
		d.replicas = append(d.replicas, d.start(t))
	}
	t.Cleanup(func() {
		for _, r := range d.replicas {
			r.close()
		}
	})
	return d
}

// clock reads the deployment's fake clock.
func (d *deployment) clock() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.now
}

// advance moves the fake clock on.
func (d *deployment) advance(by time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.now = d.now.Add(by)
}

// constRand is a jitter source that always draws the middle.
type constRand struct{}

func (constRand) Float64() float64 { return 0.5 }

// start opens the deployment's store and serves it on a loopback port.
func (d *deployment) start(t *testing.T) *agreeReplica {
	t.Helper()
	store, closeStore := d.open(t, d.cfg)
	// The service keeps the fleet's accounts on a clock of its own.
	opts := []service.Option{service.WithClock(d.cfg.Now)}
	if d.policies != nil {
		opts = append(opts, service.WithPolicies(d.policies))
	}
	svc, err := service.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(testTenantUnary), grpc.ChainStreamInterceptor(testTenantStream))
	retrydv1.RegisterRetryServiceServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return &agreeReplica{client: retrydv1.NewRetryServiceClient(conn), conn: conn, close: func() {
		conn.Close()
		srv.Stop()
		if err := closeStore(); err != nil {
			t.Errorf("%s: closing the store: %v", d.name, err)
		}
	}}
}

// memoryDeployment is the reference: the memory store, never restarted
// (it would start empty).
func memoryDeployment(t *testing.T, start time.Time, policies *config.Policies) *deployment {
	return newDeployment(t, "memory", start, policies, 1, false, func(t *testing.T, cfg memory.Config) (store.Backend, func() error) {
		s := memory.New(cfg)
		return s, func() error { s.Close(); return nil }
	})
}

func fileDeployment(t *testing.T, start time.Time, policies *config.Policies) *deployment {
	dir := t.TempDir()
	// Its fleet state is the process's (docs/storage.md, "Fleet state"): a
	// restart would start it afresh, where the others keep theirs.
	name, restartable := "file (restarted)", true
	if policies != nil && policies.HasFleet() {
		name, restartable = "file", false
	}
	return newDeployment(t, name, start, policies, 1, restartable, func(t *testing.T, cfg memory.Config) (store.Backend, func() error) {
		s, err := file.Open(dir, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s, s.Close
	})
}

// redisDeployment is two replicas on one Redis (or Cluster) at url;
// partitioned says whether its layout has several partitions.
func redisDeployment(t *testing.T, name, url string, partitioned bool, start time.Time, policies *config.Policies) *deployment {
	prefix := redistest.Prefix()
	d := newDeployment(t, name, start, policies, 2, true, func(t *testing.T, cfg memory.Config) (store.Backend, func() error) {
		s, err := redis.Open(context.Background(), redis.Config{URL: suiteURL(url), KeyPrefix: prefix,
			Options: store.Options{ChainTTL: cfg.ChainTTL, AbandonGrace: cfg.AbandonGrace, Now: cfg.Now, NewID: cfg.NewID, Rand: cfg.Rand}})
		if err != nil {
			t.Fatal(err)
		}
		return s, s.Close
	})
	d.partitioned = partitioned
	return d
}

// do makes one call on the deployment and returns its answer (a message
// or an error), marshalled.
func (d *deployment) do(t *testing.T, op agreeOp) string {
	t.Helper()
	r := d.replicas[op.replica%len(d.replicas)]
	ctx, cancel := context.WithTimeout(agreeCaller(op.tenant), 10*time.Second)
	defer cancel()
	var resp proto.Message
	var err error
	switch op.kind {
	case "fail":
		var fr *retrydv1.FailedStepResponse
		fr, err = r.client.FailedStep(ctx, op.req)
		if s := fr.GetDecision().GetSchedule(); s != nil {
			d.mu.Lock()
			d.latest[op.tenant+"/"+op.session] = s.GetRetryId()
			d.due[s.GetRetryId()] = s.GetDueAt().AsTime()
			d.mu.Unlock()
		}
		resp = fr
	case "await":
		// The agent waits out the backoff (the clock moves to the due
		// time) and then awaits: the stream ends at once (a due retry
		// starts for its first awaiter), where a stream that waited would
		// race the next call.
		d.mu.Lock()
		id, ok := d.latest[op.tenant+"/"+op.session]
		due := d.due[id]
		d.mu.Unlock()
		if !ok {
			return "no retry"
		}
		if now := d.clock(); now.Before(due) {
			if d.perSession {
				return "not due" // the clock moves between rounds only
			}
			d.advance(due.Sub(now))
		}
		return d.await(ctx, t, r, id)
	case "succeed":
		resp, err = r.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: op.session, Turn: op.turn, Step: op.step})
	case "cancel-session":
		resp, err = r.client.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: op.session}})
	case "cancel-retry":
		id := "rid-unknown"
		b := d.book(op.tenant, op.session)
		d.mu.Lock()
		if n := len(b.ids); d.perSession && n > 0 {
			id = b.ids[op.nth%n]
		} else if op.nth < n {
			id = b.ids[op.nth]
		}
		d.mu.Unlock()
		resp, err = r.client.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: id}})
	case "chains":
		resp, err = r.client.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: op.session})
	case "provider":
		resp, err = r.client.GetProviderState(ctx, &retrydv1.GetProviderStateRequest{Provider: op.provider})
	case "advance":
		d.advance(op.advance)
		return "advanced"
	case "restart":
		if !d.restartable {
			return "restarted" // its state is its process's: nothing to restart from
		}
		i := op.replica % len(d.replicas)
		d.replicas[i].close()
		d.replicas[i] = d.start(t)
		return "restarted"
	default:
		t.Fatalf("unknown op %q", op.kind)
	}
	if err != nil {
		st := status.Convert(err)
		return fmt.Sprintf("error %s: %s", st.Code(), st.Message())
	}
	return marshalCanon(resp)
}

// await reads a whole AwaitRetry stream of a due retry: its state, then
// its terminal message.
func (d *deployment) await(ctx context.Context, t *testing.T, r *agreeReplica, id string) string {
	t.Helper()
	stream, err := r.client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id})
	if err != nil {
		t.Fatalf("%s: AwaitRetry: %v", d.name, err)
	}
	var out string
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			st := status.Convert(err)
			return out + fmt.Sprintf("error %s: %s", st.Code(), st.Message())
		}
		if st := m.GetState(); st != nil && st.GetAwaiters() > 0 && st.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			// It ended while this stream attached: on Redis the store's
			// timer may start a due retry as soon as it has an awaiter,
			// before the stream reads the state it sends first, where the
			// memory store starts it under the lock the read takes. Either
			// is the current state, so both are compared as pending.
			st.Status, st.Started, st.Cancelled = retrydv1.RetryStatus_RETRY_STATUS_PENDING, nil, nil
		}
		out += marshalCanon(m) + "\n"
	}
}

// marshalCanon marshals m as JSON, the same way for every deployment.
func marshalCanon(m proto.Message) string {
	b, err := protojson.MarshalOptions{}.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// canon replaces the retry ids in an answer to op by their numbers.
func (d *deployment) canon(op agreeOp, s string) string {
	return d.book(op.tenant, op.session).canon(s)
}

// pending reports whether the session has a pending retry, read with
// GetChains (not a call of the script).
func (d *deployment) pending(t *testing.T, tenant, session string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(agreeCaller(tenant), 10*time.Second)
	defer cancel()
	resp, err := d.replicas[0].client.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: session})
	if status.Code(err) == codes.NotFound {
		return false
	}
	if err != nil {
		t.Fatalf("%s: GetChains: %v", d.name, err)
	}
	for _, c := range resp.GetChains() {
		if c.GetLatest().GetStatus() == retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			return true
		}
	}
	return false
}

// comparable is what the deployment's canonical answer should be when
// the reference's is ref: with partitions, sequences are not compared,
// as each partition numbers its own events (docs/storage.md), nor when
// sessions call at once, as the interleaving numbers them.
func (d *deployment) comparable(ref string) string {
	if !d.partitioned && !d.perSession {
		return ref
	}
	return agreeSequence.ReplaceAllString(ref, `"sequence":"-"`)
}

// log renders an event log of this deployment, canonical, to compare
// with other's (itself or the reference): as other's answers are
// compared, and session by session where only each session's events are
// in one order (with partitions, or sessions that call at once).
func (d *deployment) log(tenant string, events []*retrydv1.Event, other *deployment) string {
	if other.partitioned || other.perSession {
		events = slices.Clone(events)
		slices.SortStableFunc(events, func(a, b *retrydv1.Event) int { return strings.Compare(a.GetSessionId(), b.GetSessionId()) })
	}
	var b strings.Builder
	for _, ev := range events {
		b.WriteString(other.comparable(d.book(tenant, ev.GetSessionId()).canon(marshalCanon(ev))))
		b.WriteByte('\n')
	}
	return b.String()
}

// events reads the deployment's whole event log from its first replica.
func (d *deployment) events(t *testing.T, tenant string) []*retrydv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(agreeCaller(tenant), 10*time.Second)
	defer cancel()
	evs, err := retrydtest.Events(ctx, d.replicas[0].conn, "")
	if err != nil {
		t.Fatalf("%s: WatchEvents: %v", d.name, err)
	}
	return evs
}
