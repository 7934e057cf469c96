package helm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/deploy/helm/internal/containerdtest"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
)

// runcDefaultCaps are the capabilities ctr gives a container unless told
// otherwise; the chart's `drop: [ALL]` drops each.
var runcDefaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// TestChartContainerOnRunc runs the image built by deploy/image in
// Debian's containerd and runc with what the chart's rendered pod asks of
// the runtime, as the kubelet would pass it: the rendered args, the policy
// file of the ConfigMap mounted read-only at /etc/retryd, a writable /tmp,
// a read-only root filesystem, the RuntimeDefault seccomp profile, no
// capabilities, no privilege escalation, user 65532 and the memory limit.
// The container must serve (the gRPC health check the probes make, and a
// decision through the pinned grpcurl), and the kernel must report the
// process confined as asked. The network is the host's (loopback), so this
// test needs no CNI; TestChartOnANode runs the same image under a kubelet.
func TestChartContainerOnRunc(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image and runs it in containerd (-short)")
	}
	ctd := containerdtest.Start(t, containerdtest.Options{})
	r := render(t, filepath.Join("testdata", "defaults.yaml"))
	c := r.container(t)
	pod := r.workload().pod.Spec

	work := t.TempDir()
	layout, ref, err := containerdtest.RetrydImage(work)
	if err != nil {
		t.Fatal(err)
	}
	if c.Image != ref {
		t.Fatalf("the chart's image is %s, the built image %s", c.Image, ref)
	}
	if err := ctd.Import(layout); err != nil {
		t.Fatal(err)
	}

	// The ConfigMap's volume and the emptyDir, as the kubelet lays them out.
	configDir := filepath.Join(work, "config")
	tmpDir := filepath.Join(work, "tmp")
	for _, d := range []string{configDir, tmpDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(tmpDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(configDir, "config.yaml"), []byte(r.policyFile(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["config"] != "/etc/retryd" || mounts["tmp"] != "/tmp" {
		t.Fatalf("volume mounts %v, want config at /etc/retryd and tmp at /tmp", c.VolumeMounts)
	}
	run := localArgs(t, c.Args, "/etc/retryd/config.yaml", "", nil)
	run.pinPorts(t)

	flags := runtimeFlags(t, pod, c)
	flags = append(flags,
		"--mount", "type=bind,src="+configDir+",dst=/etc/retryd,options=rbind:ro",
		"--mount", "type=bind,src="+tmpDir+",dst=/tmp,options=rbind:rw",
		"--net-host", "--detach")
	id := "retryd-chart"
	if out, err := ctd.Ctr(append(append([]string{"run"}, flags...), append([]string{ref, id, "/usr/local/bin/retryd"}, run.args...)...)...); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, ctd.Tail())
	}

	conn, err := grpc.NewClient(run.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := waitHealthy(t.Context(), conn); err != nil {
		out, _ := ctd.Ctr("tasks", "ls")
		t.Fatalf("the container never served: %v\ntasks:\n%s", err, out)
	}
	out := grpcurl(t, run.addr, "retryd.v1.RetryService/FailedStep", failedStepJSON("runc-session", 60_000))
	if !strings.Contains(out, `"retryId"`) {
		t.Errorf("grpcurl FailedStep answered %s, want a scheduled retry", out)
	}

	pid := taskPID(t, ctd, id)
	status := procFields(t, pid, "status")
	for field, want := range map[string]string{
		"Uid": "65532\t65532\t65532\t65532", "Gid": "65532\t65532\t65532\t65532",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2",
	} {
		if got := status[field]; got != want {
			t.Errorf("/proc/%d/status %s = %q, want %q", pid, field, got, want)
		}
	}
	if opts := mountOptions(t, pid, "/"); !slices.Contains(opts, "ro") {
		t.Errorf("the root filesystem is mounted %v, want read-only", opts)
	}
	if opts := mountOptions(t, pid, "/etc/retryd"); !slices.Contains(opts, "ro") {
		t.Errorf("/etc/retryd is mounted %v, want read-only", opts)
	}
	if limit, want := memoryLimit(t, pid), c.Resources.Limits.Memory().Value(); limit != want {
		t.Errorf("the container's memory limit is %d, the chart's limits.memory %d", limit, want)
	}
}

// runtimeFlags turns the pod's and container's security context and
// memory limit into ctr's flags, the way the kubelet turns them into the
// CRI's; what ctr cannot express fails the test.
func runtimeFlags(t *testing.T, pod corev1.PodSpec, c corev1.Container) []string {
	t.Helper()
	sc, psc := c.SecurityContext, pod.SecurityContext
	if sc == nil || psc == nil {
		t.Fatal("the rendered pod has no security context")
	}
	var flags []string
	if deref(sc.ReadOnlyRootFilesystem) {
		flags = append(flags, "--read-only")
	}
	seccomp := psc.SeccompProfile
	if sc.SeccompProfile != nil {
		seccomp = sc.SeccompProfile
	}
	if seccomp != nil && seccomp.Type == corev1.SeccompProfileTypeRuntimeDefault {
		flags = append(flags, "--seccomp")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		flags = append(flags, "--allow-new-privs")
	}
	if sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL") {
		for _, capability := range runcDefaultCaps {
			flags = append(flags, "--cap-drop", capability)
		}
	}
	// ctr 1.6 has no --user: the image's user (65532:65532) must be the
	// one the chart asks for.
	user := sc.RunAsUser
	if user == nil {
		user = psc.RunAsUser
	}
	if deref(user) != 65532 {
		t.Fatalf("the chart runs as user %v; the image's user is 65532", user)
	}
	if limit := c.Resources.Limits.Memory(); !limit.IsZero() {
		flags = append(flags, "--memory-limit", strconv.FormatInt(limit.Value(), 10))
	}
	return flags
}

// waitHealthy waits until the server answers SERVING to the gRPC health
// check the kubelet's probes make.
func waitHealthy(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%v (last: %v %v)", ctx.Err(), resp, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// taskPID is the host PID of the container's process.
func taskPID(t *testing.T, ctd *containerdtest.Containerd, id string) int {
	t.Helper()
	out, err := ctd.Ctr("tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no task %s in\n%s", id, out)
	return 0
}

// procFields reads /proc/PID/file's "Name:\tvalue" lines.
func procFields(t *testing.T, pid int, file string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok {
			fields[name] = strings.TrimSpace(value)
		}
	}
	return fields
}

// mountOptions returns the per-mount options of the mount at path in the
// process's mount namespace.
func mountOptions(t *testing.T, pid int, path string) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == path {
			opts = strings.Split(f[5], ",") // the last mount at path is the one seen
		}
	}
	if opts == nil {
		t.Fatalf("no mount at %s in /proc/%d/mountinfo", path, pid)
	}
	return opts
}

