package helm_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/deploy/helm/internal/containerdtest"
	"github.com/retryd/retryd/deploy/helm/internal/kubetest"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// podTimeout bounds the wait for pods to be Ready: the image is on the
// node already, so this is the scheduler, the kubelet and the probes.
const podTimeout = 3 * time.Minute

// TestChartOnANode installs the chart with the pinned helm (`helm install
// --wait`) into a real cluster with a real node: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, CoreDNS, kube-proxy and a
// kubelet whose pods run in Debian's containerd and runc on a CNI bridge
// (internal/kubetest), with
// the image deploy/image builds imported into containerd. It checks that
// the pods become Ready through the kubelet's gRPC probes, run confined as
// the chart's security context asks, and serve through a port-forward
// (API server -> kubelet -> containerd):
//   - memory store: the pinned grpcurl gets a decision;
//   - file store on a local PersistentVolume: the pod is deleted, and the
//     StatefulSet's new pod still knows the retry scheduled before;
//   - Redis store (redis-server on the node's address): two replicas, a
//     FailedStep on one and an AwaitRetry on the other get one Started,
//     the PodDisruptionBudget refuses the eviction of the second pod
//     while the first is being replaced, and a rolling restart keeps a
//     pod Ready throughout;
//   - `helm test` passes: its pod finds the Service through the cluster's
//     DNS and reaches a pod through kube-proxy's rules.
func TestChartOnANode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane and node; not with -short")
	}
	retrydtest.EndToEnd(t, "a Kubernetes control plane and node")
	if os.Geteuid() != 0 {
		t.Skip("a Kubernetes node needs root (cgroups, mounts, network namespaces)")
	}
	start := time.Now()
	work := t.TempDir()
	image, ref, err := containerdtest.RetrydImage(work)
	if err != nil {
		t.Fatal(err)
	}
	if c := render(t, filepath.Join("testdata", "defaults.yaml")).container(t); c.Image != ref {
		t.Fatalf("the chart's image is %s, the built image %s", c.Image, ref)
	}
	cluster := kubetest.Start(t, kubetest.Options{})
	node := kubetest.StartNode(t, cluster, kubetest.NodeOptions{Images: []string{image}, DNS: true})
	cluster.StartProxy(t, node.Name, node.PodSubnet)
	t.Logf("control plane and node ready after %v", time.Since(start).Round(time.Second))
	k := &kube{cs: cluster.Client(t), cfg: cluster.RESTConfig(), kubeconfig: cluster.Kubeconfig, node: node}

	t.Run("memory", func(t *testing.T) {
		k.install(t, "mem", "--set", "image.pullPolicy=Never")
		pod := k.readyPods(t, "mem", 1, "")[0]
		k.checkConfined(t, pod)
		out := grpcurl(t, k.forward(t, "mem", pod.Name, 7700), "retryd.v1.RetryService/FailedStep", failedStepJSON("node-session", 60_000))
		if !strings.Contains(out, `"retryId"`) {
			t.Errorf("grpcurl FailedStep through the port-forward answered %s, want a scheduled retry", out)
		}
		// The chart's test pod asks the Service by name: the cluster's DNS
		// on the node, then kube-proxy's rules to the pod.
		helmOn{kubeconfig: k.kubeconfig, namespace: "mem"}.run(t, "test", release, "--timeout", "2m")
	})

	t.Run("file", func(t *testing.T) {
		k.localVolume(t, "retryd-file", filepath.Join(node.Dir, "volumes", "retryd-file"))
		k.install(t, "file", "--set", "image.pullPolicy=Never",
			"--set", "store.kind=file", "--set", "store.file.persistence.storageClassName=-")
		pod := k.readyPods(t, "file", 1, "")[0]
		k.checkConfined(t, pod)
		retryID := scheduleRetry(t.Context(), t, k.dial(t, "file", pod.Name))

		if err := k.cs.CoreV1().Pods("file").Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		again := k.readyPods(t, "file", 1, pod.UID)[0]
		client := retrydv1.NewRetryServiceClient(k.dial(t, "file", again.Name))
		if state := retryState(t, client, retryID); state.GetRetryId() != retryID || state.GetSessionId() != durabilitySession ||
			state.GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			t.Errorf("AwaitRetry(%s) on the new pod starts with %v, want the pending retry of %s", retryID, state, durabilitySession)
		}
		chains, err := client.GetChains(t.Context(), &retrydv1.GetChainsRequest{SessionId: durabilitySession})
		if err != nil {
			t.Fatalf("GetChains on the new pod: %v", err)
		}
		if len(chains.GetChains()) != 1 || chains.GetChains()[0].GetLatest().GetRetryId() != retryID {
			t.Errorf("after the pod was deleted and recreated the chains are %v, want one whose latest retry is %s", chains.GetChains(), retryID)
		}
	})

	t.Run("redis", func(t *testing.T) {
		redisURL := startRedis(t, node.IP)
		k.namespace(t, "redis")
		if _, err := k.cs.CoreV1().Secrets("redis").Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "retryd-redis"},
			StringData: map[string]string{"url": redisURL},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		k.install(t, "redis", "--set", "image.pullPolicy=Never",
			"--set", "store.kind=redis", "--set", "store.redis.existingSecret=retryd-redis",
			"--set", "replicaCount=2", "--set", "strategy.type=RollingUpdate",
			"--set", "podDisruptionBudget.enabled=true")
		pods := k.readyPods(t, "redis", 2, "")
		first := retrydv1.NewRetryServiceClient(k.dial(t, "redis", pods[0].Name))
		second := retrydv1.NewRetryServiceClient(k.dial(t, "redis", pods[1].Name))
		resp, err := first.FailedStep(t.Context(), failedStep("redis-session", 500))
		if err != nil {
			t.Fatalf("FailedStep on %s: %v", pods[0].Name, err)
		}
		retryID := resp.GetDecision().GetSchedule().GetRetryId()
		if retryID == "" {
			t.Fatalf("FailedStep on %s = %v, want a scheduled retry", pods[0].Name, resp.GetDecision())
		}
		if started := awaitStarted(t, second, retryID); started != 1 {
			t.Errorf("AwaitRetry on %s got %d Started, want 1", pods[1].Name, started)
		}

		k.checkDisruptionBudget(t, "redis", pods)
		k.checkRollingRestart(t, "redis", 1)
	})
}

