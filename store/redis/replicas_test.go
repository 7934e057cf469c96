package redis_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/protobuf/proto"
)

// awaitStream opens AwaitRetry and returns the stream after its state
// message.
func awaitStream(ctx context.Context, t *testing.T, c retrydv1.RetryServiceClient, retryID string) retrydv1.RetryService_AwaitRetryClient {
	t.Helper()
	stream, err := c.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: retryID})
	if err != nil {
		t.Fatalf("AwaitRetry: %v", err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetState() == nil {
		t.Fatalf("AwaitRetry first message: %v %v", first, err)
	}
	return stream
}

// scheduleFixed reports step 1 of session failing on c with a policy of
// one fixed delay, and returns the scheduled retry's id.
func scheduleFixed(ctx context.Context, t *testing.T, c retrydv1.RetryServiceClient, session string, delayMs uint64) string {
	t.Helper()
	resp, err := c.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: session, Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(delayMs), MaxDelayMs: proto.Uint64(delayMs), JitterRatio: proto.Float64(0)}}},
	})
	if err != nil || resp.GetDecision().GetSchedule() == nil {
		t.Fatalf("FailedStep %s: %v %v", session, resp, err)
	}
	return resp.GetDecision().GetSchedule().GetRetryId()
}

// terminal reads the terminal message and the end of the stream.
func terminal(stream retrydv1.RetryService_AwaitRetryClient) (*retrydv1.AwaitRetryResponse, error) {
	term, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return nil, errors.New("no end of stream after the terminal message")
	}
	return term, nil
}

// TestReplicas runs three retryd processes over one Redis (in each key
// layout, and over a Redis Cluster): a retry scheduled on A starts once
// for awaiters on B and C, a cancellation on C reaches an awaiter on A, and
// B's event log holds everything in order.
func TestReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three retryd processes")
	}
	t.Parallel()
	eachLayout(t, testReplicas)
}

func testReplicas(t *testing.T, url string, gapless bool) {
	var replicas [3]retrydv1.RetryServiceClient
	var servers [3]*retrydtest.Server
	for i := range replicas {
		servers[i] = retrydtest.Start(t, "--store", url)
		replicas[i] = retrydv1.NewRetryServiceClient(servers[i].Conn(t))
	}
	a, b, c := replicas[0], replicas[1], replicas[2]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p := &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(300), MaxDelayMs: proto.Uint64(10_000), JitterRatio: proto.Float64(0),
	}}
	fail := func(step uint64, pol *retrydv1.RetryPolicy) *retrydv1.Schedule {
		t.Helper()
		resp, err := a.FailedStep(ctx, &retrydv1.FailedStepRequest{
			SessionId: "fleet", Turn: 1, Step: step, Provider: "p",
			Failure:      &retrydv1.Failure{Code: "SERVER"},
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: pol},
		})
		if err != nil || resp.GetDecision().GetSchedule() == nil {
			t.Fatalf("FailedStep on A: %v %v", resp, err)
		}
		return resp.GetDecision().GetSchedule()
	}

	// One retry, awaited on B and C at once: both get the same Started.
	first := fail(1, p)
	var wg sync.WaitGroup
	starts := make([]*retrydv1.AwaitRetryResponse, 2)
	for i, r := range []retrydv1.RetryServiceClient{b, c} {
		stream := awaitStream(ctx, t, r, first.GetRetryId())
		wg.Add(1)
		go func() {
			defer wg.Done()
			term, err := terminal(stream)
			if err != nil {
				t.Errorf("replica %c: %v", 'B'+i, err)
			}
			starts[i] = term
		}()
	}
	wg.Wait()
	if starts[0].GetStarted() == nil || !proto.Equal(starts[0], starts[1]) {
		t.Fatalf("B and C got %v and %v, want the same Started", starts[0], starts[1])
	}

	// A long retry (a chain of its own: another policy) awaited on A,
	// cancelled on C; both chains close.
	long := proto.Clone(p).(*retrydv1.RetryPolicy)
	long.Backoff.InitialDelayMs = proto.Uint64(9_000)
	second := fail(2, long)
	stream := awaitStream(ctx, t, a, second.GetRetryId())
	began := time.Now()
	if _, err := c.CancelRetries(ctx, &retrydv1.CancelRetriesRequest{
		Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "fleet"},
	}); err != nil {
		t.Fatalf("CancelRetries on C: %v", err)
	}
	term, err := terminal(stream)
	delay := time.Since(began)
	if err != nil || term.GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_REQUESTED {
		t.Fatalf("awaiter on A: %v %v, want cancelled (requested)", term, err)
	}
	// Logged, not asserted: BenchmarkCancelPropagation measures it.
	t.Logf("cancel on C reached the awaiter on A after %v (CancelRetries call included)", delay)

	// B's log: every event, in order, exactly one Started.
	events := retrydtest.Verify(t, servers[1].Conn(t))
	var kinds []string
	for i, ev := range events {
		if gapless && ev.GetSequence() != uint64(i+1) {
			t.Errorf("event %d has sequence %d", i, ev.GetSequence())
		}
		switch {
		case ev.GetScheduled() != nil:
			kinds = append(kinds, "scheduled")
		case ev.GetStarted() != nil:
			kinds = append(kinds, "started")
		case ev.GetCancelled() != nil:
			kinds = append(kinds, "cancelled")
		case ev.GetClosed() != nil:
			kinds = append(kinds, "closed")
		default:
			kinds = append(kinds, "other")
		}
	}
	if got, want := strings.Join(kinds, ","), "scheduled,started,scheduled,cancelled,closed,closed"; got != want {
		t.Errorf("events on B: %s, want %s", got, want)
	}
	for _, s := range servers {
		retrydtest.Verify(t, s.Conn(t))
	}

	// Shutdown of B: its awaiter hears Cancelled(shutdown), nothing is
	// recorded, and the retry stays pending for the other replicas.
	third := fail(3, long)
	stream = awaitStream(ctx, t, b, third.GetRetryId())
	if err := servers[1].Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	term, err = terminal(stream)
	if err != nil || term.GetCancelled().GetReason() != retrydv1.CancelReason_CANCEL_REASON_SHUTDOWN {
		t.Fatalf("awaiter on B at shutdown: %v %v, want cancelled (shutdown)", term, err)
	}
	chains, err := c.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "fleet"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains.GetChains() {
		if l := ch.GetLatest(); l.GetRetryId() == third.GetRetryId() && l.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			t.Errorf("retry after B's shutdown: %v, want pending", l)
		}
	}
}

// TestRefusesUnreachableRedis: retryd does not start when its Redis does
// not answer, and says which one.
func TestRefusesUnreachableRedis(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cmd := exec.Command(retrydtest.Binary(t), "serve", "--listen", "127.0.0.1:0", "--store", "redis://"+addr+"/0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), addr) || !strings.Contains(string(out), "PING") {
		t.Errorf("retryd over an unreachable Redis: %v %q, want a refusal naming %s", err, out, addr)
	}
	if strings.Contains(string(out), "msg=serving") {
		t.Errorf("served before refusing:\n%s", out)
	}
}
