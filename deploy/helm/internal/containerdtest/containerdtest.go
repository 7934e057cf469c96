// Package containerdtest runs Debian's containerd (with runc) as a process
// of the test, with every path of its own (root, state, sockets, runc's
// state, network namespaces) under a temporary directory, so it runs
// beside any other containerd of the machine, and imports images into it
// from OCI layouts, since the tests reach no registry. A Kubernetes node
// (package kubetest) runs its pods on it through the CRI; a test can also
// run a container directly with ctr.
//
// It needs root (cgroups, mounts, namespaces): Start skips the test
// without it. containerd, ctr and runc come from Debian's containerd and
// runc packages: when one is missing the test skips with one line, or
// fails with RETRYD_REQUIRE_TOOLS=1.
package containerdtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
)

// Namespace is the containerd namespace the CRI (and so the kubelet) uses;
// images are imported into it.
const Namespace = "k8s.io"

const (
	readyTimeout = time.Minute
	stopGrace    = 10 * time.Second
	logTail      = 6 << 10
)

// Options configure Start.
type Options struct {
	// SandboxImage is the CRI's pod sandbox image (sandbox_image); empty
	// for a containerd that runs no pods.
	SandboxImage string
	// CNIConfDir and CNIBinDir are the CRI's CNI configuration and plugin
	// directories; empty for a containerd that runs no pods.
	CNIConfDir, CNIBinDir string
}

// Containerd is a running containerd.
type Containerd struct {
	// Socket is its gRPC socket, the kubelet's containerRuntimeEndpoint.
	Socket string
	// Dir holds everything it writes; LogFile is its log.
	Dir, LogFile string

	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// config keeps every path under the containerd's directory. Naming the
// CRI's runc runtime replaces containerd's default entry for it, so its
// runtime_type is given again. restrict_oom_score_adj is set when this
// process may not lower an OOM score (see mayLowerOOMScore).
const config = `version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = %[10]t
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = %[9]q
`

// Start starts containerd and waits until it answers. When the test ends,
// every container is killed and removed (which ends their shims), then
// containerd is stopped and its mounts and directory removed.
func Start(t testing.TB, opts Options) *Containerd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root (cgroups, mounts, namespaces)")
	}
	bin := retrydtest.NeedProgram(t, "containerd", "apt-get install containerd")
	retrydtest.NeedProgram(t, "ctr", "apt-get install containerd")
	retrydtest.NeedProgram(t, "runc", "apt-get install runc")
	if reason := MissingKernelFeature(); reason != "" {
		t.Skip(reason)
	}
	// A socket's path must fit in 108 bytes, which a test's TempDir may not.
	dir, err := os.MkdirTemp("", "containerdtest-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{Socket: filepath.Join(dir, "containerd.sock"), Dir: dir, LogFile: filepath.Join(dir, "containerd.log")}
	t.Cleanup(func() { c.stop(t) })
	if err := c.start(bin, opts); err != nil {
		t.Fatal(err)
	}
	return c
}

// MissingKernelFeature names a kernel feature containerd's containers need
// and this machine lacks, or returns "".
func MissingKernelFeature() string {
	fs, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Sprintf("cannot read /proc/filesystems: %v", err)
	}
	if !strings.Contains(string(fs), "\toverlay\n") {
		return "the kernel has no overlay filesystem, which containerd's overlayfs snapshotter needs"
	}
	for _, ctl := range []string{"memory", "cpu", "pids"} {
		if !cgroupController(ctl) {
			return fmt.Sprintf("no cgroup %s controller is mounted under /sys/fs/cgroup", ctl)
		}
	}
	return ""
}

// cgroupController reports whether ctl is available: listed by the cgroup
// v2 root, or mounted as a cgroup v1 hierarchy.
func cgroupController(ctl string) bool {
	if data, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return slices.Contains(strings.Fields(string(data)), ctl)
	}
	_, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctl, "cgroup.procs"))
	return err == nil
}