// memoryLimit reads the memory limit of the process's cgroup (v1 or v2).
func memoryLimit(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			file = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
		case parts[0] == "0" && parts[1] == "":
			file = filepath.Join("/sys/fs/cgroup", parts[2], "memory.max")
		default:
			continue
		}
		v, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		return n
	}
	t.Fatalf("no memory cgroup limit found for process %d:\n%s", pid, data)
	return 0
}

// failedStep is a rate-limited step of session whose retry is due after
// delayMs.
func failedStep(session string, delayMs uint64) *retrydv1.FailedStepRequest {
	var req retrydv1.FailedStepRequest
	if err := protojson.Unmarshal([]byte(failedStepJSON(session, delayMs)), &req); err != nil {
		panic(err)
	}
	return &req
}

// failedStepJSON is failedStep's request in the JSON grpcurl sends.
func failedStepJSON(session string, delayMs uint64) string {
	return fmt.Sprintf(`{"sessionId": %q, "turn": 1, "step": 1, "provider": "p",
		"failure": {"code": "RATE_LIMIT", "httpStatus": 429},
		"policy": {"maxRetries": 3, "backoff": {"initialDelayMs": "%d", "maxDelayMs": "%d"}}}`, session, delayMs, delayMs)
}

// grpcurl calls method at addr with the pinned grpcurl (tools/protoc),
// which finds the method through the server's reflection, and returns its
// output.
func grpcurl(t *testing.T, addr, method, request string) string {
	t.Helper()
	bin, err := retrydtest.PinnedTool("tools/protoc/go.mod", "grpcurl")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-plaintext", "-d", request, addr, method).CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl %s %s: %v\n%s", addr, method, err, out)
	}
	return string(out)
}
