package redistest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
)

// NetServer is a redis-server in a network namespace of its own, reached
// from the test's namespace over one veth pair per path: each path has
// its own address of the server, so a test can cut one path (one
// replica's) and leave the others. Addresses are 10.250.X.Y, which exist
// only on these veths; the namespace and its veths are deleted at cleanup.
type NetServer struct {
	ns    string
	paths []netPath
	proc  *process
}

// netPath is one veth pair: host is its end in the test's namespace,
// inner its end in the server's, addr the server's address on it.
type netPath struct {
	host, inner, addr string
	// undelay ends the path's delay (see Delay), loss is its loss.
	undelay func(testing.TB)
	loss    float64
}

// redisPort is the port of a namespaced server: the namespace is its own,
// so no other process can hold the port.
const redisPort = 6379

// netSeq numbers the namespaces of this process.
var netSeq atomic.Int64

// NetworkFaults names the suites that build network namespaces between
// retryd and Redis (this file, clientns.go and storenet.go) to cut, slow
// and drop their paths. They need root, take minutes and measure latencies
// over those paths, so they run with the end-to-end suites
// (retrydtest.EndToEnd), where the machine is not also compiling and
// running every other package's tests.
const NetworkFaults = "network faults between retryd and Redis, in network namespaces"

// StartInNamespace starts a redis-server without persistence in a new
// network namespace with paths veth paths to it. It skips the test when
// the process is not root or `ip netns` does not work here.
func StartInNamespace(t testing.TB, paths int) *NetServer {
	t.Helper()
	retrydtest.EndToEnd(t, NetworkFaults)
	Skip(t)
	if os.Geteuid() != 0 {
		t.Skip("not root: building network namespaces needs root; skipping the network fault tests")
	}
	retrydtest.NeedProgram(t, "ip", "apt-get install -y iproute2")
	retrydtest.NeedProgram(t, "iptables", "apt-get install -y iptables")
	n := netSeq.Add(1)
	// A subnet no other namespace uses (see claimSubnet), held until the
	// paths' addresses are added.
	subnet, release := claimSubnet(t, n, "10.250")
	defer release()
	s := &NetServer{ns: fmt.Sprintf("retrydtest-%d-%d", os.Getpid(), n)}
	if out, err := exec.Command("ip", "netns", "add", s.ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add does not work here (%v: %s); skipping the network fault tests", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", s.ns).Run() })
	s.ip(t, "link", "set", "lo", "up")
	for i := range paths {
		p := netPath{
			host:  fmt.Sprintf("rt%d-%dh%d", os.Getpid()%100000, n%100, i),
			inner: fmt.Sprintf("rt%d-%dr%d", os.Getpid()%100000, n%100, i),
			addr:  fmt.Sprintf("10.250.%d.%d", subnet, 4*i+2),
		}
		hostAddr := fmt.Sprintf("10.250.%d.%d/30", subnet, 4*i+1)
		run := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
		run("link", "add", p.host, "type", "veth", "peer", "name", p.inner)
		t.Cleanup(func() { exec.Command("ip", "link", "delete", p.host).Run() })
		run("link", "set", p.inner, "netns", s.ns)
		run("addr", "add", hostAddr, "dev", p.host)
		run("link", "set", p.host, "up")
		s.ip(t, "addr", "add", p.addr+"/30", "dev", p.inner)
		s.ip(t, "link", "set", p.inner, "up")
		s.paths = append(s.paths, p)
	}
	release()
	for _, p := range s.paths {
		checkRoute(t, p.addr, p.host)
	}
	var binds []string
	for _, p := range s.paths {
		binds = append(binds, p.addr)
	}
	script := fmt.Sprintf(`ip netns exec %s redis-server --save '' --appendonly no --protected-mode no --port %d --bind '%s' >/dev/null 2>&1 &
pid=$!
echo "pid $pid"
read _
kill $pid
wait $pid`, s.ns, redisPort, strings.Join(binds, " "))
	cmd := exec.Command("sh", "-c", script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("redistest: starting redis-server in %s: %v", s.ns, err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	s.proc = &process{cmd: cmd, stdin: stdin, pid: pid}
	t.Cleanup(s.proc.stop)
	if err != nil {
		t.Fatalf("redistest: redis-server in %s did not start", s.ns)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range s.paths {
		for {
			err := ping(fmt.Sprintf("%s:%d", p.addr, redisPort))
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: redis-server in %s does not answer PING on %s: %v", s.ns, p.addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return s
}

// ip runs ip with args inside the server's namespace.
func (s *NetServer) ip(t testing.TB, args ...string) {
	t.Helper()
	args = append([]string{"netns", "exec", s.ns, "ip"}, args...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Addr returns the server's host:port on path i.
func (s *NetServer) Addr(i int) string { return fmt.Sprintf("%s:%d", s.paths[i].addr, redisPort) }

// URL returns the server's redis:// URL for database db over path i.
func (s *NetServer) URL(i, db int) string { return "redis://" + s.Addr(i) + "/" + strconv.Itoa(db) }

// Cut makes path i drop every packet silently: its end in the server's
// namespace goes down, so the veth discards what the test's side sends
// (counted as dropped on that side) and nothing answers, neither a reply
// nor a reset nor an ICMP error. Connections already open stay open and
// stall, as on a partitioned network.
func (s *NetServer) Cut(t testing.TB, i int) { s.ip(t, "link", "set", s.paths[i].inner, "down") }

// Heal brings path i back: packets flow again and stalled connections
// resume.
func (s *NetServer) Heal(t testing.TB, i int) { s.ip(t, "link", "set", s.paths[i].inner, "up") }
