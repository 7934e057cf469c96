package service_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// protected is the state TestHostileRequests guards: three sessions, each in
// a state a hostile request could disturb.
type protected struct {
	// s: turn 5 step 5 was scheduled (fast(1)) and started; its step record
	// and open chain are in place, no retry is pending.
	sResp *retrydv1.FailedStepResponse
	// p: turn 1 step 1 has a retry pending for an hour.
	pendingID string
	// d: an always-mode delegation at turn 1 step 1, cancelled by session.
}

var protectedSessions = []string{"s", "p", "d"}

// hostileRow is one request TestHostileRequests sends, and the exact answer
// it must get.
type hostileRow struct {
	rpc  string
	name string
	call func(ctx context.Context, h *harness, st *protected) (proto.Message, error)
	code codes.Code
	// fields are the exact BadRequest field paths of an INVALID_ARGUMENT.
	fields []string
	// reason is the ErrorInfo reason of a FAILED_PRECONDITION.
	reason string
	// message is the exact status message, and prefix and suffix its ends,
	// for refusals by grpc itself (before the service sees the request).
	message, prefix, suffix string
	// check inspects the response of a row that is not an error.
	check func(st *protected, resp proto.Message) error
	// session is the one session an OK row may add events for; empty means
	// the row must change nothing at all.
	session string
}

// Messages grpc-go itself answers, with INTERNAL, for requests the service
// never sees because the protobuf codec refused them.
const (
	invalidUTF8Message = "grpc: failed to unmarshal the received message: string field contains invalid UTF-8"
	// protobuf-go's own errors put a randomly chosen space or no-break
	// space after "proto:" so that nobody matches them exactly.
	truncatedPrefix = "grpc: failed to unmarshal the received message: proto:"
	truncatedSuffix = "cannot parse invalid wire-format data"
)

const (
	// maxRecv is grpc-go's default server receive limit, which retryd keeps;
	// a bigger message is refused with RESOURCE_EXHAUSTED and this message.
	maxRecv        = 4 << 20
	tooLargePrefix = "grpc: received message larger than max ("
	tooLargeSuffix = " vs. 4194304)"
	// maxDescription bounds what a refusal may echo back: the request's bad
	// bytes must never be reflected at length into status messages and
	// trailers.
	maxDescription = 1024
)

// notUTF8 is a byte string no proto3 string field may hold.
var notUTF8 = []byte{'s', 0xff, 0xfe, 'x'}

// rawCodec sends and receives pre-encoded bytes, so a test can put on the
// wire what the protobuf runtime refuses to marshal (invalid UTF-8 in a
// string field, truncated messages, wrong wire types). Its name is "proto":
// the server decodes with its ordinary codec.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// appendBytesField marshals m and appends one length-delimited field.
func appendBytesField(m proto.Message, num protowire.Number, val []byte) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, val)
}

const servicePath = "/retryd.v1.RetryService/"

// rawUnary calls a unary method with wire bytes.
func rawUnary(method string, wire []byte) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		var out []byte
		err := h.conn.Invoke(ctx, servicePath+method, &wire, &out, grpc.ForceCodec(rawCodec{}))
		return nil, err
	}
}

// rawStream opens a server-streaming method with wire bytes and reads it to
// its end.
func rawStream(method string, wire []byte) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		stream, err := h.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, servicePath+method, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return nil, err
		}
		if err := stream.SendMsg(&wire); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if err := stream.CloseSend(); err != nil {
			return nil, err
		}
		for {
			var out []byte
			if err := stream.RecvMsg(&out); err != nil {
				if errors.Is(err, io.EOF) {
					return nil, nil
				}
				return nil, err
			}
		}
	}
}

// drain reads a server stream to its end; it returns the first message and
// the error that ended it (nil for a clean end).
func drain[T any, PT interface {
	*T
	proto.Message
}](stream grpc.ServerStreamingClient[T], err error) (proto.Message, error) {
	if err != nil {
		return nil, err
	}
	var first proto.Message
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return first, nil
		}
		if err != nil {
			return first, err
		}
		if first == nil {
			first = PT(m)
		}
	}
}

func callFailed(req *retrydv1.FailedStepRequest) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		return h.client.FailedStep(ctx, req)
	}
}

func callAwait(id string) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		return drain(h.client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id}))
	}
}

func callCancel(req *retrydv1.CancelRetriesRequest) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		return h.client.CancelRetries(ctx, req)
	}
}

func cancelID(id string) *retrydv1.CancelRetriesRequest {
	return &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: id}}
}

func cancelSession(id string) *retrydv1.CancelRetriesRequest {
	return &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: id}}
}

func callSucceeded(req *retrydv1.StepSucceededRequest) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		return h.client.StepSucceeded(ctx, req)
	}
}

