package redis_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// TestClientCutFromReplica: the path between the agents and one of two
// replicas drops every packet silently (the replicas and Redis stay
// connected) under the fleet load through the Go client. With gRPC
// keepalive on the client (a ping after 1 s without traffic, dead after
// 1 s more unanswered) and the replicas allowing pings that often
// (--keepalive-min-time 1s), the client drops the cut connection within
// seconds and sends every call, and every AwaitRetry re-attach, to the
// other replica: the agents go on deciding, whatever either replica
// acknowledged is what the log holds, no retry starts twice, and the
// invariant checker passes. Without keepalive a silent cut holds each call
// on the cut connection until the agent's deadline.
func TestClientCutFromReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: cuts the agents' path to a replica for seconds")
	}
	redisSrv := redistest.Start(t)
	cn := redistest.StartClientNet(t, 2)
	replica := func(i int) *retrydtest.Server {
		return retrydtest.Start(t, "--store", redisSrv.URL(0), "--listen", cn.Listen(i),
			"--keepalive-min-time", "1s")
	}
	cut, other := replica(0), replica(1)
	r := manual.NewBuilderWithScheme("retryd-cut")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: cut.Addr}, {Addr: other.Addr}}})
	client, err := retryd.New(r.Scheme()+":///replicas", retryd.WithInsecure(),
		retryd.WithDialOptions(grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(`{
			"loadBalancingConfig": [{"round_robin": {}}],
			"healthCheckConfig": {"serviceName": "retryd.v1.RetryService"}
		}`),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return cn.Dial(ctx, addr) }),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: time.Second, Timeout: time.Second, PermitWithoutStream: true})),
		retryd.WithReattachBackoff(20*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	l := startLoad(t, client, 8)
	time.Sleep(time.Second)
	before := l.calls.Load()
	cn.Cut(t, 0)
	cutAt := time.Now()
	// Within 3 s every agent has met the cut replica (round robin) and,
	// without keepalive, waits there; with it, they have moved on.
	time.Sleep(3 * time.Second)
	settled := l.calls.Load()
	time.Sleep(3 * time.Second)
	during := l.calls.Load() - settled
	t.Logf("%d calls answered 3–6 s after the cut (%d before it), %d repeated after UNAVAILABLE in all",
		during, before, l.repeats.Load())
	if during == 0 {
		t.Error("no call was answered 3–6 s after the cut: the agents wait on the cut replica")
	}
	runLoad(l)
	t.Logf("the load ended %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	l.check(other.Conn(t))
}

// TestClientDefaultKeepalive: the Go client's default keepalive (a ping
// after retryd.KeepaliveTime without traffic, the connection closed when
// none is answered within retryd.KeepaliveTimeout, which gRPC also sets as
// the socket's TCP user timeout) finds a path to a replica that went
// silent. Four agents call FailedStep through the client (its defaults:
// round_robin, gRPC's retries, keepalive) over two replicas on the
// replicas' default --keepalive-min-time, with an agent's deadline of a
// minute; the path to one replica drops every packet. The calls held on
// the cut connection end no sooner than KeepaliveTimeout and within
// KeepaliveTime + KeepaliveTimeout of the cut (plus slack), answered by
// the other replica, and no call waits for the deadline, as every call on
// the cut connection would without keepalive.
func TestClientDefaultKeepalive(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits for the client's default keepalive, 30 s")
	}
	redisSrv := redistest.Start(t)
	cn := redistest.StartClientNet(t, 2)
	replica := func(i int) *retrydtest.Server {
		return retrydtest.Start(t, "--store", redisSrv.URL(0), "--listen", cn.Listen(i))
	}
	cut, other := replica(0), replica(1)
	r := manual.NewBuilderWithScheme("retryd-keepalive")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: cut.Addr}, {Addr: other.Addr}}})
	client, err := retryd.New(r.Scheme()+":///replicas", retryd.WithInsecure(),
		retryd.WithDialOptions(grpc.WithResolvers(r),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return cn.Dial(ctx, addr) })))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	type call struct {
		start, end time.Time
		err        error
	}
	var mu sync.Mutex
	var calls []call
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				start := time.Now()
				_, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{SessionId: fmt.Sprintf("ka-w%d-%d", w, i),
					Turn: 1, Step: 1, Provider: "p", Failure: &retrydv1.Failure{Code: "SERVER"}})
				cancel()
				mu.Lock()
				calls = append(calls, call{start, time.Now(), err})
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	time.Sleep(time.Second)
	cn.Cut(t, 0)
	cutAt := time.Now()
	detect := retryd.KeepaliveTime + retryd.KeepaliveTimeout
	const slack = 5 * time.Second
	time.Sleep(detect + slack)
	close(stop)
	wg.Wait()

	var held []time.Duration
	for _, c := range calls {
		if c.err != nil {
			t.Errorf("a call made %v after the cut: %v, want an answer from the other replica",
				c.start.Sub(cutAt).Round(time.Millisecond), c.err)
		}
		if took := c.end.Sub(c.start); took > 2*time.Second {
			held = append(held, c.end.Sub(cutAt))
		}
	}
	slices.Sort(held)
	t.Logf("%d calls, %d held on the cut connection, which ended %s after the cut", len(calls), len(held), quantiles(held))
	if len(held) == 0 {
		t.Fatal("no call was held on the cut connection: the cut did not hit the client's path")
	}
	if last := held[len(held)-1]; last > detect+slack {
		t.Errorf("a held call ended %v after the cut, want within %v + %v", last.Round(time.Millisecond), detect, slack)
	}
	// The keepalive's timeout, not something sooner, ended them: gRPC
	// sets it as the socket's TCP user timeout too, so the kernel gives
	// up on the held calls' unacknowledged bytes after KeepaliveTimeout.
	if first := held[0]; first < retryd.KeepaliveTimeout-time.Second {
		t.Errorf("a held call ended %v after the cut, before the keepalive's timeout %v", first.Round(time.Millisecond), retryd.KeepaliveTimeout)
	}
}
