// Package memcg runs processes under a memory limit of their own, as a
// container runtime does: a memory cgroup made for them (the v1 memory
// controller's memory.limit_in_bytes, or v2's memory.max). Tests and the
// benchmark harness use it to run retryd as it runs in a pod with
// resources.limits.memory. It needs a writable cgroup hierarchy (root);
// New says why it cannot when it cannot, and callers skip.
package memcg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Group is a memory cgroup made by New.
type Group struct {
	dir string
	v2  bool
}

// Roots where New makes its groups: the v1 memory controller's hierarchy,
// else the unified (v2) one.
var (
	v1Root = "/sys/fs/cgroup/memory"
	v2Root = "/sys/fs/cgroup"
)

// New makes a memory cgroup named name (unique on the machine: callers
// add their PID) whose processes together may use at most limit bytes.
func New(name string, limit int64) (*Group, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("memcg: limit %d, want > 0", limit)
	}
	g := &Group{dir: filepath.Join(v1Root, name)}
	limitFile := "memory.limit_in_bytes"
	if _, err := os.Stat(filepath.Join(v1Root, "memory.limit_in_bytes")); err != nil {
		if _, err := os.Stat(filepath.Join(v2Root, "cgroup.controllers")); err != nil {
			return nil, errors.New("memcg: no cgroup memory controller is mounted")
		}
		g = &Group{dir: filepath.Join(v2Root, name), v2: true}
		limitFile = "memory.max"
	}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("memcg: %w", err)
	}
	if err := os.WriteFile(filepath.Join(g.dir, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		_ = os.Remove(g.dir)
		return nil, fmt.Errorf("memcg: setting the limit: %w", err)
	}
	return g, nil
}

// Command is exec.CommandContext of name and args, started inside the
// group: a shell moves itself into the group and then execs the program,
// so the program's first allocation is already accounted there and it
// reads the group's limit as its own.
func (g *Group) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	sh, shArgs := g.Wrap(name, args...)
	return exec.CommandContext(ctx, sh, shArgs...)
}

// Wrap returns the program and arguments that run name with args inside
// the group (see Command), for callers that build their exec.Cmd
// themselves. The program's PID is the shell's: it execs.
func (g *Group) Wrap(name string, args ...string) (string, []string) {
	script := `echo $$ > "$0" && exec "$@"`
	return "/bin/sh", append([]string{"-c", script, filepath.Join(g.dir, "cgroup.procs"), name}, args...)
}

// Peak is the most memory the group's processes used together since it
// was made, as the kernel counts it (their RSS and page cache).
func (g *Group) Peak() (int64, error) {
	name := "memory.max_usage_in_bytes"
	if g.v2 {
		name = "memory.peak"
	}
	return g.readInt(name)
}

// OOMKills is how many of the group's processes the kernel killed for
// passing its limit.
func (g *Group) OOMKills() (int64, error) {
	name := "memory.oom_control"
	if g.v2 {
		name = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(g.dir, name))
	if err != nil {
		return 0, fmt.Errorf("memcg: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == "oom_kill" {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("memcg: %s has no oom_kill count", name)
}

func (g *Group) readInt(name string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, name))
	if err != nil {
		return 0, fmt.Errorf("memcg: %w", err)
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Close kills what is left in the group (a killed process's children
// may outlive it) and removes the group.
func (g *Group) Close() error {
	var err error
	for range 50 {
		if b, rerr := os.ReadFile(filepath.Join(g.dir, "cgroup.procs")); rerr == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, perr := strconv.Atoi(f); perr == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if err = os.Remove(g.dir); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("memcg: %w", err)
}