// kube is what the subtests share: clients of the cluster and its node.
type kube struct {
	cs         kubernetes.Interface
	cfg        *rest.Config
	kubeconfig string
	node       *kubetest.Node
}

// namespace creates ns.
func (k *kube) namespace(t *testing.T, ns string) {
	t.Helper()
	if _, err := k.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// install runs `helm install --wait` of the chart as release `rel` into
// ns (created unless it exists) with args; it fails the test when helm
// fails or the API server warns.
func (k *kube) install(t *testing.T, ns string, args ...string) {
	t.Helper()
	h := helmOn{kubeconfig: k.kubeconfig, namespace: ns}
	args = append([]string{"install", release, chartDir(t), "--create-namespace", "--wait", "--timeout", podTimeout.String()}, args...)
	stdout, stderr, err := h.exec(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s\n%s", strings.Join(args, " "), err, stdout, stderr, k.describe(ns))
	}
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "warnings.go") || strings.Contains(strings.ToLower(line), "warning") {
			t.Errorf("helm install: the API server warned: %s", line)
		}
	}
}

// describe summarises the pods of ns and its events, for a failure.
func (k *kube) describe(ns string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	if pods, err := k.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s: phase %s, node %q\n", p.Name, p.Status.Phase, p.Spec.NodeName)
			for _, c := range p.Status.Conditions {
				fmt.Fprintf(&b, "  %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
			}
			for _, s := range p.Status.ContainerStatuses {
				fmt.Fprintf(&b, "  container %s ready=%v restarts=%d state=%+v\n", s.Name, s.Ready, s.RestartCount, s.State)
			}
		}
	}
	if events, err := k.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "event %s/%s: %s %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

