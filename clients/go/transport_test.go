package retryd_test

import (
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
)

// TestNewDefaultsToTLS: New without a transport option speaks TLS, so it
// cannot talk to a plaintext retryd; WithInsecure, named, can.
func TestNewDefaultsToTLS(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	ctx := testContext(t)

	tlsClient := newClient(t, srv.Addr)
	_, err := tlsClient.GetChains(ctx, "transport-default")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "tls") {
		t.Errorf("GetChains over the default transport to a plaintext server = %v, want UNAVAILABLE from a TLS handshake", err)
	}
	plain := newClient(t, srv.Addr, retryd.WithInsecure())
	if _, err := plain.GetChains(ctx, "transport-default"); status.Code(err) != codes.NotFound {
		t.Errorf("GetChains with WithInsecure = %v, want NOT_FOUND (served)", err)
	}
}

// TestServiceConfigRoundRobin: a target that resolves to two addresses
// gets calls over both (round_robin), where pick_first would use one.
func TestServiceConfigRoundRobin(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	a, b := startProxy(t, srv.Addr), startProxy(t, srv.Addr)
	r := manual.NewBuilderWithScheme("retryd-rr")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: a.Addr()}, {Addr: b.Addr()}}})
	client := newClient(t, r.Scheme()+":///replicas", retryd.WithInsecure(), retryd.WithDialOptions(grpc.WithResolvers(r)))
	ctx := testContext(t)
	for range 20 {
		if _, err := client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "rr", Turn: 1, Step: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if a.Accepted() == 0 || b.Accepted() == 0 {
		t.Errorf("connections: %d to the first address, %d to the second; want both used", a.Accepted(), b.Accepted())
	}
}

// TestExhaustedRetryInfo: a FailedStep that admission control refuses
// (RESOURCE_EXHAUSTED, RetryInfo 1 s) is sent again after the delay and
// succeeds once the bound has room; with WithExhaustedRetries(0) the
// refusal is returned.
func TestExhaustedRetryInfo(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t, "--max-pending-retries-per-tenant", "1")
	ctx := testContext(t)
	client := newClient(t, srv.Addr, retryd.WithInsecure())
	impatient := newClient(t, srv.Addr, retryd.WithInsecure(), retryd.WithExhaustedRetries(0))

	// The bound's one pending retry: 10 s of backoff.
	holder, err := client.FailedStep(ctx, failedStep("exhausted-holder", 1, 1, backoffPolicy(10_000, 2)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = impatient.FailedStep(ctx, failedStep("exhausted-impatient", 1, 1, backoffPolicy(10, 2)))
	if bound, ok := retryd.IsLimitReached(err); !ok {
		t.Fatalf("FailedStep over the bound with WithExhaustedRetries(0) = %v, want LIMIT_REACHED", err)
	} else if delay, _ := retryd.RetryDelay(err); bound != "pending_retries_per_tenant" || delay != time.Second {
		t.Fatalf("refusal: bound %q, RetryInfo %v; want pending_retries_per_tenant, 1s", bound, delay)
	}

	go func() {
		time.Sleep(200 * time.Millisecond)
		_, _ = client.CancelRetry(ctx, holder.GetDecision().GetSchedule().GetRetryId())
	}()
	start := time.Now()
	resp, err := client.FailedStep(ctx, failedStep("exhausted-patient", 1, 1, backoffPolicy(10, 2)))
	if err != nil {
		t.Fatalf("FailedStep honouring RetryInfo: %v", err)
	}
	if resp.GetDecision().GetSchedule() == nil {
		t.Errorf("decision = %v, want a schedule", resp.GetDecision())
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("answered after %v; want at least the 1 s the RetryInfo asked for", took)
	}
}

// BenchmarkServerDecision is one FailedStep decided by a real retryd over
// loopback (a new session each time), for comparison with
// BenchmarkLocalDecision.
func BenchmarkServerDecision(b *testing.B) {
	srv := retrydtest.Start(b)
	client, err := retryd.New(srv.Addr, retryd.WithInsecure())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	ctx := b.Context()
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		n++
		resp, err := client.FailedStep(ctx, failedStep("bench-"+strconv.Itoa(n), 1, 1, backoffPolicy(5_000, 2)))
		if err != nil || resp.GetDecision().GetSchedule() == nil {
			b.Fatalf("FailedStep: %v, %v", resp, err)
		}
	}
}

// cutProxy forwards loopback connections to a server and, when armed,
// closes the connection on which the client next sends anything, without
// forwarding it: the call in flight fails UNAVAILABLE after it left the
// client, which gRPC retries only under a retry policy.
type cutProxy struct {
	ln       net.Listener
	target   string
	armed    atomic.Bool
	accepted atomic.Int32
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				down.Close()
				continue
			}
			p.accepted.Add(1)
			go func() { _, _ = io.Copy(down, up); down.Close() }()
			go func() {
				defer up.Close()
				defer down.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := down.Read(buf)
					if n > 0 && p.armed.CompareAndSwap(true, false) {
						return // drop what the client sent and hang up
					}
					if n > 0 {
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// TestServiceConfigRetriesUnavailable: a FailedStep whose connection
// breaks after the request left the client fails UNAVAILABLE, and the
// service config's retry policy sends it again on a new connection.
func TestServiceConfigRetriesUnavailable(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	p := startCutProxy(t, srv.Addr)
	client := newClient(t, p.ln.Addr().String(), retryd.WithInsecure())
	ctx := testContext(t)
	if _, err := client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{SessionId: "cut", Turn: 1, Step: 1}); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	resp, err := client.FailedStep(ctx, failedStep("cut", 1, 2, backoffPolicy(10, 2)))
	if err != nil {
		t.Fatalf("FailedStep over a connection cut mid-call: %v; want gRPC to retry it", err)
	}
	if resp.GetDecision().GetSchedule() == nil || p.armed.Load() || p.accepted.Load() != 2 {
		t.Errorf("decision %v, armed %v, %d connections; want a schedule after a cut and a second connection",
			resp.GetDecision(), p.armed.Load(), p.accepted.Load())
	}
}
