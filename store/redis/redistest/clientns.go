package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/retryd/retryd/internal/retrydtest"
	"golang.org/x/sys/unix"
)

// ClientNet is a network namespace for agents: the test's processes (the
// retryd replicas) listen on addresses that exist only on one veth pair
// each between the test's namespace and this one, and an agent of the
// test process dials from inside it (Dial), so a test can cut one
// replica's path from its agents and leave the others. Addresses are
// 10.249.X.Y; the namespace and its veths are deleted at cleanup.
type ClientNet struct {
	ns    string
	paths []netPath
}

// StartClientNet builds a client namespace with paths veth paths. It
// skips the test when the process is not root or `ip netns` does not
// work here.
func StartClientNet(t testing.TB, paths int) *ClientNet {
	t.Helper()
	retrydtest.EndToEnd(t, NetworkFaults)
	if os.Geteuid() != 0 {
		t.Skip("not root: building network namespaces needs root; skipping the network fault tests")
	}
	retrydtest.NeedProgram(t, "ip", "apt-get install -y iproute2")
	n := netSeq.Add(1)
	subnet, release := claimSubnet(t, n, "10.249")
	defer release()
	c := &ClientNet{ns: fmt.Sprintf("retrydtest-c%d-%d", os.Getpid(), n)}
	if out, err := exec.Command("ip", "netns", "add", c.ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add does not work here (%v: %s); skipping the network fault tests", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", c.ns).Run() })
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "exec", c.ns, "ip", "link", "set", "lo", "up")
	for i := range paths {
		p := netPath{
			host:  fmt.Sprintf("rc%d-%dh%d", os.Getpid()%100000, n%100, i),
			inner: fmt.Sprintf("rc%d-%dc%d", os.Getpid()%100000, n%100, i),
			addr:  fmt.Sprintf("10.249.%d.%d", subnet, 4*i+1), // the test's end
		}
		run("link", "add", p.host, "type", "veth", "peer", "name", p.inner)
		t.Cleanup(func() { exec.Command("ip", "link", "delete", p.host).Run() })
		run("link", "set", p.inner, "netns", c.ns)
		run("addr", "add", p.addr+"/30", "dev", p.host)
		run("link", "set", p.host, "up")
		run("netns", "exec", c.ns, "ip", "addr", "add", fmt.Sprintf("10.249.%d.%d/30", subnet, 4*i+2), "dev", p.inner)
		run("netns", "exec", c.ns, "ip", "link", "set", p.inner, "up")
		c.paths = append(c.paths, p)
	}
	release()
	for i, p := range c.paths {
		checkRoute(t, fmt.Sprintf("10.249.%d.%d", subnet, 4*i+2), p.host)
	}
	return c
}

// Listen returns the address a process of the test listens on to be
// reached over path i (host:0, any port).
func (c *ClientNet) Listen(i int) string { return c.paths[i].addr + ":0" }

// Dial connects to addr from inside the client namespace: the socket is
// made on a thread that entered the namespace, and keeps it.
func (c *ClientNet) Dial(ctx context.Context, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer own.Close()
	target, err := os.Open("/var/run/netns/" + c.ns)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("redistest: entering %s: %w", c.ns, err)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if rerr := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); rerr != nil {
		// The thread stays in the wrong namespace: leave it locked, so
		// that it ends with this goroutine instead of serving others.
		return conn, err
	}
	runtime.UnlockOSThread()
	return conn, err
}

// Cut makes path i drop every packet silently: its end in the test's
// namespace goes down, so what the agents send is discarded by the veth
// and nothing answers them; connections already open stall.
func (c *ClientNet) Cut(t testing.TB, i int) {
	if out, err := exec.Command("ip", "link", "set", c.paths[i].host, "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s down: %v: %s", c.paths[i].host, err, out)
	}
}

// Heal brings path i back.
func (c *ClientNet) Heal(t testing.TB, i int) {
	if out, err := exec.Command("ip", "link", "set", c.paths[i].host, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s up: %v: %s", c.paths[i].host, err, out)
	}
}
