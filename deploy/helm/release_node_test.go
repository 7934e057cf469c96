package helm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/deploy/helm/internal/kubetest"
	"github.com/retryd/retryd/internal/retrydtest"
)

// TestReleasedChartOnANode installs a release as the README's Deploy
// section does, on a real node (the harness of TestChartOnANode):
// scripts/release builds the chart package and the image archive, the
// archive is imported into the node's containerd as `ctr -n k8s.io images
// import` does, and `helm install --wait` of the package with its default
// values (ghcr.io/retryd/retryd at the chart's appVersion, pulled only if
// missing) must bring a pod to Ready with no registry to pull from. The pod
// must schedule a retry through a port-forward, and `helm test` must pass.
func TestReleasedChartOnANode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release and starts a Kubernetes control plane and node; not with -short")
	}
	retrydtest.EndToEnd(t, "a release's chart and image on a Kubernetes node")
	if os.Geteuid() != 0 {
		t.Skip("a Kubernetes node needs root (cgroups, mounts, network namespaces)")
	}
	for _, p := range []struct{ program, install string }{
		{"git", "apt-get install -y git"},
		{"npm", "apt-get install -y npm, Node.js >= 20"},
		{"node", "apt-get install -y nodejs, Node.js >= 20"},
		{"python3", "apt-get install -y python3 python3-venv"},
		{"tar", "apt-get install -y tar"},
	} {
		retrydtest.NeedProgram(t, p.program, p.install)
	}
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(data))
	work := t.TempDir()
	dist := filepath.Join(work, "dist")
	start := time.Now()
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "scripts", "release"), "v"+version, "--out", dist)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release v%s: %v\n%s", version, err, out)
	}
	t.Logf("scripts/release v%s took %v", version, time.Since(start).Round(time.Second))

	chart := filepath.Join(dist, "retryd-"+version+".tgz")
	meta, stderr, err := runHelm(t, "show", "chart", chart)
	if err != nil {
		t.Fatalf("helm show chart %s: %v\n%s", chart, err, stderr)
	}
	for _, want := range []string{"\nversion: " + version + "\n", "\nappVersion: " + version + "\n"} {
		if !strings.Contains("\n"+meta, want) {
			t.Errorf("the packaged chart says\n%s\nwant %q", meta, strings.TrimSpace(want))
		}
	}
	// containerdtest imports a layout directory (as a tar it makes of
	// it): the archive's own contents, unchanged.
	layout := filepath.Join(work, "image")
	if err := os.MkdirAll(layout, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dist, "retryd-image-"+version+".oci.tar")
	if out, err := exec.Command("tar", "-xf", archive, "-C", layout).CombinedOutput(); err != nil {
		t.Fatalf("tar -xf %s: %v\n%s", archive, err, out)
	}

	cluster := kubetest.Start(t, kubetest.Options{})
	node := kubetest.StartNode(t, cluster, kubetest.NodeOptions{Images: []string{layout}, DNS: true})
	cluster.StartProxy(t, node.Name, node.PodSubnet)
	t.Logf("control plane and node ready after %v", time.Since(start).Round(time.Second))
	k := &kube{cs: cluster.Client(t), cfg: cluster.RESTConfig(), kubeconfig: cluster.Kubeconfig, node: node}

	const ns = "agents"
	h := helmOn{kubeconfig: k.kubeconfig, namespace: ns}
	args := []string{"install", release, chart, "--create-namespace", "--wait", "--timeout", podTimeout.String()}
	if stdout, stderr, err := h.exec(t, args...); err != nil {
		t.Fatalf("helm %s: %v\n%s%s\n%s", strings.Join(args, " "), err, stdout, stderr, k.describe(ns))
	}
	pod := k.readyPods(t, ns, 1, "")[0]
	if got, want := pod.Spec.Containers[0].Image, "ghcr.io/retryd/retryd:"+version; got != want {
		t.Errorf("the pod runs %s, want the release's image %s", got, want)
	}
	out := grpcurl(t, k.forward(t, ns, pod.Name, 7700), "retryd.v1.RetryService/FailedStep", failedStepJSON("release-session", 60_000))
	if !strings.Contains(out, `"retryId"`) {
		t.Errorf("grpcurl FailedStep through the port-forward answered %s, want a scheduled retry", out)
	}
	h.run(t, "test", release, "--timeout", "2m")
}
