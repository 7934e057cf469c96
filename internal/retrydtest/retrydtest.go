// Package retrydtest starts the real retryd binary for tests: it builds
// cmd/retryd once per test process (with -race when the tests use it),
// runs it on a free loopback port, waits until it serves, and stops it by
// PID when the test ends. Verify runs the invariant checker over the
// server's event log, as every end-to-end test must.
package retrydtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// RepoRoot returns the directory holding the module's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "cmd", "retryd")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("retrydtest: repository root not found")
		}
		dir = parent
	}
}

// PinnedTool returns the path of a tool pinned by a tools module of the
// repository (modfile, relative to the root, e.g. "tools/protoc/go.mod"):
// with -n and no arguments, `go tool` builds it into Go's build cache
// (minutes on a cold cache) and prints its command line, which is the
// executable's path.
func PinnedTool(modfile, tool string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "tool", "-n", "-modfile="+modfile, tool)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go tool -n -modfile=%s %s: %w\n%s", modfile, tool, err, stderr.String())
	}
	path := strings.TrimSpace(string(out))
	info, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("go tool -n -modfile=%s %s printed %q: %w", modfile, tool, path, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("go tool -n -modfile=%s %s printed %q, which is not an executable", modfile, tool, path)
	}
	return path, nil
}

// binDirPrefix names the temporary directories Binary builds into, with
// the building process's PID after it (see sweepBinaries).
const binDirPrefix = "retrydtest-bin-"

// Binary builds cmd/retryd once per test process and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		sweepBinaries()
		dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", binDirPrefix, os.Getpid()))
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "retryd")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/retryd")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/retryd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// sweepBinaries removes the binaries of test processes that have ended.
// A test process runs its binary until it exits, and Go runs no code at a
// test process's exit that could remove it then, so each build leaves one
// behind (tens of megabytes with -race); the next build removes those
// whose process is gone.
func sweepBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), binDirPrefix+"*"))
	for _, dir := range dirs {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(dir), binDirPrefix), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n == os.Getpid() {
			continue
		}
		if err := syscall.Kill(n, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(dir)
		}
	}
}

// Server is a running retryd process.
type Server struct {
	// Addr is the gRPC address it serves on.
	Addr string
	// MetricsAddr is the /metrics HTTP address, when --metrics-listen was given.
	MetricsAddr string
	// HealthAddr is the plaintext health address, when --health-listen was
	// given.
	HealthAddr string
	// TLS and MTLS are the transport the serving line reports.
	TLS, MTLS bool
	cmd       *exec.Cmd
	logs      *syncBuffer
	done      chan struct{}
	err       error
}

// Start runs retryd serve with args on a free loopback port and waits until
// it serves. The process is stopped (SIGTERM, then SIGKILL) at cleanup.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return StartWithEnv(t, nil, args...)
}

// StartWithEnv is Start with extra environment variables ("KEY=value"),
// e.g. the OTEL_* settings of a tracing test.
func StartWithEnv(t testing.TB, env []string, args ...string) *Server {
	t.Helper()
	return start(t, nil, env, args)
}

// StartInNetns is Start inside the network namespace netns (`ip netns
// exec`, which needs root): the process sees only that namespace's
// addresses, so give it a --listen (and --health-listen) address that
// exists there and that the test can reach.
func StartInNetns(t testing.TB, netns string, args ...string) *Server {
	t.Helper()
	NeedProgram(t, "ip", "apt-get install -y iproute2")
	return start(t, []string{"ip", "netns", "exec", netns}, nil, args)
}

