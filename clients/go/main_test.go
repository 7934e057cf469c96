package retryd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/invariant"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// retrydAddr is the address of the retryd server the Example functions
// call. Examples cannot take a *testing.T, so they cannot start a server
// with retrydtest.Start; TestMain starts one real retryd binary for all of
// them instead, and checks its event log with the invariant checker after
// every test and example has run. Each Test function still starts its own
// server with retrydtest.Start.
var retrydAddr string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	srv, err := startExampleServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the examples' retryd:", err)
		return 1
	}
	retrydAddr = srv.addr
	code := m.Run()
	if err := srv.verify(); err != nil {
		fmt.Fprintln(os.Stderr, "examples' retryd:", err)
		code = 1
	}
	if err := srv.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "examples' retryd:", err)
		code = 1
	}
	return code
}

// exampleServer is the retryd process the examples share.
type exampleServer struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu   sync.Mutex
	logs bytes.Buffer
}

// startExampleServer builds cmd/retryd (with -race when this test binary
// has it, so the server's races fail the run too) and runs it on a free
// loopback port, as retrydtest.Start does for tests.
func startExampleServer() (*exampleServer, error) {
	root, err := retrydtest.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "retryd-examples-")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "retryd")
	args := []string{"build", "-o", bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "./cmd/retryd")...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("go build ./cmd/retryd: %v\n%s", err, out)
	}

	s := &exampleServer{dir: dir, done: make(chan struct{})}
	s.cmd = exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--log-format", "json")
	s.cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			s.mu.Lock()
			s.logs.Write(line)
			s.logs.WriteByte('\n')
			s.mu.Unlock()
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "serving" {
				select {
				case addr <- rec.Addr:
				default:
				}
			}
		}
	}()
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	select {
	case s.addr = <-addr:
		return s, nil
	case <-s.done:
		os.RemoveAll(dir)
		return nil, fmt.Errorf("retryd exited before serving: %v\n%s", s.err, s.logText())
	case <-time.After(30 * time.Second):
		_ = s.stop()
		return nil, fmt.Errorf("retryd did not serve within 30s\n%s", s.logText())
	}
}

func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func (s *exampleServer) logText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// verify runs the invariant checker over the server's whole event log.
func (s *exampleServer) verify() error {
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := retrydtest.Events(ctx, conn, "")
	if err != nil {
		return fmt.Errorf("reading the event log: %w", err)
	}
	var errs []error
	for _, v := range invariant.Check(events) {
		errs = append(errs, fmt.Errorf("invariant violation: %s", v))
	}
	return errors.Join(errs...)
}

// stop stops the server (SIGTERM, SIGKILL after 15s), removes its binary
// and reports a data race the server logged.
func (s *exampleServer) stop() error {
	defer os.RemoveAll(s.dir)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if logs := s.logText(); strings.Contains(logs, "WARNING: DATA RACE") {
		return fmt.Errorf("data race:\n%s", logs)
	}
	if s.err != nil {
		return fmt.Errorf("exit: %v\n%s", s.err, s.logText())
	}
	return nil
}