// readyPods waits until exactly n pods of the release in ns are Ready (not
// counting pod UID not, nor pods being deleted) and returns them.
func (k *kube) readyPods(t *testing.T, ns string, n int, not types.UID) []corev1.Pod {
	t.Helper()
	selector := "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component!=test"
	deadline := time.Now().Add(podTimeout)
	for {
		pods, err := k.cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		var ready []corev1.Pod
		for _, p := range pods.Items {
			if p.UID != not && p.DeletionTimestamp == nil && podReady(&p) {
				ready = append(ready, p)
			}
		}
		if len(ready) == n {
			return ready
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pods of %s in %s are Ready after %v, want %d\n%s", len(ready), selector, ns, podTimeout, n, k.describe(ns))
		}
		time.Sleep(time.Second)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// checkConfined checks that the Ready pod became Ready through gRPC probes
// and that its process runs as the chart asks, as the kernel reports it:
// the kubelet turned the security context and the memory limit the API
// server stored into the CRI's, and containerd and runc applied them.
func (k *kube) checkConfined(t *testing.T, pod corev1.Pod) {
	t.Helper()
	if len(pod.Spec.Containers) != 1 || len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s has %d containers (%d statuses), want the retryd container", pod.Name, len(pod.Spec.Containers), len(pod.Status.ContainerStatuses))
	}
	c := pod.Spec.Containers[0]
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.GRPC == nil {
			t.Errorf("pod %s: the %s probe is %v, want a gRPC probe", pod.Name, name, p)
		}
	}
	id, ok := strings.CutPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if !ok {
		t.Fatalf("pod %s's container ID is %q, want a containerd one", pod.Name, pod.Status.ContainerStatuses[0].ContainerID)
	}
	pid := taskPID(t, k.node.Containerd, id)
	status := procFields(t, pid, "status")
	for field, want := range map[string]string{
		"Uid": "65532\t65532\t65532\t65532", "Gid": "65532\t65532\t65532\t65532",
		"CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapBnd": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2",
	} {
		if got := status[field]; got != want {
			t.Errorf("pod %s: /proc/%d/status %s = %q, want %q", pod.Name, pid, field, got, want)
		}
	}
	if opts := mountOptions(t, pid, "/"); !slices.Contains(opts, "ro") {
		t.Errorf("pod %s: the root filesystem is mounted %v, want read-only", pod.Name, opts)
	}
	want := c.Resources.Limits.Memory().Value()
	if got := memoryLimit(t, pid); want == 0 || got != want {
		t.Errorf("pod %s: the memory cgroup's limit is %d, the pod's limits.memory %d", pod.Name, got, want)
	}
}

// localVolume creates a local PersistentVolume without a StorageClass on
// the node, in dir, for the file store's claim to bind.
func (k *kube) localVolume(t *testing.T, name, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{k.node.Name},
				}},
			}}}},
		},
	}
	if _, err := k.cs.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// forward port-forwards a free loopback port to port of the pod, through
// the API server, the kubelet and containerd, and returns its address.
// The forward ends with the test.
func (k *kube) forward(t *testing.T, ns, pod string, port int) string {
	t.Helper()
	transport, upgrader, err := spdy.RoundTripperFor(k.cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := k.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	t.Cleanup(func() { close(stop) })
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("port-forward to %s/%s: %v", ns, pod, err)
	case <-time.After(time.Minute):
		t.Fatalf("port-forward to %s/%s not ready after a minute", ns, pod)
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("port-forward ports %v: %v", ports, err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local)))
}

// dial connects to the pod's gRPC port through a port-forward and waits
// until it answers SERVING.
func (k *kube) dial(t *testing.T, ns, pod string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(k.forward(t, ns, pod, 7700), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := waitHealthy(t.Context(), conn); err != nil {
		t.Fatalf("health of %s/%s through the port-forward: %v", ns, pod, err)
	}
	return conn
}

// checkDisruptionBudget evicts one of the two Ready pods, which the
// chart's PodDisruptionBudget (maxUnavailable 1) allows, and then the
// other, which it must refuse (429) until the first one's replacement is
// Ready; after that both are Ready again.
func (k *kube) checkDisruptionBudget(t *testing.T, ns string, pods []corev1.Pod) {
	t.Helper()
	pdbs := k.cs.PolicyV1().PodDisruptionBudgets(ns)
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := pdbs.List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 {
			t.Fatalf("%d PodDisruptionBudgets in %s, want the chart's one", len(list.Items), ns)
		}
		pdb := list.Items[0]
		if pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.DisruptionsAllowed > 0 && pdb.Status.CurrentHealthy == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the PodDisruptionBudget's status is %+v after a minute, want 2 healthy pods and a disruption allowed", pdb.Status)
		}
		time.Sleep(500 * time.Millisecond)
	}
	evict := func(pod string) error {
		return k.cs.CoreV1().Pods(ns).EvictV1(t.Context(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns}})
	}
	if err := evict(pods[0].Name); err != nil {
		t.Fatalf("evicting %s with 2 healthy pods: %v, want it allowed", pods[0].Name, err)
	}
	if err := evict(pods[1].Name); !apierrors.IsTooManyRequests(err) {
		t.Errorf("evicting %s right after %s: %v, want 429 Too Many Requests from the PodDisruptionBudget", pods[1].Name, pods[0].Name, err)
	}
	k.readyPods(t, ns, 2, pods[0].UID)
}

