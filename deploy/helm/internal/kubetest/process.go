package kubetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/retryd/retryd/internal/loopback"
)

const (
	// stopGrace is how long a component has to exit after SIGTERM before
	// it is killed.
	stopGrace = 10 * time.Second
	// logTail is how much of a component's log a failure shows.
	logTail = 6 << 10
)

// Process is one running component of the cluster, started by the harness
// and stopped by PID when the test ends.
type Process struct {
	// Name is the component's name ("etcd", "kube-apiserver", ...).
	Name string
	// LogFile holds everything it wrote to stdout and stderr.
	LogFile string

	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// startProcess runs bin with args, its output going to name.log in dir.
func startProcess(dir, name, bin string, args ...string) (*Process, error) {
	p := &Process{Name: name, LogFile: filepath.Join(dir, name+".log"), exited: make(chan struct{})}
	logFile, err := os.OpenFile(p.LogFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "+ %s %s\n", bin, strings.Join(args, " "))
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.Env = childEnv()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("kubetest: start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// PID is the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM, then SIGKILL after a grace period, and waits for the
// process to exit. It is safe to call more than once.
func (p *Process) Stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Tail returns the end of the process's log.
func (p *Process) Tail() string {
	data, err := os.ReadFile(p.LogFile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(data) > logTail {
		data = data[len(data)-logTail:]
	}
	return string(data)
}

// waitFor polls ready every 200ms until it returns nil, the process exits,
// or timeout passes; the error then carries the last reason and the log's
// tail.
func (p *Process) waitFor(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("kubetest: %s exited before it was ready (%v; last check: %v)\n%s", p.Name, p.err, err, p.Tail())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubetest: %s not ready after %v (last check: %v)\n%s", p.Name, timeout, err, p.Tail())
		}
	}
}

// addressInUse reports whether the process failed because a port it was
// given was taken between the harness choosing it and the process binding
// it; the harness then starts it again on new ports.
func (p *Process) addressInUse() bool {
	select {
	case <-p.exited:
	default:
		return false
	}
	data, _ := os.ReadFile(p.LogFile)
	return strings.Contains(string(data), "address already in use")
}

// childEnv is the test's environment without the variables that would point
// a component at another cluster or at the test's telemetry backends.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KUBECONFIG=") || strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "ETCD") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// startAttempts is how often a component is started on new ports when the
// ones chosen were taken before it bound them.
const startAttempts = 3

// startOnFreePorts starts a component on nPorts fresh ports (start builds
// its arguments from them) and waits until it is ready, retrying on new
// ports when a port was taken in between. The process is returned running;
// on error none is left behind.
func startOnFreePorts(nPorts int, start func(ports []int) (*Process, error), ready func(p *Process, ports []int) error) (*Process, []int, error) {
	var lastErr error
	for range startAttempts {
		ports, err := loopback.FreePorts(nPorts)
		if err != nil {
			return nil, nil, err
		}
		p, err := start(ports)
		if err != nil {
			return nil, nil, err
		}
		err = ready(p, ports)
		if err == nil {
			return p, ports, nil
		}
		p.Stop()
		lastErr = err
		if !p.addressInUse() {
			return nil, nil, err
		}
	}
	return nil, nil, errors.Join(errors.New("kubetest: ports kept being taken"), lastErr)
}
