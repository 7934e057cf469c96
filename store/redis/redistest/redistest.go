// Package redistest starts throwaway redis-server processes for tests: on
// a free loopback port, stopped by PID; without persistence (Start,
// Shared), or with an append-only file in a directory of the test, to be
// crashed or stopped and restarted on the same port (StartWith), as a
// replica of another (Options.ReplicaOf), and Redis Sentinels that fail a
// master over to its replica (StartSentinels, sentinel.go).
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/loopback"
	"github.com/retryd/retryd/internal/retrydtest"
)

// Server is a running redis-server.
type Server struct {
	// Addr is its host:port.
	Addr string
	host string
	port int
	args []string

	mu   sync.Mutex
	proc *process // nil while stopped
}

// process is one redis-server under its watchdog.
type process struct {
	cmd *exec.Cmd
	// stdin keeps the watchdog alive; closing it (or this process ending)
	// stops the server.
	stdin io.WriteCloser
	// pid is redis-server's own PID: the watchdog reaps it only after its
	// stdin closed, so until then the PID cannot be reused.
	pid int
}

// URL returns the server's redis:// URL for database db.
func (s *Server) URL(db int) string { return "redis://" + s.Addr + "/" + strconv.Itoa(db) }

// Stop stops the server by its PID and waits for it. It does nothing when
// the server is stopped already.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.stop()
		s.proc = nil
	}
}

func (p *process) stop() {
	p.stdin.Close()
	p.cmd.Wait()
}

// Kill sends sig to redis-server and waits until it exited: SIGKILL is a
// crash (what its append-only file's fsync policy did not write is lost),
// SIGTERM a clean shutdown (it writes and fsyncs its data first).
func (s *Server) Kill(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("redistest: redis-server on %s is not running", s.Addr)
	}
	pid := s.proc.pid
	err := syscall.Kill(pid, sig)
	// The watchdog then sends SIGTERM to a process that is exiting or gone
	// (a zombie it has not reaped): neither changes how it ended.
	s.proc.stop()
	s.proc = nil
	if err != nil {
		return fmt.Errorf("redistest: kill -%d %d: %w", sig, pid, err)
	}
	return nil
}

// Restart starts redis-server again on the same port with the same
// options, so a server with an append-only file (StartWith) reloads its
// data. The server must have been stopped or killed.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		t.Fatalf("redistest: redis-server on %s is still running", s.Addr)
	}
	p, err := runAt("", s.host, s.port, s.args)
	if err != nil {
		t.Fatal(err)
	}
	s.proc = p
}

// Impostor starts a standalone redis-server of the test's own on the
// address of s, which must be stopped or killed: empty, with appendonly
// yes and appendfsync always (so that a client asking for durability
// accepts it), another Redis that took a dead server's address, as a new
// pod takes an address handed out again. It is stopped at cleanup.
//
// It refuses SYNC and PSYNC. A replica of the dead server keeps dialling
// its master's address until it is promoted, and would otherwise take a
// full resynchronisation from the impostor: its data replaced by the
// impostor's empty dataset, then promoted with it (when the promotion
// came after the impostor's transfer: one failover in a few). That is
// Redis' replication trusting an address, which a Cluster defends with
// masterauth and requirepass (docs/storage.md); the impostor is here to
// prove what retryd's own connections do.
func (s *Server) Impostor(t testing.TB) *Server {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		t.Fatalf("redistest: redis-server on %s is still running", s.Addr)
	}
	args := []string{"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir(),
		"--rename-command", "SYNC", "", "--rename-command", "PSYNC", ""}
	p, err := runAt("", s.host, s.port, args)
	if err != nil {
		t.Fatal(err)
	}
	imp := &Server{Addr: s.Addr, host: s.host, port: s.port, args: args, proc: p}
	t.Cleanup(imp.Stop)
	return imp
}

// Options configure a server started with StartWith.
type Options struct {
	// Dir is the server's working directory, where its append-only files
	// live; empty means a new temporary directory of the test.
	Dir string
	// AppendOnly turns the append-only file on, with the fsync policy
	// AppendFsync: "always", "everysec" (empty means Redis' default,
	// everysec) or "no".
	AppendOnly  bool
	AppendFsync string
	// ReplicaOf makes the server a replica of that server (--replicaof);
	// StartWith returns once the replica has synced with it.
	ReplicaOf *Server
}

// StartWith starts a redis-server of the test's own with opts, stopped at
// cleanup. Kill and Restart crash or stop it and bring it back on the same
// port and directory.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	Skip(t)
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	args := []string{"--dir", opts.Dir}
	if opts.AppendOnly {
		args = append(args, "--appendonly", "yes")
		if opts.AppendFsync != "" {
			args = append(args, "--appendfsync", opts.AppendFsync)
		}
	}
	if opts.ReplicaOf != nil {
		host, port, err := net.SplitHostPort(opts.ReplicaOf.Addr)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--replicaof", host, port)
	}
	s, err := start(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if opts.ReplicaOf != nil {
		s.waitSynced(t)
	}
	return s
}

