package retryd_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// testServer is one real retryd process with a raw connection (for
// Verify and for reading state behind the client's back) and a client.
type testServer struct {
	srv    *retrydtest.Server
	conn   *grpc.ClientConn
	client *retryd.Client
}

// startServer starts retryd with args and a client for it created by New;
// everything stops at cleanup.
func startServer(t *testing.T, args ...string) *testServer {
	t.Helper()
	srv := retrydtest.Start(t, args...)
	client, err := retryd.New(srv.Addr, retryd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return &testServer{srv: srv, conn: srv.Conn(t), client: client}
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// backoffPolicy is a normal-mode policy without jitter, so every delay is
// exact: retry n waits initialMs * 2^(n-1).
func backoffPolicy(initialMs uint64, maxRetries uint32) *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{
		Mode:       retrydv1.Mode_MODE_NORMAL,
		MaxRetries: proto.Uint32(maxRetries),
		Backoff: &retrydv1.Backoff{
			InitialDelayMs: proto.Uint64(initialMs),
			JitterRatio:    proto.Float64(0),
		},
	}
}

// failedStep is a retryable failure of (turn, step) served by provider
// "anthropic" under policy p.
func failedStep(session string, turn, step uint64, p *retrydv1.RetryPolicy) *retrydv1.FailedStepRequest {
	return &retrydv1.FailedStepRequest{
		SessionId:    session,
		Turn:         turn,
		Step:         step,
		Provider:     "anthropic",
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: p},
		Failure:      &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429, Message: "slow down"},
	}
}

// waitAwaiters polls GetChains until the session's latest retry has n
// connected AwaitRetry streams.
func waitAwaiters(t *testing.T, conn grpc.ClientConnInterface, session string, n uint32) {
	t.Helper()
	rpc := retrydv1.NewRetryServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := rpc.GetChains(t.Context(), &retrydv1.GetChainsRequest{SessionId: session})
		if err != nil && status.Code(err) != codes.NotFound { // NotFound: not reported yet
			t.Fatalf("GetChains: %v", err)
		}
		for _, c := range resp.GetChains() {
			if c.GetLatest().GetStatus() == retrydv1.RetryStatus_RETRY_STATUS_PENDING && c.GetLatest().GetAwaiters() == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: no pending retry with %d awaiters after 30s: %v", session, n, resp)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitRetryStatus polls GetChains until the session's latest retry has
// status want.
func waitRetryStatus(t *testing.T, conn grpc.ClientConnInterface, session string, want retrydv1.RetryStatus) {
	t.Helper()
	rpc := retrydv1.NewRetryServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := rpc.GetChains(t.Context(), &retrydv1.GetChainsRequest{SessionId: session})
		if err != nil {
			t.Fatalf("GetChains: %v", err)
		}
		for _, c := range resp.GetChains() {
			if c.GetLatest().GetStatus() == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: latest retry not %v after 30s: %v", session, want, resp)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sessionEvents reads the session's events to the end of the log.
func sessionEvents(t *testing.T, conn grpc.ClientConnInterface, session string) []*retrydv1.Event {
	t.Helper()
	events, err := retrydtest.Events(t.Context(), conn, session)
	if err != nil {
		t.Fatalf("reading %s's events: %v", session, err)
	}
	return events
}

// kindCounts counts events by kind: scheduled, delegated, started,
// cancelled, closed.
func kindCounts(events []*retrydv1.Event) map[string]int {
	out := make(map[string]int)
	for _, ev := range events {
		switch ev.GetKind().(type) {
		case *retrydv1.Event_Scheduled:
			out["scheduled"]++
		case *retrydv1.Event_Delegated:
			out["delegated"]++
		case *retrydv1.Event_Started:
			out["started"]++
		case *retrydv1.Event_Cancelled:
			out["cancelled"]++
		case *retrydv1.Event_Closed:
			out["closed"]++
		}
	}
	return out
}

// tcpProxy forwards loopback TCP connections to a server and can sever
// every connection open at the time, to break streams in flight. New
// connections are accepted and forwarded as before.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	conns    []net.Conn
	accepted int
	closed   bool
	refusing bool
	wg       sync.WaitGroup
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		ln.Close()
		p.sever()
		p.wg.Wait()
	})
	return p
}

// Addr is the address clients dial instead of the server's.
func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refusing := p.refusing
		p.mu.Unlock()
		if refusing {
			down.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			down.Close()
			up.Close()
			return
		}
		p.conns = append(p.conns, down, up)
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

func (p *tcpProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src) // ends with an error once severed
	dst.Close()
	src.Close()
}

// sever closes every connection forwarded so far.
func (p *tcpProxy) sever() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// refuse makes the proxy close new connections at once (true) or forward
// them again (false).
func (p *tcpProxy) refuse(on bool) {
	p.mu.Lock()
	p.refusing = on
	p.mu.Unlock()
}

// Accepted reports how many client connections the proxy forwarded.
func (p *tcpProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}