func callChains(id string) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		return h.client.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: id})
	}
}

func callWatch(req *retrydv1.WatchEventsRequest) func(context.Context, *harness, *protected) (proto.Message, error) {
	return func(ctx context.Context, h *harness, _ *protected) (proto.Message, error) {
		return drain(h.client.WatchEvents(ctx, req))
	}
}

// hostileRows lists the requests. Most FailedStep rows start from next(), a
// valid report of the protected session s's next step that would be
// scheduled if the bad field were ignored, so a missed check shows up as a
// change of state.
func hostileRows() []hostileRow {
	next := func() *retrydv1.FailedStepRequest { return failure("s", 6, 1, "p", "SERVER", nil) }
	with := func(mut func(r *retrydv1.FailedStepRequest)) *retrydv1.FailedStepRequest {
		r := next()
		mut(r)
		return r
	}
	withPolicy := func(p *retrydv1.RetryPolicy) *retrydv1.FailedStepRequest {
		return with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: p}
		})
	}
	withBackoff := func(b *retrydv1.Backoff) *retrydv1.FailedStepRequest {
		return withPolicy(&retrydv1.RetryPolicy{Backoff: b})
	}
	schedule := func(p *retrydv1.RetryPolicy) *retrydv1.FailedStepRequest {
		p.Mode = retrydv1.Mode_MODE_SCHEDULE
		return withPolicy(p)
	}
	codesN := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("CODE_%d", i)
		}
		return out
	}
	entries := func(n int, v uint64) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	long := func(n int) string { return strings.Repeat("x", n) }
	const over = uint64(math.MaxInt32) + 1
	const year1 = -62135596800 // 0001-01-01T00:00:00Z, the earliest valid Timestamp
	wellFormedUnknown := "AAAAAAAAAAAAAAAAAAAAAAAAAA"

	// Wire bytes the protobuf runtime would refuse to marshal.
	noSession := next()
	noSession.SessionId = ""
	noProvider := next()
	noProvider.Provider = ""
	noFailure := next()
	noFailure.Failure = nil
	failureBadMessage := appendBytesField(&retrydv1.Failure{Code: "SERVER"}, 2, notUTF8)
	failureBadCode := appendBytesField(&retrydv1.Failure{}, 1, notUTF8)
	truncated, err := proto.Marshal(next())
	if err != nil {
		panic(err)
	}
	truncated = truncated[:len(truncated)-3]
	sessionAsVarint, err := proto.Marshal(noSession)
	if err != nil {
		panic(err)
	}
	sessionAsVarint = protowire.AppendVarint(protowire.AppendTag(sessionAsVarint, 1, protowire.VarintType), 7)

	mustBytes := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		return b
	}

	invalid := func(rpc, name string, call func(context.Context, *harness, *protected) (proto.Message, error), fields ...string) hostileRow {
		return hostileRow{rpc: rpc, name: name, call: call, code: codes.InvalidArgument, fields: fields}
	}
	precondition := func(rpc, name string, call func(context.Context, *harness, *protected) (proto.Message, error), reason string) hostileRow {
		return hostileRow{rpc: rpc, name: name, call: call, code: codes.FailedPrecondition, reason: reason}
	}
	notFound := func(rpc, name string, call func(context.Context, *harness, *protected) (proto.Message, error)) hostileRow {
		return hostileRow{rpc: rpc, name: name, call: call, code: codes.NotFound}
	}
	notUTF8Row := func(rpc, name string, call func(context.Context, *harness, *protected) (proto.Message, error)) hostileRow {
		return hostileRow{rpc: rpc, name: name, call: call, code: codes.Internal, message: invalidUTF8Message}
	}
	truncatedRow := func(rpc string, call func(context.Context, *harness, *protected) (proto.Message, error)) hostileRow {
		return hostileRow{rpc: rpc, name: "truncated message", call: call, code: codes.Internal,
			prefix: truncatedPrefix, suffix: truncatedSuffix}
	}
	tooLarge := func(rpc string, call func(context.Context, *harness, *protected) (proto.Message, error)) hostileRow {
		return hostileRow{rpc: rpc, name: "message over the server's receive limit", call: call,
			code: codes.ResourceExhausted, prefix: tooLargePrefix, suffix: tooLargeSuffix}
	}

	const fs, ar, cr, ss, gc, we = "FailedStep", "AwaitRetry", "CancelRetries", "StepSucceeded", "GetChains", "WatchEvents"
	return []hostileRow{
		// FailedStep: identifiers.
		invalid(fs, "empty session id", callFailed(noSession), "session_id"),
		invalid(fs, "session id of 257 bytes", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.SessionId = long(257) })), "session_id"),
		invalid(fs, "session id of 3 MiB", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.SessionId = long(3 << 20) })), "session_id"),
		notUTF8Row(fs, "session id not UTF-8", rawUnary(fs, appendBytesField(noSession, 1, notUTF8))),
		invalid(fs, "session id with NUL", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.SessionId = "s\x00" })), "session_id"),
		invalid(fs, "session id with an ANSI escape", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.SessionId = "s\x1b[31m" })), "session_id"),
		invalid(fs, "session id with DEL", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.SessionId = "s\x7f" })), "session_id"),
		invalid(fs, "session id with C1 control NEL", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.SessionId = "s\u0085" })), "session_id"),
		invalid(fs, "session id with a newline", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.SessionId = "s\nforged log line" })), "session_id"),
		invalid(fs, "session id as a varint (wrong wire type: unknown field)", rawUnary(fs, sessionAsVarint), "session_id"),
		invalid(fs, "provider with CRLF", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Provider = "p\r\n" })), "provider"),
		invalid(fs, "provider of 257 bytes", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Provider = long(257) })), "provider"),
		notUTF8Row(fs, "provider not UTF-8", rawUnary(fs, appendBytesField(noProvider, 5, notUTF8))),
		invalid(fs, "logical turn id with a tab", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.LogicalTurnId = "t\t1" })), "logical_turn_id"),
		invalid(fs, "logical turn id of 257 bytes", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.LogicalTurnId = long(257) })), "logical_turn_id"),

		// FailedStep: the failure.
		invalid(fs, "missing failure", callFailed(noFailure), "failure"),
		invalid(fs, "empty code", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "" })), "failure.code"),
		invalid(fs, "lower-case code", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "server" })), "failure.code"),
		invalid(fs, "mixed-case code", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "Rate_Limit" })), "failure.code"),
		invalid(fs, "code with a space", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "RATE LIMIT" })), "failure.code"),
		invalid(fs, "code with a leading space", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = " SERVER" })), "failure.code"),
		invalid(fs, "code * alone", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "*" })), "failure.code"),
		invalid(fs, "code that is a prefix rule", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "HTTP_*" })), "failure.code"),
		invalid(fs, "code of 65 bytes", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = strings.Repeat("A", 65) })), "failure.code"),
		invalid(fs, "code starting with a digit", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "5XX" })), "failure.code"),
		invalid(fs, "code with a non-ASCII letter", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Code = "SERVÉR" })), "failure.code"),
		notUTF8Row(fs, "code not UTF-8", rawUnary(fs, appendBytesField(noFailure, 8, failureBadCode))),
		invalid(fs, "message over 4 KiB", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Message = long(4097) })), "failure.message"),
		notUTF8Row(fs, "message not UTF-8", rawUnary(fs, appendBytesField(noFailure, 8, failureBadMessage))),
		invalid(fs, "http status 1000", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.HttpStatus = 1000 })), "failure.http_status"),
		invalid(fs, "retry-after header of 257 bytes", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.RetryAfter = proto.String(long(257)) })), "failure.retry_after"),

		// FailedStep: enums and the deadline.
		invalid(fs, "unknown downstream 9", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Downstream = 9 })), "downstream"),
		invalid(fs, "unknown downstream -1", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Downstream = -1 })), "downstream"),
		invalid(fs, "unknown replay 3", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Replay = 3 })), "replay"),
		invalid(fs, "deadline with negative nanos", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Deadline = &timestamppb.Timestamp{Nanos: -1} })), "deadline"),
		invalid(fs, "deadline before year 1", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Deadline = &timestamppb.Timestamp{Seconds: year1 - 1} })), "deadline"),
		invalid(fs, "deadline after year 9999", callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Deadline = &timestamppb.Timestamp{Seconds: 253402300800} })), "deadline"),

		// FailedStep: the policy source.
		invalid(fs, "unknown policy name", callFailed(with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "no-such-policy"}
		})), "policy_name"),
		invalid(fs, "policy name in the wrong case", callFailed(with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "Relay"}
		})), "policy_name"),
		invalid(fs, "empty policy name", callFailed(with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{}
		})), "policy_name"),
		invalid(fs, "policy name with control characters", callFailed(with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: "relay\x00\x1b"}
		})), "policy_name"),
		invalid(fs, "policy name of 1 MiB", callFailed(with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: long(1 << 20)}
		})), "policy_name"),
		invalid(fs, "policy name of 3.8 MiB of multi-byte runes (its echo overflowed the 16 MiB trailer limit)", callFailed(with(func(r *retrydv1.FailedStepRequest) {
			r.PolicySource = &retrydv1.FailedStepRequest_PolicyName{PolicyName: strings.Repeat("é", 1950<<10)}
		})), "policy_name"),
		invalid(fs, "unknown mode 7", callFailed(withPolicy(&retrydv1.RetryPolicy{Mode: 7})), "policy.mode"),
		invalid(fs, "unknown mode -1", callFailed(withPolicy(&retrydv1.RetryPolicy{Mode: -1})), "policy.mode"),
		invalid(fs, "unknown jitter 9", callFailed(withBackoff(&retrydv1.Backoff{Jitter: 9})), "policy.backoff.jitter"),
		invalid(fs, "unknown retry_after_over_cap 9", callFailed(withPolicy(&retrydv1.RetryPolicy{RetryAfterOverCap: 9})), "policy.retry_after_over_cap"),

		// FailedStep: retryable codes.
		invalid(fs, "policy code * alone", callFailed(withPolicy(&retrydv1.RetryPolicy{RetryableCodes: []string{"*"}})), "policy.retryable_codes[0]"),
		invalid(fs, "schedule-mode code * after a prefix rule", callFailed(schedule(&retrydv1.RetryPolicy{RetryableCodes: []string{"HTTP_*", "*"}})), "policy.retryable_codes[1]"),
		invalid(fs, "duplicate policy code", callFailed(withPolicy(&retrydv1.RetryPolicy{RetryableCodes: []string{"SERVER", "TIMEOUT", "SERVER"}})), "policy.retryable_codes[2]"),
		invalid(fs, "lower-case policy code", callFailed(withPolicy(&retrydv1.RetryPolicy{RetryableCodes: []string{"SERVER", "timeout"}})), "policy.retryable_codes[1]"),
		invalid(fs, "policy code with a space", callFailed(withPolicy(&retrydv1.RetryPolicy{RetryableCodes: []string{"RATE LIMIT"}})), "policy.retryable_codes[0]"),
		invalid(fs, "policy code ABORTED", callFailed(withPolicy(&retrydv1.RetryPolicy{RetryableCodes: []string{"ABORTED"}})), "policy.retryable_codes[0]"),
		invalid(fs, "65 policy codes", callFailed(withPolicy(&retrydv1.RetryPolicy{RetryableCodes: codesN(65)})), "policy.retryable_codes"),
		invalid(fs, "codes in always mode", callFailed(withPolicy(&retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS, RetryableCodes: []string{"SERVER"}})), "policy.retryable_codes"),

		// FailedStep: backoff bounds.
		invalid(fs, "initial delay 0", callFailed(withBackoff(&retrydv1.Backoff{InitialDelayMs: proto.Uint64(0)})), "policy.backoff.initial_delay_ms"),
		invalid(fs, "initial and max delay over 2147483647", callFailed(withBackoff(&retrydv1.Backoff{InitialDelayMs: proto.Uint64(over), MaxDelayMs: proto.Uint64(over)})),
			"policy.backoff.initial_delay_ms", "policy.backoff.max_delay_ms"),
		invalid(fs, "max delay 2147483648", callFailed(withBackoff(&retrydv1.Backoff{MaxDelayMs: proto.Uint64(over)})), "policy.backoff.max_delay_ms"),
		invalid(fs, "max delay 2^64-1", callFailed(withBackoff(&retrydv1.Backoff{MaxDelayMs: proto.Uint64(math.MaxUint64)})), "policy.backoff.max_delay_ms"),
		invalid(fs, "max delay below initial", callFailed(withBackoff(&retrydv1.Backoff{InitialDelayMs: proto.Uint64(900), MaxDelayMs: proto.Uint64(800)})), "policy.backoff.max_delay_ms"),
		invalid(fs, "multiplier NaN", callFailed(withBackoff(&retrydv1.Backoff{Multiplier: proto.Float64(math.NaN())})), "policy.backoff.multiplier"),
		invalid(fs, "multiplier +Inf", callFailed(withBackoff(&retrydv1.Backoff{Multiplier: proto.Float64(math.Inf(1))})), "policy.backoff.multiplier"),
		invalid(fs, "multiplier -Inf", callFailed(withBackoff(&retrydv1.Backoff{Multiplier: proto.Float64(math.Inf(-1))})), "policy.backoff.multiplier"),
		invalid(fs, "multiplier 0.999", callFailed(withBackoff(&retrydv1.Backoff{Multiplier: proto.Float64(0.999)})), "policy.backoff.multiplier"),
		invalid(fs, "multiplier 0", callFailed(withBackoff(&retrydv1.Backoff{Multiplier: proto.Float64(0)})), "policy.backoff.multiplier"),
		invalid(fs, "multiplier -2", callFailed(withBackoff(&retrydv1.Backoff{Multiplier: proto.Float64(-2)})), "policy.backoff.multiplier"),
		invalid(fs, "jitter ratio NaN", callFailed(withBackoff(&retrydv1.Backoff{JitterRatio: proto.Float64(math.NaN())})), "policy.backoff.jitter_ratio"),
		invalid(fs, "jitter ratio +Inf", callFailed(withBackoff(&retrydv1.Backoff{JitterRatio: proto.Float64(math.Inf(1))})), "policy.backoff.jitter_ratio"),
		invalid(fs, "jitter ratio -Inf", callFailed(withBackoff(&retrydv1.Backoff{JitterRatio: proto.Float64(math.Inf(-1))})), "policy.backoff.jitter_ratio"),
		invalid(fs, "jitter ratio -0.1", callFailed(withBackoff(&retrydv1.Backoff{JitterRatio: proto.Float64(-0.1)})), "policy.backoff.jitter_ratio"),
		invalid(fs, "jitter ratio just over 1", callFailed(withBackoff(&retrydv1.Backoff{JitterRatio: proto.Float64(math.Nextafter(1, 2))})), "policy.backoff.jitter_ratio"),
		invalid(fs, "min attempt 2147483648", callFailed(withPolicy(&retrydv1.RetryPolicy{MinAttemptMs: proto.Uint64(over)})), "policy.min_attempt_ms"),
		invalid(fs, "max retries in always mode", callFailed(withPolicy(&retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS, MaxRetries: proto.Uint32(3)})), "policy.max_retries"),

		// FailedStep: schedules.
		invalid(fs, "schedule of 10 000 entries", callFailed(schedule(&retrydv1.RetryPolicy{Schedule: entries(10_000, 1000)})), "policy.schedule"),
		invalid(fs, "schedule of 65 entries", callFailed(schedule(&retrydv1.RetryPolicy{Schedule: entries(65, 1000)})), "policy.schedule"),
		invalid(fs, "schedule entry 2147483648", callFailed(schedule(&retrydv1.RetryPolicy{Schedule: []uint64{1000, over}})), "policy.schedule[1]"),
		invalid(fs, "schedule entry 0", callFailed(schedule(&retrydv1.RetryPolicy{Schedule: []uint64{0, 1000}})), "policy.schedule[0]"),
		invalid(fs, "tail 2147483648", callFailed(schedule(&retrydv1.RetryPolicy{TailDelayMs: proto.Uint64(over)})), "policy.tail_delay_ms"),
		invalid(fs, "tail 0", callFailed(schedule(&retrydv1.RetryPolicy{TailDelayMs: proto.Uint64(0)})), "policy.tail_delay_ms"),
		invalid(fs, "backoff in schedule mode", callFailed(schedule(&retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{}})), "policy.backoff"),
		invalid(fs, "schedule in normal mode", callFailed(withPolicy(&retrydv1.RetryPolicy{Schedule: []uint64{1000}})), "policy.schedule"),
		invalid(fs, "many bad fields at once", callFailed(with(func(r *retrydv1.FailedStepRequest) {
			r.SessionId = ""
			r.Failure.Code = "server"
			r.Replay = 7
			r.PolicySource = &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
				Backoff: &retrydv1.Backoff{Multiplier: proto.Float64(math.NaN()), JitterRatio: proto.Float64(math.Inf(1))},
			}}
		})), "session_id", "failure.code", "replay", "policy.backoff.multiplier", "policy.backoff.jitter_ratio"),

		// FailedStep: the wire.
		truncatedRow(fs, rawUnary(fs, truncated)),
		tooLarge(fs, callFailed(with(func(r *retrydv1.FailedStepRequest) { r.Failure.Message = long(maxRecv) }))),

		// FailedStep: refusals of valid requests by the session's state.
		precondition(fs, "stale step in the same turn", callFailed(failure("s", 5, 4, "p", "SERVER", fast(1))), "STALE_STEP"),
		precondition(fs, "stale turn", callFailed(failure("s", 4, 9, "p", "SERVER", fast(1))), "STALE_STEP"),
		precondition(fs, "turn 0 step 0", callFailed(failure("s", 0, 0, "p", "SERVER", nil)), "STALE_STEP"),
		precondition(fs, "same step, another code", callFailed(failure("s", 5, 5, "p", "TIMEOUT", fast(1))), "STEP_RECORD_CONFLICT"),
		precondition(fs, "same step, another provider", callFailed(failure("s", 5, 5, "q", "SERVER", fast(1))), "STEP_RECORD_CONFLICT"),
		precondition(fs, "same step, another policy", callFailed(failure("s", 5, 5, "p", "SERVER", fast(2))), "STEP_RECORD_CONFLICT"),
		precondition(fs, "same step, another message", callFailed(func() *retrydv1.FailedStepRequest {
			r := failure("s", 5, 5, "p", "SERVER", fast(1))
			r.Failure.Message = "provider said no again"
			return r
		}()), "STEP_RECORD_CONFLICT"),
		precondition(fs, "next step while a retry is pending", callFailed(failure("p", 2, 1, "p", "SERVER", nil)), "RETRY_PENDING"),
		precondition(fs, "follow-up of a cancelled delegation", callFailed(func() *retrydv1.FailedStepRequest {
			r := failure("d", 1, 1, "p", "SERVER", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS})
			r.Downstream = retrydv1.Downstream_DOWNSTREAM_DECLINED
			return r
		}()), "DELEGATION_CANCELLED"),

		// FailedStep: valid requests that must not be mistaken for bad ones.
		{rpc: fs, name: "replay of the recorded step (not an error)", call: callFailed(failure("s", 5, 5, "p", "SERVER", fast(1))),
			code: codes.OK, check: func(st *protected, resp proto.Message) error {
				if !proto.Equal(resp, st.sResp) {
					return fmt.Errorf("replay answered %v, want the recorded %v", resp, st.sResp)
				}
				return nil
			}},
		{rpc: fs, name: "deadline long past (not an error)", call: callFailed(func() *retrydv1.FailedStepRequest {
			r := failure("far-past", 1, 1, "p", "SERVER", nil)
			r.Deadline = timestamppb.New(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC))
			return r
		}()), code: codes.OK, session: "far-past", check: wantDeadline},
		{rpc: fs, name: "deadline at the earliest timestamp (not an error)", call: callFailed(func() *retrydv1.FailedStepRequest {
			r := failure("year-one", 1, 1, "p", "SERVER", nil)
			r.Deadline = &timestamppb.Timestamp{Seconds: year1}
			return r
		}()), code: codes.OK, session: "year-one", check: wantDeadline},

		// AwaitRetry.
		invalid(ar, "empty retry id", callAwait(""), "retry_id"),
		invalid(ar, "retry id with spaces and punctuation", callAwait("not a retry id!"), "retry_id"),
		invalid(ar, "retry id as a path", callAwait("../../etc/passwd"), "retry_id"),
		invalid(ar, "retry id of 65 bytes", callAwait(strings.Repeat("A", 65)), "retry_id"),
		invalid(ar, "retry id with NUL", callAwait("ABC\x00"), "retry_id"),
		invalid(ar, "retry id with a non-ASCII letter", callAwait("ÄBC"), "retry_id"),
		notFound(ar, "unknown well-formed retry id", callAwait(wellFormedUnknown)),
		{rpc: ar, name: "pending retry id in lower case", call: func(ctx context.Context, h *harness, st *protected) (proto.Message, error) {
			return callAwait(strings.ToLower(st.pendingID))(ctx, h, st)
		}, code: codes.NotFound},
		notUTF8Row(ar, "retry id not UTF-8", rawStream(ar, appendBytesField(&retrydv1.AwaitRetryRequest{}, 1, notUTF8))),
		tooLarge(ar, callAwait(long(maxRecv))),

		// CancelRetries.
		invalid(cr, "no target", callCancel(&retrydv1.CancelRetriesRequest{}), "target"),
		invalid(cr, "empty retry id", callCancel(cancelID("")), "retry_id"),
		invalid(cr, "malformed retry id", callCancel(cancelID("retry/1;DROP")), "retry_id"),
		invalid(cr, "retry id of 65 bytes", callCancel(cancelID(strings.Repeat("A", 65))), "retry_id"),
		notFound(cr, "unknown well-formed retry id", callCancel(cancelID(wellFormedUnknown))),
		notUTF8Row(cr, "retry id not UTF-8", rawUnary(cr, appendBytesField(&retrydv1.CancelRetriesRequest{}, 1, notUTF8))),
		invalid(cr, "empty session id", callCancel(cancelSession("")), "session_id"),
		invalid(cr, "session id with a control character", callCancel(cancelSession("p\x07")), "session_id"),
		invalid(cr, "session id of 257 bytes", callCancel(cancelSession(long(257))), "session_id"),
		notFound(cr, "unknown session", callCancel(cancelSession("never-seen"))),
		notUTF8Row(cr, "session id not UTF-8", rawUnary(cr, appendBytesField(&retrydv1.CancelRetriesRequest{}, 2, notUTF8))),
		tooLarge(cr, callCancel(cancelSession(long(maxRecv)))),

		// StepSucceeded.
		invalid(ss, "empty session id", callSucceeded(&retrydv1.StepSucceededRequest{Turn: 6, Step: 1}), "session_id"),
		invalid(ss, "session id with a control character", callSucceeded(&retrydv1.StepSucceededRequest{SessionId: "s\x1b", Turn: 6, Step: 1}), "session_id"),
		invalid(ss, "session id of 257 bytes", callSucceeded(&retrydv1.StepSucceededRequest{SessionId: long(257), Turn: 6, Step: 1}), "session_id"),
		invalid(ss, "provider with a control character", callSucceeded(&retrydv1.StepSucceededRequest{SessionId: "s", Turn: 6, Step: 1, Provider: "p\x00"}), "provider"),
		invalid(ss, "provider of 257 bytes", callSucceeded(&retrydv1.StepSucceededRequest{SessionId: "s", Turn: 6, Step: 1, Provider: long(257)}), "provider"),
		notUTF8Row(ss, "session id not UTF-8", rawUnary(ss, appendBytesField(&retrydv1.StepSucceededRequest{Turn: 6, Step: 1}, 1, notUTF8))),
		notUTF8Row(ss, "provider not UTF-8", rawUnary(ss, appendBytesField(&retrydv1.StepSucceededRequest{SessionId: "s", Turn: 6, Step: 1}, 4, notUTF8))),
		precondition(ss, "stale step", callSucceeded(&retrydv1.StepSucceededRequest{SessionId: "s", Turn: 4, Step: 1}), "STALE_STEP"),
		precondition(ss, "while a retry is pending", callSucceeded(&retrydv1.StepSucceededRequest{SessionId: "p", Turn: 1, Step: 1}), "RETRY_PENDING"),
		tooLarge(ss, callSucceeded(&retrydv1.StepSucceededRequest{SessionId: long(maxRecv)})),
		{rpc: ss, name: "unknown session (not an error, records nothing)",
			call: callSucceeded(&retrydv1.StepSucceededRequest{SessionId: "never-seen", Turn: 1, Step: 1}),
			code: codes.OK, check: func(_ *protected, resp proto.Message) error {
				if got := resp.(*retrydv1.StepSucceededResponse); len(got.GetClosed()) != 0 {
					return fmt.Errorf("success on an unknown session closed %v", got.GetClosed())
				}
				return nil
			}},

		// GetChains.
		invalid(gc, "empty session id", callChains(""), "session_id"),
		invalid(gc, "session id with a control character", callChains("s\u009b"), "session_id"),
		invalid(gc, "session id of 257 bytes", callChains(long(257)), "session_id"),
		notFound(gc, "unknown session", callChains("never-seen")),
		notUTF8Row(gc, "session id not UTF-8", rawUnary(gc, appendBytesField(&retrydv1.GetChainsRequest{}, 1, notUTF8))),
		truncatedRow(gc, rawUnary(gc, mustBytes(&retrydv1.GetChainsRequest{SessionId: "s"})[:2])),
		tooLarge(gc, callChains(long(maxRecv))),

		// WatchEvents.
		invalid(we, "session id with a control character", callWatch(&retrydv1.WatchEventsRequest{SessionId: "s\x00", StopAtEnd: true}), "session_id"),
		invalid(we, "session id of 257 bytes", callWatch(&retrydv1.WatchEventsRequest{SessionId: long(257), StopAtEnd: true}), "session_id"),
		notUTF8Row(we, "session id not UTF-8", rawStream(we, appendBytesField(&retrydv1.WatchEventsRequest{StopAtEnd: true}, 1, notUTF8))),
		tooLarge(we, callWatch(&retrydv1.WatchEventsRequest{SessionId: long(maxRecv), StopAtEnd: true})),
	}
}