func (c *Containerd) start(bin string, opts Options) error {
	cfg := fmt.Sprintf(config,
		filepath.Join(c.Dir, "root"), filepath.Join(c.Dir, "state"), c.Socket, c.Socket+".ttrpc",
		filepath.Join(c.Dir, "opt"), opts.SandboxImage, opts.CNIBinDir, opts.CNIConfDir, filepath.Join(c.Dir, "runc"),
		!mayLowerOOMScore())
	path := filepath.Join(c.Dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	logFile, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	c.cmd = exec.Command(bin, "--config", path, "--log-level", "warn")
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("containerdtest: start containerd: %w", err)
	}
	c.exited = make(chan struct{})
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	deadline := time.Now().Add(readyTimeout)
	for {
		_, err := c.Ctr("version")
		if err == nil {
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("containerdtest: containerd exited (%v)\n%s", c.err, c.Tail())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerdtest: containerd not answering after %v: %v\n%s", readyTimeout, err, c.Tail())
		}
	}
}

// capSysResource is the bit of CAP_SYS_RESOURCE in a capability set.
const capSysResource = 1 << 24

// mayLowerOOMScore reports whether this process has CAP_SYS_RESOURCE,
// which writing a negative oom_score_adj needs. The kubelet asks for -998
// for every pod sandbox (and -997 for Guaranteed pods); without the
// capability (a sandboxed CI machine may drop it for all of its
// processes, root included) runc's nsexec fails with "failed to update
// /proc/self/oom_score_adj: Permission denied" and no pod starts, unless
// containerd clamps the scores to its own (restrict_oom_score_adj, meant
// for rootless containerd).
func mayLowerOOMScore() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&capSysResource != 0
		}
	}
	return false
}

// Ctr runs Debian's ctr against the containerd in Namespace and returns
// its output.
func (c *Containerd) Ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.Socket, "--namespace", Namespace}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("containerdtest: ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Import imports the image of an OCI layout directory, named by its
// io.containerd.image.name annotation; ctr reads the layout as a tar
// archive.
func (c *Containerd) Import(layoutDir string) error {
	archive := filepath.Join(c.Dir, "import-"+randomHex(4)+".tar")
	if out, err := exec.Command("tar", "-C", layoutDir, "-cf", archive, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("containerdtest: tar %s: %v: %s", layoutDir, err, out)
	}
	defer os.Remove(archive)
	_, err := c.Ctr("images", "import", archive)
	return err
}

// Tail returns the end of containerd's log.
func (c *Containerd) Tail() string {
	data, err := os.ReadFile(c.LogFile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(data) > logTail {
		data = data[len(data)-logTail:]
	}
	return string(data)
}

// Running lists the IDs of the containers whose task runs.
func (c *Containerd) Running() ([]string, error) {
	out, err := c.Ctr("tasks", "ls", "--quiet")
	return strings.Fields(out), err
}

// KillAll kills and removes every container and its task, which ends
// their shims.
func (c *Containerd) KillAll() {
	out, err := c.Ctr("containers", "ls", "--quiet")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		_, _ = c.Ctr("tasks", "kill", "--signal", "SIGKILL", id)
		_, _ = c.Ctr("tasks", "delete", "--force", id)
		_, _ = c.Ctr("containers", "delete", id)
	}
}

func (c *Containerd) stop(t testing.TB) {
	if c.cmd != nil {
		c.KillAll()
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(stopGrace):
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
		if t.Failed() {
			t.Logf("containerdtest: end of containerd's log (%s):\n%s", c.LogFile, c.Tail())
		}
	}
	if err := UnmountUnder(c.Dir); err != nil {
		t.Logf("containerdtest: %v", err)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		t.Logf("containerdtest: %v", err)
	}
}

// UnmountUnder unmounts every mount below dir, deepest first.
func UnmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
