// Package redistest starts throwaway redis-server processes for tests: on
// a free loopback port, without persistence, stopped by PID.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Server is a running redis-server.
type Server struct {
	// Addr is its host:port.
	Addr string
	cmd  *exec.Cmd
	// stdin keeps the watchdog alive; closing it (or this process ending)
	// stops the server.
	stdin io.WriteCloser
}

// URL returns the server's redis:// URL for database db.
func (s *Server) URL(db int) string { return "redis://" + s.Addr + "/" + strconv.Itoa(db) }

// Stop stops the server by its PID and waits for it.
func (s *Server) Stop() {
	s.stdin.Close()
	s.cmd.Wait()
}

// Installed reports whether redis-server is on PATH.
func Installed() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// Skip skips the test when redis-server is not installed.
func Skip(t testing.TB) {
	t.Helper()
	if !Installed() {
		t.Skip("redis-server is not installed (apt-get install -y redis-server); skipping the Redis store tests")
	}
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

// start runs redis-server under a shell watchdog that kills it by PID as
// soon as its stdin closes, so the server never outlives the test process.
func start() (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := lis.Addr().(*net.TCPAddr).Port
	lis.Close()
	script := fmt.Sprintf(`redis-server --save "" --appendonly no --port %d --bind 127.0.0.1 >/dev/null 2>&1 &
pid=$!
echo "pid $pid"
read _
kill $pid
wait $pid`, port)
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
	if !strings.HasPrefix(line, "pid ") {
		stdin.Close()
		cmd.Wait()
		return nil, fmt.Errorf("redistest: redis-server did not start")
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, stdin: stdin}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("redistest: redis-server on %s did not accept connections: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