// checkRollingRestart restarts the release's two pods the way `kubectl
// rollout restart` does (a changed pod template annotation, here through
// `helm upgrade --reuse-values --wait`) while it samples the Ready pods:
// never fewer than minReady, the PodDisruptionBudget's minimum, and two
// new pods in the end.
func (k *kube) checkRollingRestart(t *testing.T, ns string, minReady int) {
	t.Helper()
	before := map[types.UID]bool{}
	for _, p := range k.readyPods(t, ns, 2, "") {
		before[p.UID] = true
	}
	selector := "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component!=test"
	lowest := make(chan int, 1)
	stop := make(chan struct{})
	go func() {
		low := 2
		for {
			select {
			case <-stop:
				lowest <- low
				return
			case <-time.After(200 * time.Millisecond):
			}
			pods, err := k.cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				continue
			}
			ready := 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && podReady(&p) {
					ready++
				}
			}
			low = min(low, ready)
		}
	}()
	helmOn{kubeconfig: k.kubeconfig, namespace: ns}.run(t, "upgrade", release, chartDir(t), "--reuse-values",
		"--set-string", "podAnnotations.retryd-test/restart=1", "--wait", "--timeout", podTimeout.String())
	close(stop)
	if low := <-lowest; low < minReady {
		t.Errorf("during the rolling restart only %d pods were Ready, want at least %d", low, minReady)
	}
	for _, p := range k.readyPods(t, ns, 2, "") {
		if before[p.UID] {
			t.Errorf("pod %s is still Ready after the rolling restart, want it replaced", p.Name)
		}
	}
}

// retryState opens AwaitRetry of retryID and returns its first message,
// the retry's state.
func retryState(t *testing.T, client retrydv1.RetryServiceClient, retryID string) *retrydv1.RetryState {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: retryID})
	if err != nil {
		t.Fatalf("AwaitRetry(%s): %v", retryID, err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatalf("AwaitRetry(%s): %v", retryID, err)
	}
	return msg.GetState()
}

// awaitStarted follows AwaitRetry of retryID until the stream ends and
// counts its Started messages.
func awaitStarted(t *testing.T, client retrydv1.RetryServiceClient, retryID string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: retryID})
	if err != nil {
		t.Fatalf("AwaitRetry(%s): %v", retryID, err)
	}
	started := 0
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return started
		}
		if err != nil {
			t.Fatalf("AwaitRetry(%s) after %d Started: %v", retryID, started, err)
		}
		if msg.GetStarted() != nil {
			started++
		}
	}
}

// startRedis runs redis-server on the node's address, which the pods
// reach over their bridge, and returns its URL.
func startRedis(t *testing.T, ip string) string {
	t.Helper()
	bin := retrydtest.NeedProgram(t, "redis-server", "apt-get install redis-server")
	for range 3 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cmd := exec.Command(bin, "--bind", ip, "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no",
			"--protected-mode", "no", "--dir", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		addr := net.JoinHostPort(ip, strconv.Itoa(port))
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			select {
			case <-exited:
			default:
				if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
					c.Close()
					return "redis://" + addr + "/0"
				}
				continue
			}
			break
		}
	}
	t.Fatalf("redis-server did not start on %s", ip)
	return ""
}
