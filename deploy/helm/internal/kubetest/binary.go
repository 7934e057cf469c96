package kubetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/retryd/retryd/internal/retrydtest"
)

// Modfile is the tools module that pins the Kubernetes components, relative
// to the repository root.
const Modfile = "tools/kubernetes/go.mod"

// CoreDNSModule pins CoreDNS, the cluster DNS of a node's pods, relative to
// the repository root. It is a module of its own, so that CoreDNS's
// requirements stay out of the Kubernetes components' module graph; the
// modules the two share are required at the same version in both go.mod
// files, so CoreDNS's build reuses the packages (client-go, grpc,
// protobuf, ...) that the components' builds left in Go's build cache. Its
// CoreDNSPackage is CoreDNS with only the plugins the harness's Corefile
// uses, so it is built from the module's directory.
const CoreDNSModule = "tools/coredns"

// The packages of the pinned components.
const (
	EtcdPackage              = "go.etcd.io/etcd/server/v3"
	APIServerPackage         = "k8s.io/kubernetes/cmd/kube-apiserver"
	ControllerManagerPackage = "k8s.io/kubernetes/cmd/kube-controller-manager"
	SchedulerPackage         = "k8s.io/kubernetes/cmd/kube-scheduler"
	KubeletPackage           = "k8s.io/kubernetes/cmd/kubelet"
	KubeProxyPackage         = "k8s.io/kubernetes/cmd/kube-proxy"
	CoreDNSPackage           = "github.com/retryd/retryd/tools/coredns/cmd/coredns"
)

// moduleOf is the go.mod of the tools module that pins pkg.
func moduleOf(pkg string) string {
	if pkg == CoreDNSPackage {
		return CoreDNSModule + "/go.mod"
	}
	return Modfile
}

var (
	binMu sync.Mutex
	bins  = map[string]string{}
)

// Binary returns the path of a pinned component (one of the *Package
// constants), built with BuildFlags into a directory of the user's cache.
// Go's build cache keeps the compiled packages, and `go build -o` leaves
// an up-to-date executable alone, so only the first build is slow. When it
// cannot be built (no module proxy, no compiler) the test skips with one
// line, or fails when RETRYD_REQUIRE_TOOLS=1.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	retrydtest.EndToEnd(t, pkg)
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := bins[pkg]; ok {
		return p
	}
	p, err := build(pkg)
	if err != nil {
		if os.Getenv(retrydtest.RequireToolsEnv) == "1" {
			t.Fatalf("kubetest: %v", err)
		}
		retrydtest.MissingTool(t, fmt.Sprintf("%s cannot be built from %s (%s)", pkg, moduleOf(pkg), lastLine(err)))
	}
	bins[pkg] = p
	return p
}

// BuildFlags are the flags the components are built with, after the
// Kubernetes version the tools module pins (e.g. "v1.37.2"). A build
// outside a Kubernetes release leaves the version variables at
// "v0.0.0-master", which the API server reports on /version, and helm
// refuses a chart whose kubeVersion that does not satisfy; the release
// build sets them with these -X flags (hack/lib/version.sh), and so does
// the harness. The ldflags do not change what is compiled, so CI's
// `go build -o /dev/null -modfile=tools/kubernetes/go.mod PKG` fills Go's
// build cache for them and only the link runs here.
func BuildFlags(version string) []string {
	major, minor, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	var ld []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		ld = append(ld,
			"-X", pkg+".gitVersion="+version,
			"-X", pkg+".gitMajor="+major,
			"-X", pkg+".gitMinor="+minor,
			"-X", pkg+".gitTreeState=clean",
		)
	}
	return []string{"-modfile=" + Modfile, "-ldflags=" + strings.Join(ld, " ")}
}

// build builds pkg into the harness's directory of the user's cache,
// holding a lock on it so that test processes running side by side do not
// write one executable at once.
func build(pkg string) (string, error) {
	root, err := retrydtest.RepoRoot()
	if err != nil {
		return "", err
	}
	version, err := goOutput(root, "list", "-m", "-modfile="+Modfile, "-f", "{{.Version}}", "k8s.io/kubernetes")
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "retryd-kubetest", version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("kubetest: lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	name := path.Base(pkg)
	if pkg == EtcdPackage {
		name = "etcd"
	}
	out := filepath.Join(dir, name)
	if pkg == CoreDNSPackage {
		_, err = goOutput(filepath.Join(root, CoreDNSModule), "build", "-o", out, pkg)
	} else {
		_, err = goOutput(root, append(append([]string{"build", "-o", out}, BuildFlags(version)...), pkg)...)
	}
	if err != nil {
		return "", err
	}
	return out, nil
}

// goOutput runs the go command in dir and returns its trimmed standard
// output; the error carries its standard error.
func goOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// lastLine is the last non-empty line of err: the go command's own
// message follows the command line it ran.
func lastLine(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