// wantDeadline checks a FailedStep answer is delegate DEADLINE.
func wantDeadline(_ *protected, resp proto.Message) error {
	d := resp.(*retrydv1.FailedStepResponse).GetDecision()
	if got := d.GetDelegate().GetReason(); got != retrydv1.DelegateReason_DELEGATE_REASON_DEADLINE {
		return fmt.Errorf("decision %v, want delegate DEADLINE", d)
	}
	return nil
}

// TestHostileRequests sends malformed, oversized, undecodable and
// state-violating requests to every RPC. Each gets exactly its documented
// status (and, for INVALID_ARGUMENT, exactly the bad field paths), and after
// each one the whole event log and the protected sessions' chains are
// exactly as before.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	rows := hostileRows()
	rpcs := map[string]int{}
	for _, r := range rows {
		rpcs[r.rpc]++
	}
	for _, rpc := range []string{"FailedStep", "AwaitRetry", "CancelRetries", "StepSucceeded", "GetChains", "WatchEvents"} {
		if rpcs[rpc] == 0 {
			t.Errorf("no hostile request for %s", rpc)
		}
	}
	if len(rows) < 60 {
		t.Errorf("%d rows, want at least 60", len(rows))
	}
	eachBackend(t, harnessOpts{policies: "policies:\n  relay:\n    mode: schedule\n"}, func(t *testing.T, h *harness) {
		st := &protected{sResp: h.fail(failure("s", 5, 5, "p", "SERVER", fast(1)))}
		h.start(st.sResp.GetDecision().GetSchedule().GetRetryId())
		st.pendingID = h.schedule(failure("p", 1, 1, "p", "SERVER", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(3_600_000), MaxDelayMs: proto.Uint64(3_600_000), JitterRatio: proto.Float64(0),
		}})).GetRetryId()
		always := h.fail(failure("d", 1, 1, "p", "SERVER", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS}))
		if got := always.GetDecision().GetDelegate().GetReason(); got != retrydv1.DelegateReason_DELEGATE_REASON_DOWNSTREAM_FIRST {
			t.Fatalf("always mode: %v, want downstream_first", always.GetDecision())
		}
		if resp, err := h.client.CancelRetries(context.Background(), cancelSession("d")); err != nil || resp.GetDelegationsCancelled() != 1 {
			t.Fatalf("cancelling d's delegation: %v %v", resp, err)
		}

		log := h.events("")
		chains := h.chains()
		for _, row := range rows {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := row.call(ctx, h, st)
			cancel()
			label := row.rpc + "/" + row.name
			row.assert(t, label, st, resp, err)

			after := h.events("")
			if row.session != "" {
				// The one decision of a valid request, in its own session.
				if n := len(after) - len(log); n != 1 || after[len(after)-1].GetSessionId() != row.session {
					t.Errorf("%s: recorded %v, want one event of session %q", label, after[min(len(log), len(after)):], row.session)
				} else {
					after = after[:len(log)]
				}
			}
			if !slices.EqualFunc(after, log, func(a, b *retrydv1.Event) bool { return proto.Equal(a, b) }) {
				t.Errorf("%s changed the event log:\nbefore %v\nafter  %v", label, log, h.events(""))
			}
			if got := h.chains(); !slices.EqualFunc(got, chains, func(a, b *retrydv1.GetChainsResponse) bool { return proto.Equal(a, b) }) {
				t.Errorf("%s changed the protected sessions:\nbefore %v\nafter  %v", label, chains, got)
			}
			log = h.events("")
		}
	})
}