// Skip skips the test when redis-server is not installed, or fails it
// when RETRYD_REQUIRE_TOOLS=1 (retrydtest.NeedProgram). Every helper here
// calls it first: give them the test's own t, never a parent's from inside
// a subtest.
func Skip(t testing.TB) {
	t.Helper()
	retrydtest.NeedProgram(t, "redis-server", "apt-get install -y redis-server")
}

// Start starts a redis-server of the test's own, stopped at cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	Skip(t)
	s, err := start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
	prefixes   atomic.Int64
)

// Shared returns one redis-server for the whole test process, started at
// the first call; it stops when the process ends. Give each test its own
// key prefix (Prefix).
func Shared(t testing.TB) *Server {
	t.Helper()
	Skip(t)
	sharedOnce.Do(func() { shared, sharedErr = start() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// Prefix returns a key prefix no other test of this process uses.
func Prefix() string {
	return fmt.Sprintf("t%d-%d:", time.Now().UnixNano(), prefixes.Add(1))
}

// start runs redis-server on a free loopback port (see run), without
// snapshots and, unless args turn it on, without an append-only file. A
// replica's first synchronisation starts at once (not after the 5 s Redis
// waits by default for more replicas to share it).
func start(args ...string) (*Server, error) {
	return startArgs(append([]string{"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"}, args...))
}

// startArgs runs redis-server with exactly args (a configuration file, if
// any, first) on a free loopback port.
func startArgs(args []string) (*Server, error) {
	return startEach(func(string) ([]string, error) { return args, nil })
}

// errExited is a redis-server that ended before it answered PING.
var errExited = errors.New("redis-server exited before it answered PING")

// startTries is how many ports startEach tries.
const startTries = 3

// startEach runs redis-server with the arguments next returns on a free
// port of a loopback address of its own (loopback.Host), and when the
// server exits at once, again on another address and port with next's
// arguments again (next picks any further ports it names afresh, on the
// address it is given). A port found free is closed before redis-server
// binds it, and another process can take it in between: redis-server then
// fails to bind and exits.
//
// The address of its own keeps a server that stopped from being replaced
// by another test's: a Redis Cluster client whose slot map still names a
// killed master dials its address until a replica takes over, and on
// 127.0.0.1 another test's redis-server could be listening there by then
// and take the commands meant for the Cluster.
func startEach(next func(host string) ([]string, error)) (*Server, error) {
	var err error
	for range startTries {
		host := loopback.Host()
		var args []string
		if args, err = next(host); err != nil {
			return nil, err
		}
		var port int
		if port, err = loopback.FreePortOn(host); err != nil {
			return nil, err
		}
		var p *process
		if p, err = runAt("", host, port, args); err == nil {
			return &Server{Addr: net.JoinHostPort(host, strconv.Itoa(port)), host: host, port: port, args: args, proc: p}, nil
		}
		if !errors.Is(err, errExited) {
			return nil, err
		}
	}
	return nil, err
}

// alive reports whether process pid runs (a zombie, which its watchdog has
// not reaped yet, does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && rest != "" && rest[0] != 'Z' && rest[0] != 'X'
}

// runAt starts redis-server bound to host:port in the network namespace
// netns ("" is the test's own) under a shell watchdog that kills it by PID
// as soon as its stdin closes, so the server never outlives the test
// process, and waits until it answers PING. The test must reach host:port
// from its own namespace.
func runAt(netns, host string, port int, args []string) (*process, error) {
	quote := func(a string) string { return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'" }
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = quote(a)
	}
	in := ""
	if netns != "" {
		in = "ip netns exec " + quote(netns) + " "
	}
	// Its connections to other servers (a replica's to its master, a
	// Cluster node's bus, a Sentinel's) leave from host as well, so that
	// each server is known to the others by the address it serves on; they
	// then come from a loopback address other than 127.0.0.1, which
	// protected mode would refuse.
	script := fmt.Sprintf(`%sredis-server %s --port %d --bind %s --bind-source-addr %[4]s --protected-mode no >/dev/null 2>&1 &
pid=$!
echo "pid $pid"
read _
kill $pid
wait $pid`, in, strings.Join(quoted, " "), port, quote(host))
	cmd := exec.Command("sh", "-c", script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if !strings.HasPrefix(line, "pid ") || err != nil {
		stdin.Close()
		cmd.Wait()
		return nil, fmt.Errorf("redistest: redis-server did not start")
	}
	p := &process{cmd: cmd, stdin: stdin, pid: pid}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ping(addr)
		if err == nil {
			return p, nil
		}
		if !alive(pid) {
			p.stop()
			return nil, fmt.Errorf("redistest: redis-server on %s: %w", addr, errExited)
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("redistest: redis-server on %s does not answer PING: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping sends PING and expects PONG: a server still loading its
// append-only file answers LOADING instead.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}
