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

// tenantAddr is the address of the second example server, the one of the
// examples of a shared retryd: authentication on (exampleToken is a token
// of its tenant "agents"), one pending retry per tenant
// (--max-pending-retries-per-tenant 1), and fleet protection of the
// provider "deepseek" (a budget of 20 retries).
var tenantAddr string

// exampleToken is the bearer token of the tenant "agents" of the server at
// tenantAddr.
const exampleToken = "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "retryd-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := buildExampleBinary(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "building the examples' retryd:", err)
		return 1
	}
	creds, config := filepath.Join(dir, "credentials.yaml"), filepath.Join(dir, "config.yaml")
	files := map[string]string{
		creds:  fmt.Sprintf("tenants:\n  - id: agents\n    tokens:\n      - sha256: %q\n", tokenHash(exampleToken)),
		config: "providers:\n  deepseek:\n    fleet: {capacity: 20}\n",
	}
	for path, body := range files {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	servers := []*exampleServer{
		{addr: &retrydAddr},
		{addr: &tenantAddr, token: exampleToken,
			args: []string{"--auth-credentials", creds, "--max-pending-retries-per-tenant", "1", "--config", config}},
	}
	for i, srv := range servers {
		if err := srv.start(bin); err != nil {
			fmt.Fprintln(os.Stderr, "starting the examples' retryd:", err)
			for _, started := range servers[:i] {
				_ = started.stop()
			}
			return 1
		}
	}
	code := m.Run()
	for _, srv := range servers {
		if err := srv.verify(); err != nil {
			fmt.Fprintln(os.Stderr, "examples' retryd:", err)
			code = 1
		}
		if err := srv.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "examples' retryd:", err)
			code = 1
		}
	}
	return code
}

// buildExampleBinary builds cmd/retryd into dir (with -race when this
// test binary has it, so the server's races fail the run too).
func buildExampleBinary(dir string) (string, error) {
	root, err := retrydtest.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "retryd")
	args := []string{"build", "-o", bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "./cmd/retryd")...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/retryd: %v\n%s", err, out)
	}
	return bin, nil
}

// exampleServer is a retryd process the examples share.
type exampleServer struct {
	addr  *string  // set to the address it serves on
	args  []string // after serve --listen 127.0.0.1:0 --log-format json
	token string   // the bearer token verify reads the event log with
	cmd   *exec.Cmd
	done  chan struct{}
	err   error

	mu   sync.Mutex
	logs bytes.Buffer
}

// start runs bin on a free loopback port, as retrydtest.Start does for
// tests, and sets *s.addr once it serves.
func (s *exampleServer) start(bin string) error {
	s.done = make(chan struct{})
	s.cmd = exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json"}, s.args...)...)
	s.cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := s.cmd.Start(); err != nil {
		return err
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
	case *s.addr = <-addr:
		return nil
	case <-s.done:
		return fmt.Errorf("retryd exited before serving: %v\n%s", s.err, s.logText())
	case <-time.After(30 * time.Second):
		_ = s.stop()
		return fmt.Errorf("retryd did not serve within 30s\n%s", s.logText())
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
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if s.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(s.token)))
	}
	conn, err := grpc.NewClient(*s.addr, opts...)
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

// stop stops the server (SIGTERM, SIGKILL after 15s) and reports a data
// race the server logged.
func (s *exampleServer) stop() error {
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
