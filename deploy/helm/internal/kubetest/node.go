package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/deploy/helm/internal/containerdtest"
	"github.com/retryd/retryd/internal/retrydtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// NodeName is the name the node registers as.
const NodeName = "kubetest-node"

const (
	// nodeReadyTimeout bounds the kubelet's start until its Node is Ready
	// and schedulable.
	nodeReadyTimeout = 3 * time.Minute
	// drainTimeout bounds the removal of every pod when the test ends.
	drainTimeout = 2 * time.Minute
	// CNIBinDir is where Debian's containernetworking-plugins installs the
	// plugins.
	CNIBinDir = "/usr/lib/cni"
)

// Node is a kubelet registered with a Cluster, running pods with Debian's
// containerd and runc (package containerdtest). Pods get their addresses
// from the bridge and host-local CNI plugins on a bridge of their own
// whose gateway address is the node's InternalIP, so this machine reaches
// every pod and every pod reaches a process listening on the node's IP;
// nothing is routed beyond the machine.
type Node struct {
	// Name is the Node's name.
	Name string
	// IP is the node's InternalIP: the gateway address of its pod bridge.
	IP string
	// PodSubnet is the /24 the pods' addresses come from.
	PodSubnet string
	// Dir holds the kubelet's root directory, its configuration, the CNI
	// configuration and the pods' logs.
	Dir string
	// Containerd runs the pods; Kubelet is the kubelet's process.
	Containerd *containerdtest.Containerd
	Kubelet    *Process
	// DNS is the cluster's DNS on the node's IP, the pods' nameserver;
	// nil unless NodeOptions.DNS.
	DNS *DNS

	cluster    *Cluster
	client     kubernetes.Interface // cluster-admin, for the node's own checks
	bridge     string
	cgroupRoot string            // the kubelet's cgroup root, removed at the end
	sysctls    map[string]string // the kernel settings the kubelet changes, as they were
}

// NodeOptions configure StartNode.
type NodeOptions struct {
	// Images are OCI image layout directories imported into containerd
	// before the kubelet starts, so pods use them without a registry.
	Images []string
	// DNS starts the cluster's DNS (Cluster.StartDNS) on the node's IP and
	// makes it the pods' nameserver (the kubelet's clusterDNS), so a pod
	// finds a Service by name. Without it pods have no nameserver.
	DNS bool
}

// kubeletSysctls are the kernel settings the kubelet sets at start (its
// container manager's setupKernelTunables, unless protectKernelDefaults
// refuses to start instead); the node puts them back when it stops.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// StartNode starts containerd and a kubelet registered with c (started
// with its controller-manager and scheduler), and waits until the Node is
// Ready and schedulable. It needs root (cgroups, mounts, network
// namespaces): without it the test skips. containerd, runc, iproute2 and
// the CNI plugins are Debian packages: when one is missing the test skips
// with one line, or fails with RETRYD_REQUIRE_TOOLS=1. A kernel feature a
// node needs and this machine lacks skips the test with the reason,
// whatever RETRYD_REQUIRE_TOOLS says. When the test ends the node is
// cordoned and every pod on it removed, then the kubelet and containerd
// are stopped and the node's mounts, cgroups, bridge and directory
// removed, and the kernel settings the kubelet changed are put back.
func StartNode(t testing.TB, c *Cluster, opts NodeOptions) *Node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a Kubernetes node needs root (cgroups, mounts, network namespaces)")
	}
	if c.ControllerManager == nil || c.Scheduler == nil {
		t.Fatal("kubetest: a node needs the controller-manager and the scheduler (Options.APIServerOnly is set)")
	}
	retrydtest.NeedProgram(t, "containerd", "apt-get install containerd")
	retrydtest.NeedProgram(t, "runc", "apt-get install runc")
	retrydtest.NeedProgram(t, "ip", "apt-get install iproute2")
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, plugin)); err != nil {
			retrydtest.MissingTool(t, fmt.Sprintf("the CNI plugin %s is not in %s (apt-get install containernetworking-plugins)", plugin, CNIBinDir))
		}
	}
	if reason := containerdtest.MissingKernelFeature(); reason != "" {
		t.Skip(reason)
	}
	kubeletBin := Binary(t, KubeletPackage)

	// Unix sockets under the kubelet's root directory must fit in 108
	// bytes, which a test's TempDir may not.
	dir, err := os.MkdirTemp("", "kubetest-node-")
	if err != nil {
		t.Fatal(err)
	}
	suffix := randomHex(3)
	n := &Node{Name: NodeName, Dir: dir, cluster: c, client: c.Client(t), bridge: "kt" + suffix, cgroupRoot: "kubetest-" + suffix}
	// Cleanups run last-registered first: the kubelet stops before
	// containerd, and containerd before the network and cgroups go.
	t.Cleanup(func() { n.removeHostState(t) })
	if err := n.network(); err != nil {
		t.Fatal(err)
	}
	if opts.DNS {
		n.DNS = c.StartDNS(t, n.IP)
	}
	n.Containerd = containerdtest.Start(t, containerdtest.Options{
		SandboxImage: containerdtest.PauseImage,
		CNIConfDir:   filepath.Join(dir, "cni"),
		CNIBinDir:    CNIBinDir,
	})
	pause, err := containerdtest.WritePauseImage(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	for _, layout := range append([]string{pause}, opts.Images...) {
		if err := n.Containerd.Import(layout); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { n.stopKubelet(t) })
	if err := n.startKubelet(kubeletBin); err != nil {
		t.Fatal(err)
	}
	return n
}

