package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// echoMethod is the RPC of bench/echo.
const echoMethod = "/retrydbench.Echo/Echo"

// gubernatorMethod is gubernator's GetRateLimits (package pb.gubernator,
// service V1).
const gubernatorMethod = "/pb.gubernator.V1/GetRateLimits"

// A caller makes one worker's calls; it is used by one goroutine.
type caller interface {
	// call makes one RPC. measured reports whether it is the RPC whose
	// latency the table reports (FailedStep for retryd; every call for
	// the baselines).
	call(ctx context.Context) (measured bool, err error)
}

// newCaller returns worker id's caller for target; prefix makes the
// session ids of one phase fresh.
type newCaller func(conn *grpc.ClientConn, id, workers, keySpace int, rng *rand.Rand, prefix string) caller

// failure is one entry of the FailedStep mix.
type failure struct {
	provider string
	policy   *retrydv1.RetryPolicy
	failure  *retrydv1.Failure
	// always marks an always-mode report: answered downstream_first, then
	// reported again with downstream declined (and scheduled).
	always bool
}

func u32(v uint32) *uint32   { return &v }
func i64(v int64) *int64     { return &v }
func u64(v uint64) *uint64   { return &v }
func f64(v float64) *float64 { return &v }

// failureMix is the FailedStep mix, drawn uniformly: four schedule
// outcomes (two default-policy codes, an inline schedule-mode policy, an
// inline full-jitter normal policy), three delegations (a code not
// retryable, ABORTED, a Retry-After over the cap) and an always-mode
// two-report step (delegated downstream_first, then scheduled).
func failureMix() []failure {
	schedule := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE}
	full := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_NORMAL, MaxRetries: u32(5),
		Backoff: &retrydv1.Backoff{InitialDelayMs: u64(200), MaxDelayMs: u64(5000), Multiplier: f64(2), Jitter: retrydv1.Jitter_JITTER_FULL}}
	always := &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS}
	return []failure{
		{provider: "deepseek", failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429}},
		{provider: "deepseek", failure: &retrydv1.Failure{Code: "SERVER", HttpStatus: 503}},
		{provider: "anthropic", policy: schedule, failure: &retrydv1.Failure{Code: "HTTP_529", HttpStatus: 529}},
		{provider: "openai", policy: full, failure: &retrydv1.Failure{Code: "TRANSPORT"}},
		{provider: "deepseek", failure: &retrydv1.Failure{Code: "INVALID_REQUEST", HttpStatus: 400}},
		{provider: "openai", failure: &retrydv1.Failure{Code: "ABORTED"}},
		{provider: "deepseek", failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429, ProviderRetryAfterMs: i64(60_000)}},
		{provider: "openai", policy: always, failure: &retrydv1.Failure{Code: "SERVER", HttpStatus: 500}, always: true},
	}
}

func (f failure) request(session string, turn, step uint64, ds retrydv1.Downstream) *retrydv1.FailedStepRequest {
	req := &retrydv1.FailedStepRequest{SessionId: session, Turn: turn, Step: step, Provider: f.provider, Failure: f.failure}
	if f.policy != nil {
		req.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: f.policy}
	}
	if f.always {
		req.Downstream = ds
	}
	return req
}

// session is one session of a retryd worker.
type session struct {
	id         string
	turn, step uint64
	// pending: the last FailedStep scheduled a retry, so the next call of
	// this session is CancelRetries.
	pending bool
	// followUp: the last FailedStep was an always-mode first report; the
	// next call reports the same step with downstream declined.
	followUp *failure
}

// retrydCaller drives FailedStep over sessions owned by this worker only
// (session i belongs to worker i mod workers), so no two workers race on
// one session and every call is valid: an error is a finding, not noise.
type retrydCaller struct {
	client   retrydv1.RetryServiceClient
	rng      *rand.Rand
	mix      []failure
	sessions []session
}

func newRetrydCaller(conn *grpc.ClientConn, id, workers, keySpace int, rng *rand.Rand, prefix string) caller {
	c := &retrydCaller{client: retrydv1.NewRetryServiceClient(conn), rng: rng, mix: failureMix()}
	for i := id; i < keySpace; i += workers {
		c.sessions = append(c.sessions, session{id: prefix + strconv.Itoa(i), turn: 1})
	}
	if len(c.sessions) == 0 {
		c.sessions = append(c.sessions, session{id: prefix + "w" + strconv.Itoa(id), turn: 1})
	}
	return c
}

// call picks a random session of the worker and makes its next call:
// CancelRetries (by session) when its last decision scheduled a retry;
// the declined follow-up of an always-mode first report; otherwise, one
// time in ten, StepSucceeded of its latest step (the next failure is then
// step 1 of a new turn), else the next step's FailedStep from the mix.
func (c *retrydCaller) call(ctx context.Context) (bool, error) {
	s := &c.sessions[c.rng.IntN(len(c.sessions))]
	switch {
	case s.pending:
		_, err := c.client.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: s.id}})
		if err != nil {
			return false, fmt.Errorf("CancelRetries: %w", err)
		}
		s.pending = false
		return false, nil
	case s.followUp != nil:
		f := s.followUp
		s.followUp = nil
		return true, c.failedStep(ctx, s, f, s.step, retrydv1.Downstream_DOWNSTREAM_DECLINED)
	case s.step > 0 && c.rng.IntN(10) == 0:
		_, err := c.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{
			SessionId: s.id, Turn: s.turn, Step: s.step})
		if err != nil {
			return false, fmt.Errorf("StepSucceeded: %w", err)
		}
		s.turn++
		s.step = 0
		return false, nil
	default:
		s.step++
		f := &c.mix[c.rng.IntN(len(c.mix))]
		if f.always {
			s.followUp = f
		}
		return true, c.failedStep(ctx, s, f, s.step, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED)
	}
}