// chains snapshots the protected sessions.
func (h *harness) chains() []*retrydv1.GetChainsResponse {
	h.t.Helper()
	out := make([]*retrydv1.GetChainsResponse, 0, len(protectedSessions))
	for _, s := range protectedSessions {
		resp, err := h.client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: s})
		if err != nil {
			h.t.Fatalf("GetChains(%s): %v", s, err)
		}
		out = append(out, resp)
	}
	return out
}

// assert checks one row's answer.
func (row hostileRow) assert(t *testing.T, label string, st *protected, resp proto.Message, err error) {
	t.Helper()
	s := status.Convert(err)
	if s.Code() != row.code {
		t.Errorf("%s: %v (%.200q), want %v", label, s.Code(), s.Message(), row.code)
		return
	}
	if len(s.Message()) > 2*maxDescription {
		t.Errorf("%s: status message of %d bytes echoes the request", label, len(s.Message()))
	}
	switch row.code {
	case codes.OK:
		if row.check != nil {
			if err := row.check(st, resp); err != nil {
				t.Errorf("%s: %v", label, err)
			}
		}
	case codes.InvalidArgument:
		var got []string
		for _, d := range s.Details() {
			br, ok := d.(*errdetails.BadRequest)
			if !ok {
				continue
			}
			for _, v := range br.GetFieldViolations() {
				got = append(got, v.GetField())
				if v.GetDescription() == "" || len(v.GetDescription()) > maxDescription {
					t.Errorf("%s: %s: description of %d bytes", label, v.GetField(), len(v.GetDescription()))
				}
			}
		}
		if !slices.Equal(got, row.fields) {
			t.Errorf("%s: BadRequest names %q, want exactly %q (%s)", label, got, row.fields, s.Message())
		}
		if want := "invalid request: " + row.fields[0] + ": "; !strings.HasPrefix(s.Message(), want) {
			t.Errorf("%s: message %q, want it to start %q", label, s.Message(), want)
		}
	case codes.FailedPrecondition:
		_, info := errorInfo(t, err)
		if info.GetReason() != row.reason || info.GetDomain() != "retryd.dev" {
			t.Errorf("%s: ErrorInfo %v, want reason %s in retryd.dev", label, info, row.reason)
		}
		if row.reason == "RETRY_PENDING" && info.GetMetadata()["retry_id"] != st.pendingID {
			t.Errorf("%s: ErrorInfo names retry %q, want the pending %q", label, info.GetMetadata()["retry_id"], st.pendingID)
		}
	}
	if row.message != "" && s.Message() != row.message {
		t.Errorf("%s: message %.200q, want %q", label, s.Message(), row.message)
	}
	if !strings.HasPrefix(s.Message(), row.prefix) || !strings.HasSuffix(s.Message(), row.suffix) {
		t.Errorf("%s: message %.200q, want %q…%q", label, s.Message(), row.prefix, row.suffix)
	}
}