// start runs the binary with args, through the command wrap (which execs
// it in place, keeping the PID Stop signals) when wrap is not empty.
func start(t testing.TB, wrap, env, args []string) *Server {
	t.Helper()
	bin := Binary(t)
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"}, args...)
	if len(wrap) > 0 {
		all = append(append(wrap[1:len(wrap):len(wrap)], bin), all...)
		bin = wrap[0]
	}
	cmd := exec.Command(bin, all...)
	cmd.Env = append(append(os.Environ(), "GORACE=halt_on_error=1"), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cmd: cmd, logs: &syncBuffer{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan servingLine, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			s.logs.write(append(line, '\n'))
			var rec servingLine
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "serving" {
				select {
				case serving <- rec:
				default:
				}
			}
		}
	}()
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() { s.Stop(t) })
	select {
	case rec := <-serving:
		s.Addr, s.MetricsAddr, s.HealthAddr = rec.Addr, rec.MetricsAddr, rec.HealthAddr
		s.TLS, s.MTLS = rec.TLS, rec.MTLS
	case <-s.done:
		t.Fatalf("retryd exited before serving: %v\n%s", s.err, s.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("retryd did not serve within 30s\n%s", s.logs.String())
	}
	return s
}

// servingLine is the JSON "serving" log line.
type servingLine struct {
	Msg         string `json:"msg"`
	Addr        string `json:"addr"`
	MetricsAddr string `json:"metrics_addr"`
	HealthAddr  string `json:"health_addr"`
	TLS         bool   `json:"tls"`
	MTLS        bool   `json:"mtls"`
}

// Logs returns what the server logged so far.
func (s *Server) Logs() string { return s.logs.String() }

// Signal sends sig to the server process.
func (s *Server) Signal(sig os.Signal) error { return s.cmd.Process.Signal(sig) }

// Wait waits for the process to exit and returns its exit error.
func (s *Server) Wait(timeout time.Duration) error {
	select {
	case <-s.done:
		return s.err
	case <-time.After(timeout):
		return fmt.Errorf("retryd still running after %v", timeout)
	}
}

// Stop stops the server (SIGTERM, SIGKILL after 15s) and fails the test if
// the race detector reported anything.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	if bytes.Contains([]byte(s.logs.String()), []byte("WARNING: DATA RACE")) {
		t.Errorf("retryd reported a data race:\n%s", s.logs.String())
	}
}

// Conn dials the server in plaintext; the connection closes at cleanup.
func (s *Server) Conn(t testing.TB) *grpc.ClientConn {
	t.Helper()
	return Dial(t, s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// ConnTLS dials the server over TLS with cfg (its RootCAs, and for mTLS
// its Certificates); the connection closes at cleanup.
func (s *Server) ConnTLS(t testing.TB, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	return Dial(t, s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// HealthConn dials the plaintext health port (--health-listen); the
// connection closes at cleanup.
func (s *Server) HealthConn(t testing.TB) *grpc.ClientConn {
	t.Helper()
	if s.HealthAddr == "" {
		t.Fatal("retrydtest: the server has no health port (start it with --health-listen)")
	}
	return Dial(t, s.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// Dial creates a client connection to addr with opts; it closes at
// cleanup.
func Dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Events reads every retained event of the server (WatchEvents to the end).
func Events(ctx context.Context, conn grpc.ClientConnInterface, sessionID string) ([]*retrydv1.Event, error) {
	stream, err := retrydv1.NewRetryServiceClient(conn).WatchEvents(ctx, &retrydv1.WatchEventsRequest{
		SessionId: sessionID, StopAtEnd: true,
	})
	if err != nil {
		return nil, err
	}
	var out []*retrydv1.Event
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetEvent())
	}
}

// Verify runs the invariant checker over the server's whole event log and
// fails the test on any violation. It returns the events it checked.
func Verify(t testing.TB, conn grpc.ClientConnInterface) []*retrydv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := Events(ctx, conn, "")
	if err != nil {
		t.Fatalf("reading the event log: %v", err)
	}
	for _, v := range invariant.Check(events) {
		t.Errorf("invariant violation: %s", v)
	}
	return events
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) write(p []byte) {
	b.mu.Lock()
	b.buf.Write(p)
	b.mu.Unlock()
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