// network makes the pod bridge with the node's address and writes the CNI
// configuration that puts every pod on it. The /24 is picked at random in
// 10.244.0.0/16, so nodes of tests running side by side do not collide.
func (n *Node) network() error {
	var b [1]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	n.PodSubnet = fmt.Sprintf("10.244.%d.0/24", b[0])
	n.IP = fmt.Sprintf("10.244.%d.1", b[0])
	for _, args := range [][]string{
		{"link", "add", n.bridge, "type", "bridge"},
		{"addr", "add", n.IP + "/24", "dev", n.bridge},
		{"link", "set", n.bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("kubetest: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kubetest",
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      n.bridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":   "host-local",
				"ranges": [][]map[string]string{{{"subnet": n.PodSubnet, "gateway": n.IP}}},
				// A default route through the node, so that Service IPs
				// (which kube-proxy rewrites on the node) are reachable.
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": filepath.Join(n.Dir, "cni-ipam"),
			},
		}},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(n.Dir, "cni"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.Dir, "cni", "10-kubetest.conflist"), data, 0o644)
}

// kubeletConfig is the KubeletConfiguration.
//   - failCgroupV1 false lets the kubelet start on a cgroup v1 host, which
//     it refuses by default since 1.35; cgroupDriver is given because
//     containerd 1.6 does not report its own (no CRI RuntimeConfig).
//   - cgroupRoot is a cgroup of the node's own, so its pods' cgroups are
//     apart from everything else on the machine.
//   - Eviction ("0%" turns a signal off) and image garbage collection are
//     off: the test's pods must not be evicted, nor its images removed,
//     because the machine's disk is fuller than a cluster node's would be.
//   - The kubelet's API accepts only client certificates issued by the
//     cluster's CA (the API server's, for logs, exec and port-forward).
//   - Pods get no nameserver from the machine (an empty resolv.conf):
//     with NodeOptions.DNS the cluster's DNS is theirs, appended as
//     clusterDNS.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[1]s
containerRuntimeEndpoint: unix://%[2]s
address: %[3]s
port: %[4]d
healthzBindAddress: 127.0.0.1
healthzPort: %[5]d
readOnlyPort: 0
tlsCertFile: %[6]q
tlsPrivateKeyFile: %[7]q
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %[8]q
authorization:
  mode: AlwaysAllow