func (c *retrydCaller) failedStep(ctx context.Context, s *session, f *failure, step uint64, ds retrydv1.Downstream) error {
	resp, err := c.client.FailedStep(ctx, f.request(s.id, s.turn, step, ds))
	if err != nil {
		return fmt.Errorf("FailedStep: %w", err)
	}
	if resp.GetDecision().GetSchedule() != nil {
		s.pending = true
	}
	return nil
}

// echoCaller sends bench/echo a BytesValue holding a marshalled
// FailedStepRequest of the same mix, so the request is about the size of
// retryd's.
type echoCaller struct {
	conn     *grpc.ClientConn
	rng      *rand.Rand
	payloads [][]byte
}

func newEchoCaller(conn *grpc.ClientConn, id, workers, keySpace int, rng *rand.Rand, prefix string) caller {
	c := &echoCaller{conn: conn, rng: rng}
	for _, f := range failureMix() {
		b, err := proto.Marshal(f.request(prefix+strconv.Itoa(keySpace-1), 1, 3, retrydv1.Downstream_DOWNSTREAM_NOT_ASKED))
		if err != nil {
			panic(err) // a static message always marshals
		}
		c.payloads = append(c.payloads, b)
	}
	return c
}

func (c *echoCaller) call(ctx context.Context) (bool, error) {
	in := &wrapperspb.BytesValue{Value: c.payloads[c.rng.IntN(len(c.payloads))]}
	out := new(wrapperspb.BytesValue)
	if err := c.conn.Invoke(ctx, echoMethod, in, out); err != nil {
		return true, fmt.Errorf("Echo: %w", err)
	}
	return true, nil
}

// gubernatorCaller sends GetRateLimits with one rate limit of a random key
// of the same key space (token or leaky bucket, 1 hit of 100 per minute).
// The request is encoded with protowire, so the module needs no
// gubernator dependency.
type gubernatorCaller struct{ keyedCaller }

func newGubernatorCaller(conn *grpc.ClientConn, id, workers, keySpace int, rng *rand.Rand, prefix string) caller {
	return &gubernatorCaller{newKeyedCaller(conn, keySpace, rng, prefix)}
}

// keyedCaller is a peer's caller: each call is on a key drawn uniformly
// from the key space.
type keyedCaller struct {
	conn     *grpc.ClientConn
	rng      *rand.Rand
	keySpace int
	prefix   string
}

func newKeyedCaller(conn *grpc.ClientConn, keySpace int, rng *rand.Rand, prefix string) keyedCaller {
	return keyedCaller{conn: conn, rng: rng, keySpace: max(keySpace, 1), prefix: prefix}
}

// key draws the next call's key.
func (c *keyedCaller) key() string { return c.prefix + strconv.Itoa(c.rng.IntN(c.keySpace)) }

func (c *gubernatorCaller) call(ctx context.Context) (bool, error) {
	var rl []byte
	rl = protowire.AppendTag(rl, 1, protowire.BytesType)
	rl = protowire.AppendString(rl, "retryd-bench")
	rl = protowire.AppendTag(rl, 2, protowire.BytesType)
	rl = protowire.AppendString(rl, c.key())
	for _, f := range [][2]uint64{{3, 1}, {4, 100}, {5, 60_000}, {6, uint64(c.rng.IntN(2))}} {
		rl = protowire.AppendTag(rl, protowire.Number(f[0]), protowire.VarintType)
		rl = protowire.AppendVarint(rl, f[1])
	}
	req := protowire.AppendTag(nil, 1, protowire.BytesType)
	req = protowire.AppendBytes(req, rl)
	var resp []byte
	if err := c.conn.Invoke(ctx, gubernatorMethod, &req, &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return true, fmt.Errorf("GetRateLimits: %w", err)
	}
	if msg := gubernatorError(resp); msg != "" {
		return true, fmt.Errorf("GetRateLimits: %s", msg)
	}
	return true, nil
}

// gubernatorError returns the error field (5) of the first RateLimitResp
// in a GetRateLimitsResp, or a decoding problem.
func gubernatorError(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "undecodable response"
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "undecodable response"
			}
			b = b[n:]
			continue
		}
		inner, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "undecodable response"
		}
		b = b[n:]
		for len(inner) > 0 {
			num, typ, n := protowire.ConsumeTag(inner)
			if n < 0 {
				return "undecodable response"
			}
			inner = inner[n:]
			if num == 5 && typ == protowire.BytesType {
				s, n := protowire.ConsumeString(inner)
				if n < 0 {
					return "undecodable response"
				}
				return s
			}
			n = protowire.ConsumeFieldValue(num, typ, inner)
			if n < 0 {
				return "undecodable response"
			}
			inner = inner[n:]
		}
	}
	return ""
}

// rawCodec passes already-encoded protobuf bytes (*[]byte) through; its
// name is "proto" so the content type is the standard one.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, errors.New("rawCodec: want *[]byte")
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return errors.New("rawCodec: want *[]byte")
	}
	*b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
