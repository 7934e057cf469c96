package redis_test

import (
	"context"
	"net"
	"testing"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
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