failSwapOn: false
podLogsDir: %[9]q
evictionHard:
  memory.available: "0%%"
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: %[10]q
nodeStatusReportFrequency: 10s
syncFrequency: 10s
`

func (n *Node) startKubelet(bin string) error {
	n.sysctls = map[string]string{}
	for _, k := range kubeletSysctls {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil {
			n.sysctls[k] = strings.TrimSpace(string(v))
		}
	}
	if err := createCgroups(n.cgroupRoot); err != nil {
		return err
	}
	cert, err := n.cluster.CA.Issue("kubelet", "system:node:"+n.Name, []string{"system:nodes"}, n.IP, "127.0.0.1", n.Name)
	if err != nil {
		return err
	}
	kubeconfig, err := n.cluster.WriteKubeconfig("kubelet.kubeconfig", cert)
	if err != nil {
		return err
	}
	resolv := filepath.Join(n.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		return err
	}
	n.Kubelet, _, err = startOnFreePorts(2, func(ports []int) (*Process, error) {
		cfg := fmt.Sprintf(kubeletConfig, n.cgroupRoot, n.Containerd.Socket, n.IP, ports[0], ports[1],
			cert.CertFile, cert.KeyFile, n.cluster.CA.CertFile, filepath.Join(n.Dir, "pod-logs"), resolv)
		if n.DNS != nil {
			cfg += fmt.Sprintf("clusterDomain: %s\nclusterDNS: [%q]\n", ClusterDomain, n.IP)
		}
		path := filepath.Join(n.Dir, "kubelet.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		return startProcess(n.Dir, "kubelet", bin,
			"--config="+path,
			"--kubeconfig="+kubeconfig,
			"--root-dir="+filepath.Join(n.Dir, "kubelet"),
			"--hostname-override="+n.Name,
			"--node-ip="+n.IP,
			"--v=1",
		)
	}, func(p *Process, ports []int) error {
		return p.waitFor(nodeReadyTimeout, n.schedulable)
	})
	return err
}

// schedulable returns nil once the Node is Ready and has no NoSchedule
// taint left (the controller-manager removes node.kubernetes.io/not-ready
// after the kubelet reports Ready), or why not.
func (n *Node) schedulable() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ready := fmt.Errorf("node %s has no Ready condition yet", n.Name)
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			ready = nil
			if cond.Status != corev1.ConditionTrue {
				ready = fmt.Errorf("node %s: Ready=%s: %s: %s", n.Name, cond.Status, cond.Reason, cond.Message)
			}
		}
	}
	if ready != nil {
		return ready
	}
	for _, taint := range node.Spec.Taints {
		if taint.Effect == corev1.TaintEffectNoSchedule {
			return fmt.Errorf("node %s is Ready but still tainted %s", n.Name, taint.ToString())
		}
	}
	return nil
}

// stopKubelet cordons the node and deletes its pods (so the kubelet tears
// down their containers, volumes and network), then stops the kubelet.
func (n *Node) stopKubelet(t testing.TB) {
	if n.Kubelet == nil {
		return
	}
	if err := n.drain(); err != nil {
		t.Logf("kubetest: %v", err)
	}
	n.Kubelet.Stop()
	if t.Failed() {
		t.Logf("kubetest: end of the kubelet's log (%s):\n%s", n.Kubelet.LogFile, n.Kubelet.Tail())
	}
}

// removeHostState removes what the node made outside its directory (the
// bridge, the cgroups, the links to the containers' logs, the kernel
// settings the kubelet changed), unmounts
// what is left under its directory and removes it; after a failure the
// directory is kept.
func (n *Node) removeHostState(t testing.TB) {
	for k, v := range n.sysctls {
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
			t.Logf("kubetest: restore %s=%s: %v", k, v, err)
		}
	}
	removeCgroups(n.cgroupRoot)
	_ = exec.Command("ip", "link", "del", n.bridge).Run()
	removeKubeletRules()
	removeLogLinks(n.Dir)
	if err := containerdtest.UnmountUnder(n.Dir); err != nil {
		t.Logf("kubetest: %v", err)
	}
	if t.Failed() {
		t.Logf("kubetest: the node's files are kept in %s", n.Dir)
		return
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		t.Logf("kubetest: %v", err)
	}
}

// kubeletChains are the iptables chains a kubelet makes on its machine
// (pkg/kubelet/kubelet_network_linux.go): a canary it watches in three
// tables, a hint for iptables' mode, and a firewall, jumped to from INPUT
// and OUTPUT, that drops packets to 127.0.0.0/8 from other sources. A
// stopped kubelet leaves them; another node's running kubelet puts its
// own back when its canary goes.
var kubeletChains = []struct{ table, chain string }{
	{"filter", "KUBE-FIREWALL"},
	{"filter", "KUBE-KUBELET-CANARY"},
	{"mangle", "KUBE-KUBELET-CANARY"},
	{"nat", "KUBE-KUBELET-CANARY"},
	{"mangle", "KUBE-IPTABLES-HINT"},
}

// removeKubeletRules removes the kubelet's chains and the jumps to its
// firewall, for IPv4 and IPv6, leaving the machine's rules as they were.
func removeKubeletRules() {
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		for _, from := range []string{"INPUT", "OUTPUT"} {
			// One jump each; the bound only guards against a loop.
			for range 8 {
				if exec.Command(tool, "-w", "-t", "filter", "-D", from, "-j", "KUBE-FIREWALL").Run() != nil {
					break
				}
			}
		}
		for _, c := range kubeletChains {
			_ = exec.Command(tool, "-w", "-t", c.table, "-F", c.chain).Run()
			_ = exec.Command(tool, "-w", "-t", c.table, "-X", c.chain).Run()
		}
	}
}

// containerLogLinks is where the kubelet links every container's log
// (kuberuntime's ContainerLogsDir, not configurable); a link goes when the
// kubelet removes its container, which it does not do once stopped.
const containerLogLinks = "/var/log/containers"

// removeLogLinks removes the links in containerLogLinks to logs under dir.
func removeLogLinks(dir string) {
	links, _ := filepath.Glob(filepath.Join(containerLogLinks, "*.log"))
	for _, link := range links {
		if target, err := os.Readlink(link); err == nil && strings.HasPrefix(target, dir+"/") {
			_ = os.Remove(link)
		}
	}
}

// drain cordons the node, so that no controller's replacement pod lands
// on it, deletes every pod bound to it at once and waits until the
// kubelet has stopped their containers.
func (n *Node) drain() error {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	cs := n.client
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType,
		[]byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cordon %s: %w", n.Name, err)
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		_ = cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	for {
		running, err := n.Containerd.Running()
		if err == nil && len(running) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containers %v still run %v after their pods were deleted (%v)", running, drainTimeout, err)
		case <-time.After(time.Second):
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
