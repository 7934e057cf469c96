package helm_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/retryd/retryd/auth"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/store/redis/redistest"
	yamlv3 "go.yaml.in/yaml/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

const (
	release   = "rel"
	namespace = "agents"
	// kubeVersion is passed to helm template and lint: a helm built with
	// `go tool` lacks the ldflags that set its default Kubernetes version
	// (v1.20), which is below Chart.yaml's kubeVersion.
	kubeVersion = "1.34.0"
	// retryService is the health name of the RetryService.
	retryService = "retryd.v1.RetryService"
)

// workDir holds the binaries the tests build; TestMain removes it.
var workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "retryd-chart-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// repoRoot is the module root, found from the test's working directory
// (deploy/helm).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.HasPrefix(mod, []byte("module github.com/retryd/retryd\n")) {
		t.Fatalf("%s is not the retryd module root (go.mod: %v)", root, err)
	}
	return root
}

func chartDir(t *testing.T) string { return filepath.Join(repoRoot(t), "deploy", "helm", "retryd") }

// once runs build at most once per test binary and remembers its result.
type once[T any] struct {
	once sync.Once
	val  T
	err  error
}

func (o *once[T]) get(build func() (T, error)) (T, error) {
	o.once.Do(func() { o.val, o.err = build() })
	return o.val, o.err
}

var helmBin once[string]

// helm returns the pinned helm's executable: `go tool -n` builds it into the
// Go build cache (minutes on a cold cache) and prints its path, so later
// calls skip the go command.
func helm(t *testing.T) string {
	t.Helper()
	path, err := helmBin.get(func() (string, error) {
		return retrydtest.PinnedTool("tools/helm/go.mod", "helm")
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// runHelm runs the pinned helm in the repository root with its cache,
// config and data homes in a temporary directory and no kubeconfig.
func runHelm(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, helm(t), args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(filterEnv(os.Environ(), "HELM_", "KUBECONFIG="),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "kubeconfig-absent"),
	)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// filterEnv drops the variables whose NAME=value starts with any prefix.
func filterEnv(env []string, prefixes ...string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(kv, p) })
	})
}

// goodValues lists testdata/*.yaml: values files the chart must accept.
func goodValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in testdata: %v", err)
	}
	return files
}

// rendered is one helm template output, decoded.
type rendered struct {
	deployment     *appsv1.Deployment  // the workload with store.kind memory
	statefulSet    *appsv1.StatefulSet // the workload with store.kind file
	configMap      *corev1.ConfigMap
	serviceAccount *corev1.ServiceAccount
	services       map[string]*corev1.Service
	testPod        *corev1.Pod
	pdb            *policyv1.PodDisruptionBudget
	hpa            *autoscalingv2.HorizontalPodAutoscaler
	serviceMonitor *monitoringv1.ServiceMonitor
	objects        []metav1.Object // every object, for label checks
}

// newObject returns an empty typed object for a rendered apiVersion/kind.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, true
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "v1 Pod":
		return &corev1.Pod{}, true
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, true
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "gateway.networking.k8s.io/v1 GRPCRoute":
		return &gatewayv1.GRPCRoute{}, true
	}
	return nil, false
}

// decodeStrict decodes one YAML document into out, rejecting duplicate keys,
// unknown fields and trailing data.
func decodeStrict(doc []byte, out any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("YAMLToJSONStrict: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the object")
	}
	return nil
}

// splitDocuments splits a multi-document YAML stream on "---" lines and
// drops documents that hold only comments.
func splitDocuments(stream string) [][]byte {
	var docs [][]byte
	var cur strings.Builder
	flush := func() {
		content := false
		for line := range strings.SplitSeq(cur.String(), "\n") {
			if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "#") {
				content = true
			}
		}
		if content {
			docs = append(docs, []byte(cur.String()))
		}
		cur.Reset()
	}
	sc := bufio.NewScanner(strings.NewReader(stream))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		if sc.Text() == "---" {
			flush()
			continue
		}
		cur.WriteString(sc.Text())
		cur.WriteByte('\n')
	}
	flush()
	return docs
}

// render runs helm template with a values file and decodes every document.
func render(t *testing.T, valuesFile string) *rendered {
	t.Helper()
	stdout, stderr, err := runHelm(t, "template", release, chartDir(t),
		"--namespace", namespace, "--kube-version", kubeVersion, "-f", absPath(t, valuesFile))
	if err != nil {
		t.Fatalf("helm template -f %s: %v\n%s", valuesFile, err, stderr)
	}
	r := &rendered{services: map[string]*corev1.Service{}}
	for i, doc := range splitDocuments(stdout) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		obj, ok := newObject(tm.APIVersion, tm.Kind)
		if !ok {
			t.Errorf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
			continue
		}
		if err := decodeStrict(doc, obj); err != nil {
			t.Fatalf("document %d (%s %s) does not decode strictly: %v\n%s", i, tm.APIVersion, tm.Kind, err, doc)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			setOnce(t, &r.deployment, o)
		case *appsv1.StatefulSet:
			setOnce(t, &r.statefulSet, o)
		case *corev1.ConfigMap:
			setOnce(t, &r.configMap, o)
		case *corev1.ServiceAccount:
			setOnce(t, &r.serviceAccount, o)
		case *corev1.Service:
			r.services[o.Name] = o
		case *corev1.Pod:
			setOnce(t, &r.testPod, o)
		case *policyv1.PodDisruptionBudget:
			setOnce(t, &r.pdb, o)
		case *autoscalingv2.HorizontalPodAutoscaler:
			setOnce(t, &r.hpa, o)
		case *monitoringv1.ServiceMonitor:
			setOnce(t, &r.serviceMonitor, o)
		}
		r.objects = append(r.objects, obj.(metav1.Object))
	}
	if (r.deployment == nil) == (r.statefulSet == nil) || r.configMap == nil || r.testPod == nil {
		t.Fatalf("render of %s lacks the ConfigMap or test Pod, or has not exactly one workload (Deployment %v, StatefulSet %v)",
			valuesFile, r.deployment != nil, r.statefulSet != nil)
	}
	return r
}

// workload is what the Deployment and the StatefulSet share.
type workload struct {
	kind     string
	name     string
	replicas *int32
	selector *metav1.LabelSelector
	pod      *corev1.PodTemplateSpec
}

// workload returns the rendered workload, whichever its kind.
func (r *rendered) workload() workload {
	if d := r.deployment; d != nil {
		return workload{"Deployment", d.Name, d.Spec.Replicas, d.Spec.Selector, &d.Spec.Template}
	}
	s := r.statefulSet
	return workload{"StatefulSet", s.Name, s.Spec.Replicas, s.Spec.Selector, &s.Spec.Template}
}

func setOnce[T any](t *testing.T, dst **T, v *T) {
	t.Helper()
	if *dst != nil {
		t.Errorf("two %T objects rendered", v)
	}
	*dst = v
}

func absPath(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// container returns the retryd container of the workload.
func (r *rendered) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := r.workload().pod.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "retryd" {
		t.Fatalf("containers = %v, want one named retryd", cs)
	}
	return cs[0]
}

// serverFlags parses `serve --name=value …` into a map, failing on anything
// else.
func serverFlags(t *testing.T, args []string) map[string]string {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("args = %q, want serve first", args)
	}
	flags := map[string]string{}
	for _, a := range args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			t.Fatalf("arg %q is not --name=value", a)
		}
		if _, dup := flags[name]; dup {
			t.Errorf("flag --%s given twice", name)
		}
		flags[name] = value
	}
	return flags
}

// policyFile is the rendered ConfigMap's config.yaml.
func (r *rendered) policyFile(t *testing.T) string {
	t.Helper()
	data, ok := r.configMap.Data["config.yaml"]
	if !ok || len(r.configMap.Data) != 1 {
		t.Fatalf("ConfigMap data keys = %v, want only config.yaml", slices.Collect(maps.Keys(r.configMap.Data)))
	}
	return data
}

// expectation is what one good values file must render, beyond what every
// render must have.
type expectation struct {
	flags        map[string]string // every --flag of serve except --config
	port         int32             // server.port
	metricsPort  int32             // server.metricsPort; 0: no metrics endpoint
	healthPort   int32             // tls.healthPort with tls.enabled; 0: TLS off, health on port
	servicePort  int32
	grace        int64
	image        string
	replicas     *int32 // nil: left to the HPA
	resources    bool
	probes       bool
	readiness    string // readiness probe's health service
	otel         bool
	optional     bool // PDB, HPA, ServiceMonitor, headless Service
	extra        func(t *testing.T, r *rendered)
	testPodImage string
	// redisURL is the Secret key store.kind redis takes the Redis URL
	// from (env RETRYD_STORE); nil for the other stores.
	redisURL *corev1.SecretKeySelector
	// credentials is the Secret key of the credentials file with
	// auth.enabled (--auth-credentials); nil without authentication.
	credentials *corev1.SecretKeySelector
	// served checks the running binary, started with the rendered args,
	// over conn (which sends the test's token when auth is on).
	served func(ctx context.Context, t *testing.T, conn *grpc.ClientConn)
}

func defaultFlags(overrides map[string]string) map[string]string {
	f := map[string]string{
		"listen": "0.0.0.0:7700", "config-reload-interval": "5s", "chain-ttl": "1h", "abandon-grace": "60s", "shutdown-timeout": "10s",
		"log-level": "info", "log-format": "text", "event-log-size": "100000", "memory-limit-ratio": "0.9",
		"metrics-listen": "0.0.0.0:9464",
		// server.limits: the server's defaults.
		"max-recv-msg-bytes": "1048576", "max-concurrent-streams": "1000", "keepalive-min-time": "10s",
		"max-connection-idle": "5m", "max-connection-age": "30m", "max-connection-age-grace": "30s",
		"unary-timeout": "10s",
		// server.limits, admission: the server's defaults.
		"max-pending-retries-per-tenant": "20000", "max-pending-retries": "50000",
		"max-open-chains-per-tenant": "40000", "max-open-chains": "100000",
		"max-active-sessions-per-tenant": "20000", "max-awaiters-per-retry": "8", "max-awaiters": "20000",
	}
	maps.Copy(f, overrides)
	return f
}

// withoutFlag deletes a flag from a defaultFlags map.
func withoutFlag(f map[string]string, name string) map[string]string {
	delete(f, name)
	return f
}

func ptr[T any](v T) *T { return &v }

var expectations = map[string]expectation{
	"defaults.yaml": {
		flags: defaultFlags(nil), port: 7700, metricsPort: 9464, servicePort: 7700, grace: 15,
		image: "ghcr.io/retryd/retryd:0.1.0", replicas: ptr[int32](1), resources: true, probes: true,
		testPodImage: "ghcr.io/retryd/retryd:0.1.0",
		extra: func(t *testing.T, r *rendered) {
			if r.serviceAccount == nil || r.serviceAccount.Name != "rel-retryd" {
				t.Errorf("ServiceAccount = %v, want rel-retryd", r.serviceAccount)
			}
			if s := r.deployment.Spec.Strategy.Type; s != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("strategy = %q, want Recreate (one pod holds the chains)", s)
			}
			if got := r.policyFile(t); got != "policies: {}\nproviders: {}\n" {
				t.Errorf("default policy file = %q", got)
			}
		},
	},
	"policies.yaml": {
		flags: defaultFlags(map[string]string{
			"chain-ttl": "2h30m", "abandon-grace": "90s", "shutdown-timeout": "1m30s",
			"config-reload-interval": "1500ms", "log-level": "debug", "log-format": "json", "event-log-size": "2000000",
			"metrics-listen": "0.0.0.0:9100",
		}),
		port: 7700, metricsPort: 9100, servicePort: 7700, grace: 95,
		image: "ghcr.io/retryd/retryd:0.1.0", replicas: ptr[int32](1), resources: true, probes: true,
		testPodImage: "ghcr.io/retryd/retryd:0.1.0",
		extra: func(t *testing.T, r *rendered) {
			var file struct {
				Policies      map[string]map[string]any `json:"policies"`
				Providers     map[string]map[string]any `json:"providers"`
				DefaultPolicy map[string]any            `json:"defaultPolicy"`
				Fleet         map[string]any            `json:"fleet"`
			}
			if err := decodeStrict([]byte(r.policyFile(t)), &file); err != nil {
				t.Fatalf("policy file: %v", err)
			}
			if got := slices.Sorted(maps.Keys(file.Policies)); !slices.Equal(got, []string{"bounded", "relay"}) {
				t.Errorf("policies = %v", got)
			}
			if file.Policies["bounded"]["minAttemptMs"] != float64(1500000) {
				t.Errorf("minAttemptMs = %v, want 1500000 written as an integer", file.Policies["bounded"]["minAttemptMs"])
			}
			if !strings.Contains(r.policyFile(t), "minAttemptMs: 1500000\n") {
				t.Errorf("large integers must not be rendered in float notation:\n%s", r.policyFile(t))
			}
			if file.DefaultPolicy["maxRetries"] != float64(3) {
				t.Errorf("defaultPolicy = %v", file.DefaultPolicy)
			}
			// The fleet blocks are written as given: every key of the
			// top-level one, and the providers' own beside (or without)
			// their retryPolicy.
			if len(file.Fleet) != 14 || file.Fleet["capacity"] != float64(50) || file.Fleet["refillPerSecond"] != 0.5 ||
				file.Fleet["disableBudget"] != false || file.Fleet["probeTimeoutMs"] != float64(60000) {
				t.Errorf("fleet = %v, want the 14 keys of policies.yaml", file.Fleet)
			}
			if got := file.Providers["openai"]["fleet"]; !sameMap(got, map[string]any{"capacity": 20.0, "openForMs": 2000.0}) ||
				file.Providers["openai"]["retryPolicy"] == nil {
				t.Errorf("providers.openai = %v, want its retryPolicy and fleet {capacity: 20, openForMs: 2000}", file.Providers["openai"])
			}
			if got := file.Providers["mistral"]; len(got) != 1 || !sameMap(got["fleet"], map[string]any{"capacity": 5.0, "disableCircuit": true}) {
				t.Errorf("providers.mistral = %v, want only fleet {capacity: 5, disableCircuit: true}", got)
			}
		},
		served: checkFleetServed,
	},
	"rolling-port.yaml": {
		flags: defaultFlags(map[string]string{"listen": "0.0.0.0:9443", "shutdown-timeout": "2500ms"}),
		port:  9443, metricsPort: 9464, servicePort: 7700, grace: 8,
		image: "ghcr.io/retryd/retryd:0.1.0", replicas: ptr[int32](1), resources: true, probes: true,
		readiness: retryService, testPodImage: "ghcr.io/retryd/retryd:0.1.0",
		extra: func(t *testing.T, r *rendered) {
			s := r.deployment.Spec.Strategy
			if s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil ||
				s.RollingUpdate.MaxSurge.String() != "0" || s.RollingUpdate.MaxUnavailable.String() != "1" {
				t.Errorf("strategy = %+v, want RollingUpdate maxSurge 0 maxUnavailable 1", s)
			}
		},
	},
	"minimal-pod.yaml": {
		flags: withoutFlag(defaultFlags(nil), "metrics-listen"), port: 7700, metricsPort: 0, servicePort: 7700, grace: 15,
		image:        "ghcr.io/retryd/retryd@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		replicas:     ptr[int32](0),
		testPodImage: "ghcr.io/retryd/retryd@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		extra: func(t *testing.T, r *rendered) {
			if r.serviceAccount != nil {
				t.Errorf("ServiceAccount rendered though serviceAccount.create is false")
			}
			if sa := r.deployment.Spec.Template.Spec.ServiceAccountName; sa != "default" {
				t.Errorf("serviceAccountName = %q, want default", sa)
			}
			if s := r.deployment.Spec.Strategy; s.Type != "" || s.RollingUpdate != nil {
				t.Errorf("strategy = %+v, want none (strategy: null)", s)
			}
		},
	},
	"file-store.yaml": {
		flags: defaultFlags(map[string]string{"shutdown-timeout": "5s", "store": "file:/data/retryd"}),
		port:  7700, metricsPort: 9464, servicePort: 7700, grace: 10,
		image: "ghcr.io/retryd/retryd:0.1.0", replicas: ptr[int32](1), resources: true, probes: true,
		testPodImage: "ghcr.io/retryd/retryd:0.1.0",
		extra: func(t *testing.T, r *rendered) {
			checkFileStore(t, r, fileStore{
				path: "/data/retryd", size: "5Gi", storageClassName: ptr("fast-ssd"),
				accessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			})
			if r.pdb == nil || r.pdb.Spec.MaxUnavailable == nil || r.pdb.Spec.MaxUnavailable.IntValue() != 1 {
				t.Errorf("PodDisruptionBudget = %+v, want maxUnavailable 1 (allowed with the file store)", r.pdb)
			}
			if r.hpa != nil {
				t.Errorf("HorizontalPodAutoscaler rendered with the file store")
			}
		},
	},
	"tls.yaml": {
		flags: defaultFlags(map[string]string{
			"max-recv-msg-bytes": "4194304", "max-concurrent-streams": "200", "keepalive-min-time": "30s",
			"max-connection-idle": "0s", "max-connection-age": "1h", "max-connection-age-grace": "1m30s", "unary-timeout": "15s",
			"tls-cert": tlsDir + "/tls.crt", "tls-key": tlsDir + "/tls.key", "tls-client-ca": tlsDir + "/ca.crt",
			"tls-reload-interval": "2s", "health-listen": "0.0.0.0:7710",
		}),
		port: 7700, metricsPort: 9464, healthPort: 7710, servicePort: 7700, grace: 15,
		image: "ghcr.io/retryd/retryd:0.1.0", replicas: ptr[int32](1), resources: true, probes: true,
		testPodImage: "ghcr.io/retryd/retryd:0.1.0",
		extra: func(t *testing.T, r *rendered) {
			checkTLSVolume(t, r, "retryd-tls", "retryd-client-ca")
		},
	},
	"redis-3-replicas.yaml": {
		flags: defaultFlags(nil), port: 7700, metricsPort: 9464, servicePort: 7700, grace: 15,
		image: "ghcr.io/retryd/retryd:0.1.0", replicas: nil, resources: true, probes: true, otel: true,
		testPodImage: "ghcr.io/retryd/retryd:0.1.0",
		redisURL: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "retryd-redis"}, Key: "redis-url",
		},
		extra: checkRedisReplicas,
	},
	"auth.yaml": {
		flags: defaultFlags(map[string]string{
			"max-pending-retries-per-tenant": "1", "max-pending-retries": "40000",
			"max-open-chains-per-tenant": "30000", "max-open-chains": "0",
			"max-active-sessions-per-tenant": "15000", "max-awaiters-per-retry": "4", "max-awaiters": "10000",
			"auth-credentials": authDir + "/credentials.yaml", "auth-reload-interval": "2s",
		}),
		port: 7700, metricsPort: 9464, servicePort: 7700, grace: 15,
		image: "ghcr.io/retryd/retryd:0.1.0", replicas: ptr[int32](1), resources: true, probes: true,
		testPodImage: "ghcr.io/retryd/retryd:0.1.0",
		credentials: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "retryd-credentials"}, Key: "tenants.yaml",
		},
		served: checkAuthServed,
	},
	"all-options.yaml": {
		flags: defaultFlags(map[string]string{"memory-limit-ratio": "0.75", "pprof": "true"}), port: 7700, metricsPort: 9464, servicePort: 443, grace: 45,
		image: "registry.example.test/retryd/retryd:0.1.0-rc.1", replicas: nil, resources: true, probes: true,
		otel: true, optional: true, testPodImage: "registry.example.test/retryd/retryd-test:1",
		extra: checkAllOptions,
	},
}

// checkRedisReplicas asserts the shared Redis store with three replicas:
// a Deployment whose replicas the autoscaler (3 to 6) owns, and which
// renders replicas 3 without it, a rolling update, and a PodDisruptionBudget
// and an autoscaler of the Deployment (checkCommon checks the env and that
// there is no --store flag).
func checkRedisReplicas(t *testing.T, r *rendered) {
	t.Helper()
	if r.deployment == nil {
		t.Fatal("no Deployment for store.kind redis")
	}
	if r.hpa == nil || deref(r.hpa.Spec.MinReplicas) != 3 || r.hpa.Spec.MaxReplicas != 6 ||
		r.hpa.Spec.ScaleTargetRef.Kind != "Deployment" || r.hpa.Spec.ScaleTargetRef.Name != r.deployment.Name {
		t.Errorf("HorizontalPodAutoscaler = %+v, want 3 to 6 replicas of the Deployment %s", r.hpa, r.deployment.Name)
	}
	if r.pdb == nil || r.pdb.Spec.MinAvailable == nil || r.pdb.Spec.MinAvailable.IntValue() != 2 ||
		!maps.Equal(r.pdb.Spec.Selector.MatchLabels, r.deployment.Spec.Selector.MatchLabels) {
		t.Errorf("PodDisruptionBudget = %+v, want minAvailable 2 of the Deployment's pods", r.pdb)
	}
	if s := r.deployment.Spec.Strategy; s.Type != appsv1.RollingUpdateDeploymentStrategyType {
		t.Errorf("strategy = %+v, want RollingUpdate", s)
	}
	if strings.Contains(r.policyFile(t), "redis") {
		t.Errorf("the ConfigMap mentions redis:\n%s", r.policyFile(t))
	}

	// Without the autoscaler the Deployment carries replicaCount itself.
	data, err := os.ReadFile(filepath.Join("testdata", "redis-3-replicas.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	values["autoscaling"] = map[string]any{"enabled": false}
	out, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	noHPA := render(t, path)
	if noHPA.deployment == nil || deref(noHPA.deployment.Spec.Replicas) != 3 || noHPA.hpa != nil {
		t.Errorf("without the autoscaler: Deployment %v with replicas %d, HPA %v; want a Deployment of 3 replicas and no HPA",
			noHPA.deployment != nil, deref(noHPA.workload().replicas), noHPA.hpa != nil)
	}
}

// tlsDir is where the chart mounts the TLS files.
const tlsDir = "/etc/retryd-tls"

// checkTLSVolume asserts the TLS files of tls.enabled: one projected volume
// of tls.crt and tls.key from existingSecret and, unless clientCaSecret is
// empty, ca.crt from it, mounted read-only at tlsDir (checkCommon checks
// that the flags point there).
func checkTLSVolume(t *testing.T, r *rendered, existingSecret, clientCaSecret string) {
	t.Helper()
	c := r.container(t)
	var mounts []corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if m.Name == "tls" || strings.HasPrefix(m.MountPath, tlsDir) {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) != 1 || mounts[0].Name != "tls" || mounts[0].MountPath != tlsDir || !mounts[0].ReadOnly || mounts[0].SubPath != "" {
		t.Errorf("TLS mounts = %+v, want the volume tls mounted read-only at %s (no subPath: rotations must reach the pod)", mounts, tlsDir)
	}
	i := slices.IndexFunc(r.workload().pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "tls" })
	if i < 0 || r.workload().pod.Spec.Volumes[i].Projected == nil {
		t.Fatalf("no projected volume tls: %+v", r.workload().pod.Spec.Volumes)
	}
	type file struct{ secret, key, path string }
	var got []file
	for _, src := range r.workload().pod.Spec.Volumes[i].Projected.Sources {
		if src.Secret == nil || deref(src.Secret.Optional) {
			t.Errorf("projected source %+v, want a required Secret", src)
			continue
		}
		for _, item := range src.Secret.Items {
			got = append(got, file{src.Secret.Name, item.Key, item.Path})
		}
	}
	want := []file{{existingSecret, "tls.crt", "tls.crt"}, {existingSecret, "tls.key", "tls.key"}}
	if clientCaSecret != "" {
		want = append(want, file{clientCaSecret, "ca.crt", "ca.crt"})
	}
	if !slices.Equal(got, want) {
		t.Errorf("TLS volume files = %+v, want %+v", got, want)
	}
}

// authDir is where the chart mounts the credentials file.
const authDir = "/etc/retryd-auth"

// checkAuthVolume asserts the credentials file of auth.enabled: a volume of
// the one key of the Secret, as credentials.yaml, mounted read-only as a
// directory at authDir — never with subPath, which would pin the file the
// pod started with and hide the kubelet's updates from retryd's reload
// (checkCommon checks that --auth-credentials points there).
func checkAuthVolume(t *testing.T, r *rendered, want *corev1.SecretKeySelector) {
	t.Helper()
	c := r.container(t)
	var mounts []corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if m.Name == "auth" || strings.HasPrefix(m.MountPath, authDir) {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) != 1 || mounts[0].Name != "auth" || mounts[0].MountPath != authDir || !mounts[0].ReadOnly || mounts[0].SubPath != "" || mounts[0].SubPathExpr != "" {
		t.Errorf("auth mounts = %+v, want the volume auth mounted read-only at %s without subPath (Secret updates must reach the pod)", mounts, authDir)
	}
	vols := r.workload().pod.Spec.Volumes
	i := slices.IndexFunc(vols, func(v corev1.Volume) bool { return v.Name == "auth" })
	if i < 0 || vols[i].Secret == nil {
		t.Fatalf("no Secret volume auth: %+v", vols)
	}
	sec := vols[i].Secret
	wantItems := []corev1.KeyToPath{{Key: want.Key, Path: "credentials.yaml"}}
	if sec.SecretName != want.Name || !slices.Equal(sec.Items, wantItems) || deref(sec.Optional) || deref(sec.DefaultMode) != 0o444 {
		t.Errorf("auth volume = %+v (mode %o), want the required Secret %s, only its key %s as credentials.yaml, mode 0444",
			sec, deref(sec.DefaultMode), want.Name, want.Key)
	}
}

// fileStore is what store.file renders.
type fileStore struct {
	path             string
	size             string
	storageClassName *string // nil: the field is left out
	accessModes      []corev1.PersistentVolumeAccessMode
}

// checkFileStore asserts the StatefulSet of store.kind file: its headless
// Service, its volumeClaimTemplate and the pod's writable mount of it, with
// the root filesystem still read-only (checkCommon) and an fsGroup that lets
// the non-root user write the volume.
func checkFileStore(t *testing.T, r *rendered, want fileStore) {
	t.Helper()
	s := r.statefulSet
	if s == nil {
		t.Fatal("no StatefulSet")
	}
	headless := r.services[s.Name+"-headless"]
	if s.Spec.ServiceName != s.Name+"-headless" || headless == nil || headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("serviceName = %q, headless Service %+v: want the headless Service %s-headless", s.Spec.ServiceName, headless, s.Name)
	} else if !selects(metav1.LabelSelector{MatchLabels: headless.Spec.Selector}, s.Spec.Template.Labels) {
		t.Errorf("the headless Service %v does not select the StatefulSet's pods %v", headless.Spec.Selector, s.Spec.Template.Labels)
	}
	if s.Spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType || s.Spec.PodManagementPolicy != appsv1.OrderedReadyPodManagement {
		t.Errorf("updateStrategy %+v, podManagementPolicy %q: want RollingUpdate, OrderedReady (never two pods at once)",
			s.Spec.UpdateStrategy, s.Spec.PodManagementPolicy)
	}

	if len(s.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("volumeClaimTemplates = %+v, want one", s.Spec.VolumeClaimTemplates)
	}
	pvc := s.Spec.VolumeClaimTemplates[0]
	if pvc.Name != "data" {
		t.Errorf("volumeClaimTemplate name = %q, want data", pvc.Name)
	}
	// The template cannot change after install, so its labels must not
	// carry the chart version.
	if !maps.Equal(pvc.Labels, s.Spec.Selector.MatchLabels) {
		t.Errorf("volumeClaimTemplate labels = %v, want only the selector labels %v", pvc.Labels, s.Spec.Selector.MatchLabels)
	}
	if !slices.Equal(pvc.Spec.AccessModes, want.accessModes) {
		t.Errorf("accessModes = %v, want %v", pvc.Spec.AccessModes, want.accessModes)
	}
	if !ptrEqual(pvc.Spec.StorageClassName, want.storageClassName) {
		t.Errorf("storageClassName = %v (set: %v), want %v (set: %v)",
			deref(pvc.Spec.StorageClassName), pvc.Spec.StorageClassName != nil, deref(want.storageClassName), want.storageClassName != nil)
	}
	if got := pvc.Spec.Resources.Requests.Storage(); got.String() != want.size || len(pvc.Spec.Resources.Requests) != 1 {
		t.Errorf("requests = %v, want storage %s", pvc.Spec.Resources.Requests, want.size)
	}

	spec := s.Spec.Template.Spec
	if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == pvc.Name }) {
		t.Errorf("a pod volume named %s shadows the volumeClaimTemplate", pvc.Name)
	}
	c := r.container(t)
	var mounts []corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if m.Name == pvc.Name || m.MountPath == want.path {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) != 1 || mounts[0].Name != pvc.Name || mounts[0].MountPath != want.path || mounts[0].ReadOnly || mounts[0].SubPath != "" {
		t.Errorf("mounts of %s / at %s = %+v, want %s mounted writable at %s", pvc.Name, want.path, mounts, pvc.Name, want.path)
	}
	if flag := serverFlags(t, c.Args)["store"]; flag != "file:"+want.path {
		t.Errorf("--store=%s, want file:%s", flag, want.path)
	}
	if psc := spec.SecurityContext; psc == nil || deref(psc.FSGroup) != 65532 ||
		deref(psc.FSGroupChangePolicy) != corev1.FSGroupChangeOnRootMismatch {
		t.Errorf("pod securityContext = %+v, want fsGroup 65532 with fsGroupChangePolicy OnRootMismatch", psc)
	}
}

// TestFileStoreStorageClass renders store.kind file with each meaning of
// storageClassName, and the store.file defaults.
func TestFileStoreStorageClass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		value string
		want  *string
	}{
		{"cluster default", `""`, nil},
		{"no dynamic provisioning", `"-"`, ptr("")},
		{"named class", `standard`, ptr("standard")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			values := filepath.Join(t.TempDir(), "values.yaml")
			body := "store:\n  kind: file\n  file:\n    persistence:\n      storageClassName: " + tc.value + "\n"
			if err := os.WriteFile(values, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			r := render(t, values)
			checkFileStore(t, r, fileStore{
				path: "/var/lib/retryd", size: "1Gi", storageClassName: tc.want,
				accessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			})
		})
	}
}

// checkAllOptions asserts the optional objects of all-options.yaml.
func checkAllOptions(t *testing.T, r *rendered) {
	selector := map[string]string{
		"app.kubernetes.io/name": "retryd", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "server",
	}
	if r.pdb == nil || r.pdb.Spec.MinAvailable == nil || r.pdb.Spec.MinAvailable.IntValue() != 0 || r.pdb.Spec.MaxUnavailable != nil {
		t.Errorf("PodDisruptionBudget = %+v, want minAvailable 0 only", r.pdb)
	} else if !maps.Equal(r.pdb.Spec.Selector.MatchLabels, selector) {
		t.Errorf("PDB selector = %v", r.pdb.Spec.Selector.MatchLabels)
	}
	if r.hpa == nil {
		t.Fatal("no HorizontalPodAutoscaler")
	}
	if ref := r.hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != r.deployment.Name || ref.APIVersion != "apps/v1" {
		t.Errorf("HPA target = %+v", ref)
	}
	if r.hpa.Spec.MaxReplicas != 1 || len(r.hpa.Spec.Metrics) != 2 || r.hpa.Spec.Behavior == nil {
		t.Errorf("HPA spec = %+v", r.hpa.Spec)
	}
	sm := r.serviceMonitor
	if sm == nil || len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor = %+v, want one endpoint", sm)
	}
	if ep := sm.Spec.Endpoints[0]; ep.Port != "metrics" || ep.Path != "/metrics" || ep.Scheme == nil || *ep.Scheme != "http" || ep.Interval != "15s" || ep.ScrapeTimeout != "5s" {
		t.Errorf("ServiceMonitor endpoint = %+v, want http /metrics on port metrics every 15s", ep)
	}
	// The endpoint names a port of the Service it selects, whose target is
	// the container port of --metrics-listen (checkCommon checks that one).
	if !slices.ContainsFunc(r.services["retryd-all"].Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == sm.Spec.Endpoints[0].Port && p.TargetPort.String() == "metrics"
	}) {
		t.Errorf("the ServiceMonitor scrapes port %q, which the Service retryd-all lacks: %+v",
			sm.Spec.Endpoints[0].Port, r.services["retryd-all"].Spec.Ports)
	}
	if sm.Labels["release"] != "prometheus" || !maps.Equal(sm.Spec.Selector.MatchLabels, selector) {
		t.Errorf("ServiceMonitor labels %v selector %v", sm.Labels, sm.Spec.Selector.MatchLabels)
	}
	headless := r.services["retryd-all-headless"]
	if headless == nil || headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("headless Service = %+v", headless)
	}
	checkServicePorts(t, headless, 7700, 9464, 0)
	if !selects(sm.Spec.Selector, r.services["retryd-all"].Labels) || selects(sm.Spec.Selector, headless.Labels) {
		t.Errorf("the ServiceMonitor must select the main Service and skip the headless one")
	}
	if svc := r.services["retryd-all"]; svc.Spec.Type != corev1.ServiceTypeNodePort || svc.Spec.Ports[0].NodePort != 30700 {
		t.Errorf("Service = %+v, want NodePort 30700", svc.Spec)
	}

	spec := r.deployment.Spec.Template.Spec
	if len(spec.TopologySpreadConstraints) != 2 {
		t.Fatalf("topologySpreadConstraints = %+v", spec.TopologySpreadConstraints)
	}
	if got := spec.TopologySpreadConstraints[0].LabelSelector; got == nil || !maps.Equal(got.MatchLabels, selector) {
		t.Errorf("constraint without labelSelector got %v, want the selector labels", got)
	}
	if got := spec.TopologySpreadConstraints[1].LabelSelector; got == nil || got.MatchLabels["example.test/tier"] != "control" || len(got.MatchLabels) != 1 {
		t.Errorf("constraint with its own labelSelector got %v, want it unchanged", got)
	}
	if spec.PriorityClassName != "system-cluster-critical" || spec.NodeSelector["kubernetes.io/os"] != "linux" ||
		len(spec.Tolerations) != 1 || spec.Affinity == nil || len(spec.ImagePullSecrets) != 1 {
		t.Errorf("scheduling fields not rendered: %+v", spec)
	}
	c := r.container(t)
	env := envNames(c.Env)
	if i, j := slices.Index(env, "OTEL_RESOURCE_ATTRIBUTES"), slices.Index(env, "GOMEMLIMIT"); i < 0 || j < i {
		t.Errorf("env order %v: extraEnv must follow the chart's variables", env)
	}
	if v := envValue(c.Env, "OTEL_RESOURCE_ATTRIBUTES"); v != "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),deployment.environment=test,service.namespace=agents" {
		t.Errorf("OTEL_RESOURCE_ATTRIBUTES = %q", v)
	}
	if envValue(c.Env, "OTEL_EXPORTER_OTLP_ENDPOINT") != "http://127.0.0.1:4317" || envValue(c.Env, "OTEL_SERVICE_NAME") != "retryd-fleet" {
		t.Errorf("OTEL env = %v", c.Env)
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil {
		t.Errorf("envFrom = %+v", c.EnvFrom)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "certs" && m.MountPath == "/etc/retryd-certs" }) ||
		!slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "certs" && v.Secret != nil }) {
		t.Errorf("extraVolumes/extraVolumeMounts not rendered")
	}
	if r.deployment.Spec.Template.Annotations["example.test/team"] != "agents" || r.deployment.Spec.Template.Labels["example.test/tier"] != "control" {
		t.Errorf("podAnnotations/podLabels not rendered")
	}
}

// selects reports whether a label selector matches labels (matchLabels and
// DoesNotExist expressions, which is all the chart uses).
func selects(sel metav1.LabelSelector, labels map[string]string) bool {
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range sel.MatchExpressions {
		if _, has := labels[e.Key]; e.Operator == metav1.LabelSelectorOpDoesNotExist && has {
			return false
		}
	}
	return true
}

func envNames(env []corev1.EnvVar) []string {
	names := make([]string, len(env))
	for i, e := range env {
		names[i] = e.Name
	}
	return names
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestValuesDocumented checks that every value in values.yaml has a
// comment: each leaf key, or an ancestor whose "# --" comment documents the
// whole object (the helm-docs convention).
func TestValuesDocumented(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(n *yamlv3.Node, path string, documented bool)
	walk = func(n *yamlv3.Node, path string, documented bool) {
		if n.Kind != yamlv3.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			p := strings.TrimPrefix(path+"."+key.Value, ".")
			doc := documented || strings.Contains(key.HeadComment, "# --")
			if value.Kind == yamlv3.MappingNode && len(value.Content) > 0 {
				walk(value, p, doc)
				continue
			}
			if !doc && key.HeadComment == "" && key.LineComment == "" && value.LineComment == "" {
				t.Errorf("values.yaml: %s has no comment", p)
			}
		}
	}
	if len(doc.Content) != 1 {
		t.Fatalf("values.yaml is not one YAML document")
	}
	walk(doc.Content[0], "", false)
}

// TestNotes renders NOTES.txt, which helm template leaves out, for every
// good values file: a copy of the chart gets a template that renders the
// notes with tpl into a YAML string.
func TestNotes(t *testing.T) {
	t.Parallel()
	chart := filepath.Join(t.TempDir(), "retryd")
	if err := os.CopyFS(chart, os.DirFS(chartDir(t))); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chart, "notes-under-test.txt"), notes, 0o644); err != nil {
		t.Fatal(err)
	}
	probe := `notes: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}` + "\n"
	if err := os.WriteFile(filepath.Join(chart, "templates", "notes-under-test.yaml"), []byte(probe), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range goodValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, err := runHelm(t, "template", release, chart, "--namespace", namespace,
				"--kube-version", kubeVersion, "-f", absPath(t, f), "--show-only", "templates/notes-under-test.yaml")
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, stderr)
			}
			var out struct {
				Notes string `json:"notes"`
			}
			if err := decodeStrict([]byte(stdout), &out); err != nil {
				t.Fatalf("%v\n%s", err, stdout)
			}
			wants := []string{
				fmt.Sprintf("kubectl --namespace %s port-forward service/", namespace),
				"helm test " + release,
			}
			if port := expectations[filepath.Base(f)].healthPort; port != 0 {
				wants = append(wants,
					"grpcurl -cacert ca.crt -servername rel-retryd.agents.svc -cert client.crt -key client.key localhost:7700 list",
					fmt.Sprintf(" 7701:%d", port), "grpcurl -plaintext localhost:7701 grpc.health.v1.Health/Check")
			} else {
				wants = append(wants, "grpcurl -plaintext localhost:7700 list")
			}
			if strings.HasPrefix(expectations[filepath.Base(f)].flags["store"], "file:") {
				wants = append(wants, "get pvc data-rel-retryd-0")
			}
			if ref := expectations[filepath.Base(f)].redisURL; ref != nil {
				wants = append(wants, "Store: redis.", "of the Secret "+ref.Name)
			}
			if ref := expectations[filepath.Base(f)].credentials; ref != nil {
				wants = append(wants, `grpcurl -plaintext -H "authorization: Bearer $TOKEN" -d '{"sessionId": "s1"}' localhost:7700 retryd.v1.RetryService/GetChains`, ref.Key+" of the Secret "+ref.Name,
					"tokens cross the network in the clear")
			} else if strings.Contains(out.Notes, "Authentication is on") {
				t.Errorf("NOTES speak of authentication though it is off:\n%s", out.Notes)
			}
			if port := expectations[filepath.Base(f)].metricsPort; port != 0 {
				wants = append(wants, fmt.Sprintf(` 9464:%d`, port), "curl -s localhost:9464/metrics")
			} else {
				wants = append(wants, "Metrics are off")
			}
			for _, want := range wants {
				if !strings.Contains(out.Notes, want) {
					t.Errorf("NOTES lack %q:\n%s", want, out.Notes)
				}
			}
		})
	}
}

// TestExpectationsCoverTestdata keeps the matrix and testdata in step.
func TestExpectationsCoverTestdata(t *testing.T) {
	t.Parallel()
	var files []string
	for _, f := range goodValues(t) {
		files = append(files, filepath.Base(f))
	}
	if want := slices.Sorted(maps.Keys(expectations)); !slices.Equal(files, want) {
		t.Errorf("testdata values files %v, expectations for %v", files, want)
	}
}

func TestLint(t *testing.T) {
	t.Parallel()
	for _, f := range goodValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, err := runHelm(t, "lint", "--strict", "--kube-version", kubeVersion, chartDir(t), "-f", absPath(t, f))
			if err != nil {
				t.Fatalf("helm lint --strict: %v\n%s%s", err, stdout, stderr)
			}
			// Lint mode turns template `fail` calls into log lines, not errors.
			for _, bad := range []string{"[ERROR]", "[WARNING]", "Fail:"} {
				if strings.Contains(stdout+stderr, bad) {
					t.Errorf("helm lint reports %s:\n%s%s", bad, stdout, stderr)
				}
			}
			if !strings.Contains(stdout, "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("helm lint output:\n%s", stdout)
			}
		})
	}
}

func TestTemplate(t *testing.T) {
	t.Parallel()
	checksums := map[string]string{}
	var mu sync.Mutex
	t.Cleanup(func() {
		// Different fleet blocks must give different checksums, so pods
		// roll when fleet protection changes (retryd reads it at start).
		if checksums["defaults.yaml"] != "" && checksums["defaults.yaml"] == checksums["policies.yaml"] {
			t.Errorf("checksum/fleet is the same for different fleet blocks")
		}
	})
	for _, f := range goodValues(t) {
		name := filepath.Base(f)
		want, ok := expectations[name]
		if !ok {
			continue // TestExpectationsCoverTestdata reports it
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := render(t, f)
			checkCommon(t, r, want)
			if want.extra != nil {
				want.extra(t, r)
			}
			mu.Lock()
			checksums[name] = r.workload().pod.Annotations["checksum/fleet"]
			mu.Unlock()
		})
	}
}

// checkCommon asserts what every render must have.
func checkCommon(t *testing.T, r *rendered, want expectation) {
	t.Helper()
	for _, o := range r.objects {
		l := o.GetLabels()
		for k, v := range map[string]string{
			"app.kubernetes.io/name": "retryd", "app.kubernetes.io/instance": release,
			"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "retryd-0.1.0", "app.kubernetes.io/part-of": "retryd",
		} {
			if l[k] != v {
				t.Errorf("%T %s: label %s = %q, want %q", o, o.GetName(), k, l[k], v)
			}
		}
		if l["app.kubernetes.io/version"] == "" {
			t.Errorf("%T %s: no app.kubernetes.io/version label", o, o.GetName())
		}
		if o.GetNamespace() != namespace {
			t.Errorf("%T %s: namespace %q, want %q", o, o.GetName(), o.GetNamespace(), namespace)
		}
	}

	// The file store runs on a StatefulSet; the in-memory and the Redis
	// store keep the Deployment and render no --store flag (the server's
	// default; the Redis URL is in the env).
	w := r.workload()
	wantKind := "Deployment"
	if strings.HasPrefix(want.flags["store"], "file:") {
		wantKind = "StatefulSet"
	}
	if w.kind != wantKind {
		t.Errorf("workload is a %s, want a %s for --store=%q", w.kind, wantKind, want.flags["store"])
	}
	if !ptrEqual(w.replicas, want.replicas) {
		t.Errorf("replicas = %v, want %v", deref(w.replicas), deref(want.replicas))
	}
	selector := w.selector.MatchLabels
	if !maps.Equal(selector, map[string]string{
		"app.kubernetes.io/name": "retryd", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "server",
	}) {
		t.Errorf("%s selector = %v", w.kind, selector)
	}
	if !selects(*w.selector, w.pod.Labels) {
		t.Errorf("%s selector %v does not match its pod labels %v", w.kind, selector, w.pod.Labels)
	}

	// retryd reloads the policy file in place: no checksum of it rolls
	// the pods; only the fleet blocks, read at start, do.
	if got, ok := w.pod.Annotations["checksum/config"]; ok {
		t.Errorf("checksum/config = %q: a policy change would roll the pods", got)
	}
	if got := w.pod.Annotations["checksum/fleet"]; len(got) != 64 {
		t.Errorf("checksum/fleet = %q, want a SHA-256", got)
	}

	spec := w.pod.Spec
	psc := spec.SecurityContext
	if psc == nil || !deref(psc.RunAsNonRoot) || deref(psc.RunAsUser) != 65532 || psc.SeccompProfile == nil ||
		psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want non-root 65532 with RuntimeDefault seccomp", psc)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken = %v, want false", spec.AutomountServiceAccountToken)
	}
	if g := deref(spec.TerminationGracePeriodSeconds); g != want.grace {
		t.Errorf("terminationGracePeriodSeconds = %d, want %d", g, want.grace)
	}

	c := r.container(t)
	checkContainerSecurity(t, "retryd", c.SecurityContext)
	if c.Image != want.image {
		t.Errorf("image = %q, want %q", c.Image, want.image)
	}
	if len(c.Command) != 0 {
		t.Errorf("command = %q, want the image's entrypoint", c.Command)
	}
	flags := serverFlags(t, c.Args)
	if flags["config"] != "/etc/retryd/config.yaml" {
		t.Errorf("--config = %q", flags["config"])
	}
	delete(flags, "config")
	if got, ok := flags["metrics-listen"]; want.metricsPort == 0 && ok {
		t.Errorf("--metrics-listen=%s rendered though server.metricsPort is 0", got)
	} else if wantAddr := fmt.Sprintf("0.0.0.0:%d", want.metricsPort); want.metricsPort != 0 && got != wantAddr {
		t.Errorf("--metrics-listen = %q (given: %v), want %s", got, ok, wantAddr)
	}
	if !maps.Equal(flags, want.flags) {
		t.Errorf("serve flags = %v, want %v", flags, want.flags)
	}
	if shutdown, err := time.ParseDuration(want.flags["shutdown-timeout"]); err != nil || time.Duration(want.grace)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %d is not longer than --shutdown-timeout %s", want.grace, want.flags["shutdown-timeout"])
	}
	stores := 0
	for _, e := range c.Env {
		if e.Name == "RETRYD_STORE" && want.redisURL != nil {
			// The Redis URL holds the password: only from the Secret.
			stores++
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
				e.ValueFrom.SecretKeyRef.Name != want.redisURL.Name || e.ValueFrom.SecretKeyRef.Key != want.redisURL.Key ||
				deref(e.ValueFrom.SecretKeyRef.Optional) {
				t.Errorf("env RETRYD_STORE = %+v, want only from the required key %s of the Secret %s",
					e, want.redisURL.Key, want.redisURL.Name)
			}
		} else if strings.HasPrefix(e.Name, "RETRYD_") {
			t.Errorf("env %s: settings are passed as flags only (but the Redis URL)", e.Name)
		}
		if strings.HasPrefix(e.Name, "OTEL_") && !want.otel {
			t.Errorf("env %s rendered though otel is disabled", e.Name)
		}
	}
	if want.redisURL != nil && stores != 1 {
		t.Errorf("env %v: %d RETRYD_STORE, want one from the Secret %s", envNames(c.Env), stores, want.redisURL.Name)
	}
	for _, a := range c.Args {
		if strings.Contains(a, "redis") {
			t.Errorf("arg %q: the Redis URL must not be in the args", a)
		}
	}
	if want.otel && envValue(c.Env, "OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		t.Errorf("otel enabled but OTEL_EXPORTER_OTLP_ENDPOINT not set: %v", c.Env)
	}
	wantPorts := []corev1.ContainerPort{{Name: "grpc", ContainerPort: want.port, Protocol: corev1.ProtocolTCP}}
	if want.metricsPort != 0 {
		wantPorts = append(wantPorts, corev1.ContainerPort{Name: "metrics", ContainerPort: want.metricsPort, Protocol: corev1.ProtocolTCP})
	}
	if want.healthPort != 0 {
		wantPorts = append(wantPorts, corev1.ContainerPort{Name: "health", ContainerPort: want.healthPort, Protocol: corev1.ProtocolTCP})
	}
	if !slices.Equal(c.Ports, wantPorts) {
		t.Errorf("ports = %+v, want %+v", c.Ports, wantPorts)
	}
	if (c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero()) == want.resources {
		t.Errorf("resources = %+v, want set: %v", c.Resources, want.resources)
	}
	probes := map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
	for kind, p := range probes {
		if (p != nil) != want.probes {
			t.Errorf("%s probe = %+v, want present: %v", kind, p, want.probes)
			continue
		}
		if p == nil {
			continue
		}
		wantService := ""
		if kind == "readiness" {
			wantService = want.readiness
		}
		// With TLS the kubelet's gRPC probe (plaintext only) asks the
		// health port.
		probePort := want.port
		if want.healthPort != 0 {
			probePort = want.healthPort
		}
		if p.GRPC == nil || p.GRPC.Port != probePort || deref(p.GRPC.Service) != wantService || p.HTTPGet != nil || p.Exec != nil || p.TCPSocket != nil {
			t.Errorf("%s probe = %+v, want gRPC on %d service %q", kind, p.ProbeHandler, probePort, wantService)
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "config" && m.MountPath == "/etc/retryd" && m.ReadOnly
	}) || !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "config" && v.ConfigMap != nil && v.ConfigMap.Name == r.configMap.Name
	}) {
		t.Errorf("the ConfigMap %s is not mounted read-only at /etc/retryd", r.configMap.Name)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tmp" }) {
		t.Errorf("no writable /tmp beside the read-only root filesystem")
	}

	if _, tlsOn := flags["tls-cert"]; tlsOn != (want.healthPort != 0) {
		t.Errorf("--tls-cert given: %v, want TLS (and the health port): %v", tlsOn, want.healthPort != 0)
	} else if tlsOn {
		for _, name := range []string{"tls-cert", "tls-key", "tls-client-ca"} {
			if v, ok := flags[name]; ok && !strings.HasPrefix(v, tlsDir+"/") {
				t.Errorf("--%s=%s, want a file of the TLS volume in %s", name, v, tlsDir)
			}
		}
		if got, wantAddr := flags["health-listen"], fmt.Sprintf("0.0.0.0:%d", want.healthPort); got != wantAddr {
			t.Errorf("--health-listen = %q, want %s", got, wantAddr)
		}
	} else if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "tls" }) {
		t.Errorf("a tls volume is rendered though TLS is off")
	}

	if _, authOn := flags["auth-credentials"]; authOn != (want.credentials != nil) {
		t.Errorf("--auth-credentials given: %v, want authentication: %v", authOn, want.credentials != nil)
	} else if authOn {
		if got := flags["auth-credentials"]; got != authDir+"/credentials.yaml" {
			t.Errorf("--auth-credentials=%s, want the file of the auth volume %s/credentials.yaml", got, authDir)
		}
		checkAuthVolume(t, r, want.credentials)
	} else if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "auth" }) {
		t.Errorf("an auth volume is rendered though authentication is off")
	}

	if wantKind == "Deployment" && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "data" }) {
		t.Errorf("the in-memory store's pod mounts a data volume: %+v", c.VolumeMounts)
	}

	svc := r.services[w.name]
	if svc == nil {
		t.Fatalf("no Service named %s", w.name)
	}
	checkServicePorts(t, svc, want.servicePort, want.metricsPort, want.healthPort)
	if !maps.Equal(svc.Spec.Selector, selector) {
		t.Errorf("Service selector = %v, want %v", svc.Spec.Selector, selector)
	}
	if want.optional != (r.pdb != nil && r.hpa != nil && r.serviceMonitor != nil && len(r.services) == 2) {
		t.Errorf("optional objects: PDB %v HPA %v ServiceMonitor %v Services %d; want all: %v",
			r.pdb != nil, r.hpa != nil, r.serviceMonitor != nil, len(r.services), want.optional)
	}

	checkTestPod(t, r, svc, want)
}

// checkServicePorts asserts a Service's ports: grpc (to the container port
// grpc, appProtocol grpc) first, then, unless metricsPort is 0, metrics on
// metricsPort (to the container port metrics, appProtocol http), then,
// unless healthPort is 0, the plaintext health port beside a TLS grpc port.
func checkServicePorts(t *testing.T, svc *corev1.Service, grpcPort, metricsPort, healthPort int32) {
	t.Helper()
	type port struct {
		Name        string
		Port        int32
		Target      string
		Protocol    corev1.Protocol
		AppProtocol string
	}
	var got []port
	for _, p := range svc.Spec.Ports {
		got = append(got, port{p.Name, p.Port, p.TargetPort.String(), p.Protocol, deref(p.AppProtocol)})
	}
	want := []port{{"grpc", grpcPort, "grpc", corev1.ProtocolTCP, "grpc"}}
	if metricsPort != 0 {
		want = append(want, port{"metrics", metricsPort, "metrics", corev1.ProtocolTCP, "http"})
	}
	if healthPort != 0 {
		want = append(want, port{"health", healthPort, "health", corev1.ProtocolTCP, "grpc"})
	}
	if !slices.Equal(got, want) {
		t.Errorf("Service %s ports = %+v, want %+v", svc.Name, got, want)
	}
}

// checkTestPod asserts the helm test hook: the health check of the Service,
// run from the retryd image, not selected by the Services.
func checkTestPod(t *testing.T, r *rendered, svc *corev1.Service, want expectation) {
	t.Helper()
	p := r.testPod
	if p.Annotations["helm.sh/hook"] != "test" {
		t.Errorf("test pod hook = %q, want test", p.Annotations["helm.sh/hook"])
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("test pod restartPolicy = %q", p.Spec.RestartPolicy)
	}
	if selects(metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, p.Labels) {
		t.Errorf("the Service selects the test pod (labels %v)", p.Labels)
	}
	if len(p.Spec.Containers) != 1 {
		t.Fatalf("test pod containers = %d", len(p.Spec.Containers))
	}
	c := p.Spec.Containers[0]
	checkContainerSecurity(t, "test pod", c.SecurityContext)
	if c.Image != want.testPodImage {
		t.Errorf("test pod image = %q, want %q", c.Image, want.testPodImage)
	}
	if !slices.Equal(c.Command, []string{"/usr/local/bin/retryd-healthcheck"}) {
		t.Errorf("test pod command = %q", c.Command)
	}
	// retryd-healthcheck speaks plaintext: with TLS it asks the health port.
	testPort := want.servicePort
	if want.healthPort != 0 {
		testPort = want.healthPort
	}
	wantAddr := fmt.Sprintf("-addr=%s.%s.svc:%d", svc.Name, namespace, testPort)
	if !slices.Contains(c.Args, wantAddr) || !slices.Contains(c.Args, "-service=") {
		t.Errorf("test pod args = %q, want %s and -service=", c.Args, wantAddr)
	}
}

func checkContainerSecurity(t *testing.T, what string, sc *corev1.SecurityContext) {
	t.Helper()
	if sc == nil {
		t.Errorf("%s: no securityContext", what)
		return
	}
	if !deref(sc.RunAsNonRoot) || deref(sc.RunAsUser) != 65532 || !deref(sc.ReadOnlyRootFilesystem) ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || deref(sc.Privileged) ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: securityContext = %+v, want non-root 65532, read-only root, no escalation, drop ALL, RuntimeDefault", what, sc)
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func ptrEqual[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// TestRejectsBadValues renders every testdata/bad file; each must fail with
// an error naming the offending key, given on the file's `# want:` line.
func TestRejectsBadValues(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad values files: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := strings.Cut(string(data), "\n")
			want, ok := strings.CutPrefix(first, "# want: ")
			if !ok || want == "" {
				t.Fatalf("%s: first line must be `# want: <text of the error>`", f)
			}
			_, stderr, err := runHelm(t, "template", release, chartDir(t),
				"--namespace", namespace, "--kube-version", kubeVersion, "-f", absPath(t, f))
			if err == nil {
				t.Fatalf("helm template accepted %s", f)
			}
			if !strings.Contains(stderr, want) {
				t.Errorf("helm's error does not mention %q:\n%s", want, stderr)
			}
		})
	}
}

var binaries once[map[string]string]

// buildBinaries builds retryd and retryd-healthcheck once per test binary.
func buildBinaries(t *testing.T) map[string]string {
	t.Helper()
	root := repoRoot(t)
	bins, err := binaries.get(func() (map[string]string, error) {
		bins := map[string]string{
			"retryd":             filepath.Join(workDir, "retryd"),
			"retryd-healthcheck": filepath.Join(workDir, "retryd-healthcheck"),
		}
		cmd := exec.Command("go", "build", "-o", workDir+string(filepath.Separator), "./cmd/retryd", "./deploy/healthcheck")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/retryd ./deploy/healthcheck: %w\n%s", err, out)
		}
		if err := os.Rename(filepath.Join(workDir, "healthcheck"), bins["retryd-healthcheck"]); err != nil {
			return nil, err
		}
		return bins, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// writePolicyFile writes the rendered config.yaml into a temporary directory.
func writePolicyFile(t *testing.T, r *rendered) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(r.policyFile(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheckConfig runs `retryd check-config` on every rendered policy file.
func TestCheckConfig(t *testing.T) {
	t.Parallel()
	bins := buildBinaries(t)
	for _, f := range goodValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			path := writePolicyFile(t, render(t, f))
			out, err := exec.Command(bins["retryd"], "check-config", "--config", path).CombinedOutput()
			if err != nil {
				t.Errorf("retryd check-config on the rendered config.yaml: %v\n%s", err, out)
			}
		})
	}

	// The schema checks shapes, not the rules between fields: such a file
	// renders, and check-config is what catches it.
	t.Run("rules beyond the schema", func(t *testing.T) {
		t.Parallel()
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte("policies:\n  odd:\n    mode: always\n    maxRetries: 3\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		path := writePolicyFile(t, render(t, values))
		out, err := exec.Command(bins["retryd"], "check-config", "--config", path).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !strings.Contains(string(out), "policies.odd") {
			t.Errorf("check-config = %v, want a non-zero exit naming policies.odd:\n%s", err, out)
		}
	})

	// The same for fleet blocks: each value is within the schema's range,
	// but a budget that never refills is refused, at the top level and in
	// a provider's block, by name. (policies.yaml, above, is a fleet block
	// check-config accepts.)
	t.Run("fleet rules beyond the schema", func(t *testing.T) {
		t.Parallel()
		values := filepath.Join(t.TempDir(), "values.yaml")
		body := "fleet:\n  refillPerSecond: 0\n  successCredit: 0\nproviders:\n  openai:\n    fleet:\n      capacity: 10\n      refillPerSecond: 0\n      successCredit: 0\n"
		if err := os.WriteFile(values, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		path := writePolicyFile(t, render(t, values))
		out, err := exec.Command(bins["retryd"], "check-config", "--config", path).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !strings.Contains(string(out), "fleet.refillPerSecond") ||
			!strings.Contains(string(out), "providers.openai.fleet.refillPerSecond") {
			t.Errorf("check-config = %v, want a non-zero exit naming fleet.refillPerSecond and providers.openai.fleet.refillPerSecond:\n%s", err, out)
		}
	})
}

// TestServeRenderedArgs starts the real retryd with the rendered container's
// args and env, changing only the listen, metrics and health addresses (to
// free loopback ports), the config path (to the rendered ConfigMap), a file
// store's directory (to a temporary one) and the TLS files (to a CA and
// certificates made for the test), and checks that gRPC health answers
// SERVING, that reflection lists the RetryService, that the helm test pod's
// command passes, that /metrics serves retryd's metrics when the chart
// enables it, and that SIGTERM stops it cleanly. With TLS, health is first
// asked on the plaintext health port (as the kubelet's probes do), then on
// the TLS port by a client trusting the CA; a plaintext client (and, with
// mTLS, one without a certificate) must fail there. With a file store it
// then starts retryd again on the same directory and checks that the retry
// decided by the first process is still there. With the Redis store it
// starts a redis-server of its own (skipping when none is installed), gives
// RETRYD_STORE its URL in place of the Secret's, starts a second replica on
// it and checks that a retry scheduled through one is seen through the other.
func TestServeRenderedArgs(t *testing.T) {
	t.Parallel()
	bins := buildBinaries(t)
	for _, f := range goodValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			r := render(t, f)
			c := r.container(t)
			flags := serverFlags(t, c.Args)
			config := writePolicyFile(t, r)
			storeDir := "" // stays empty unless the chart renders --store=file:
			if flag, ok := flags["store"]; ok {
				if !strings.HasPrefix(flag, "file:") {
					t.Fatalf("--store=%s, want file:DIR (the in-memory store renders no flag)", flag)
				}
				storeDir = t.TempDir()
			}
			var pki *testPKI // nil: the gRPC port is plaintext
			if _, ok := flags["tls-cert"]; ok {
				pki = newTestPKI(t, flags)
			}
			files := filesOf(pki) // flag → the local file in place of a Secret's
			var withToken []grpc.DialOption
			if _, ok := flags["auth-credentials"]; ok {
				files["auth-credentials"] = writeCredentials(t)
				withToken = append(withToken, grpc.WithPerRPCCredentials(bearer(testToken)))
			}
			shutdown, err := time.ParseDuration(flags["shutdown-timeout"])
			if err != nil {
				t.Fatal(err)
			}
			want := expectations[filepath.Base(f)]
			var secrets map[string]string // "secret/key" → value, for podEnv
			redisURL := ""                // the test's Redis, with store.kind redis
			if ref := want.redisURL; ref != nil {
				redisURL = redistest.Start(t).URL(0)
				secrets = map[string]string{ref.Name + "/" + ref.Key: redisURL}
			}
			env := append(filterEnv(os.Environ(), "RETRYD_", "OTEL_"), podEnv(t, c.Env, secrets)...)
			if redisURL != "" && !slices.Contains(env, "RETRYD_STORE="+redisURL) {
				t.Fatalf("env %q lacks RETRYD_STORE from the Secret", podEnv(t, c.Env, secrets))
			}

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			run := localArgs(t, c.Args, config, storeDir, files)
			if (want.metricsPort != 0) != (run.metricsAddr != "") {
				t.Fatalf("args %q: --metrics-listen given %v, want %v (server.metricsPort %d)",
					c.Args, run.metricsAddr != "", want.metricsPort != 0, want.metricsPort)
			}
			if (pki != nil) != (run.healthAddr != "") {
				t.Fatalf("args %q: --tls-cert given %v but --health-listen given %v: TLS needs the plaintext health port",
					c.Args, pki != nil, run.healthAddr != "")
			}
			p := startRetryd(ctx, t, bins["retryd"], &run, env)

			// The port the probes and the helm test pod ask: the health port
			// with TLS, the gRPC port without.
			probeAddr := run.addr
			if run.healthAddr != "" {
				probeAddr = run.healthAddr
			}
			probeHealth := healthpb.NewHealthClient(dial(t, probeAddr, nil))
			if err := waitServing(ctx, probeHealth, p.exited); err != nil {
				t.Fatalf("%v\nretryd output:\n%s", err, p.logs.String())
			}
			resp, err := probeHealth.Check(ctx, &healthpb.HealthCheckRequest{Service: retryService})
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health of %s on %s = %v, %v; want SERVING", retryService, probeAddr, resp.GetStatus(), err)
			}

			conn := dial(t, run.addr, pki, withToken...)
			health := healthpb.NewHealthClient(conn)
			resp, err = health.Check(ctx, &healthpb.HealthCheckRequest{Service: retryService})
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health of %s on the gRPC port (TLS: %v) = %v, %v; want SERVING\nretryd output:\n%s",
					retryService, pki != nil, resp.GetStatus(), err, p.logs.String())
			}
			if services, err := listServices(ctx, conn); err != nil || !slices.Contains(services, retryService) {
				t.Errorf("reflection lists %v (%v), want %s among them", services, err, retryService)
			}
			if want.served != nil {
				want.served(ctx, t, conn)
			}
			if pki != nil {
				refused := map[string]*testPKI{"plaintext": nil}
				if len(pki.client.Certificates) > 0 {
					noCert := *pki
					noCert.client = pki.client.Clone()
					noCert.client.Certificates = nil
					refused["TLS without a client certificate"] = &noCert
				}
				for what, creds := range refused {
					cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := healthpb.NewHealthClient(dial(t, run.addr, creds)).Check(cctx, &healthpb.HealthCheckRequest{})
					ccancel()
					if err == nil {
						t.Errorf("a %s client reached the TLS gRPC port", what)
					}
				}
			}

			if run.metricsAddr != "" {
				// The store gauges: the pod's own store's population, or
				// with Redis the shared store's, which every replica reports.
				metric := "retryd_sessions"
				body, err := getMetrics(ctx, run.metricsAddr)
				if err != nil {
					t.Errorf("GET /metrics: %v\nretryd output:\n%s", err, p.logs.String())
				} else if !strings.Contains(body, metric) {
					t.Errorf("/metrics lacks %s:\n%s", metric, body)
				}
				// server.pprof adds the runtime's profiles to the metrics
				// listener, and only then.
				if code, err := httpStatus(ctx, "http://"+run.metricsAddr+"/debug/pprof/cmdline"); err != nil {
					t.Errorf("GET /debug/pprof/cmdline: %v", err)
				} else if want := map[bool]int{true: http.StatusOK, false: http.StatusNotFound}[flags["pprof"] == "true"]; code != want {
					t.Errorf("GET /debug/pprof/cmdline with --pprof=%q: status %d, want %d", flags["pprof"], code, want)
				}
			}

			// The helm test pod's command (plaintext), pointed at this
			// server's port of the one it asks (checkTestPod checks which).
			testArgs := slices.Clone(r.testPod.Spec.Containers[0].Args)
			for i, a := range testArgs {
				if strings.HasPrefix(a, "-addr=") {
					testArgs[i] = "-addr=" + probeAddr
				}
			}
			if out, err := exec.CommandContext(ctx, bins["retryd-healthcheck"], testArgs...).CombinedOutput(); err != nil {
				t.Errorf("helm test command %q: %v\n%s", testArgs, err, out)
			}

			if redisURL != "" {
				// A second replica on the same Redis: what one decides, the
				// other serves.
				run2 := localArgs(t, c.Args, config, "", files)
				p2 := startRetryd(ctx, t, bins["retryd"], &run2, env)
				conn2 := dial(t, run2.addr, pki, withToken...)
				if err := waitServing(ctx, healthpb.NewHealthClient(conn2), p2.exited); err != nil {
					t.Fatalf("second replica: %v\nretryd output:\n%s", err, p2.logs.String())
				}
				retryID := scheduleRetry(ctx, t, conn)
				chains, err := retrydv1.NewRetryServiceClient(conn2).GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: durabilitySession})
				if err != nil {
					t.Errorf("GetChains on the second replica: %v", err)
				} else if len(chains.GetChains()) != 1 || chains.GetChains()[0].GetLatest().GetRetryId() != retryID {
					t.Errorf("the second replica sees the chains %v, want one whose latest retry is %s (scheduled through the first)",
						chains.GetChains(), retryID)
				}
				p2.stop(t, shutdown)
			}

			var retryID string // a pending retry the restarted server must still know
			if storeDir != "" {
				retryID = scheduleRetry(ctx, t, conn)
			}
			p.stop(t, shutdown)
			if storeDir == "" {
				return
			}

			// The pod restarted on its volume: the same directory, new ports.
			if fi, err := os.Stat(filepath.Join(storeDir, "retryd.db")); err != nil || fi.Size() == 0 {
				t.Fatalf("the file store left no database in %s: %v", storeDir, err)
			}
			run = localArgs(t, c.Args, config, storeDir, files)
			p = startRetryd(ctx, t, bins["retryd"], &run, env)
			conn2 := dial(t, run.addr, pki, withToken...)
			if err := waitServing(ctx, healthpb.NewHealthClient(conn2), p.exited); err != nil {
				t.Fatalf("restart on %s: %v\nretryd output:\n%s", storeDir, err, p.logs.String())
			}
			chains, err := retrydv1.NewRetryServiceClient(conn2).GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: durabilitySession})
			if err != nil {
				t.Errorf("GetChains after the restart: %v", err)
			} else if len(chains.GetChains()) != 1 || chains.GetChains()[0].GetLatest().GetRetryId() != retryID {
				t.Errorf("after the restart the session's chains are %v, want one whose latest retry is %s", chains.GetChains(), retryID)
			}
			p.stop(t, shutdown)
		})
	}
}

// filesOf is a fresh map of the TLS files of pki for localArgs; empty
// without TLS.
func filesOf(pki *testPKI) map[string]string {
	if pki == nil {
		return map[string]string{}
	}
	return maps.Clone(pki.files)
}

// durabilitySession is the session whose retry must survive a restart of a
// file store.
const durabilitySession = "chart-durability"

// scheduleRetry reports a failed step that schedules a retry due long after
// the test, and returns the retry's id.
func scheduleRetry(ctx context.Context, t *testing.T, conn *grpc.ClientConn) string {
	t.Helper()
	resp, err := retrydv1.NewRetryServiceClient(conn).FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: durabilitySession, Turn: 1, Step: 1, Provider: "p",
		Failure: &retrydv1.Failure{Code: "RATE_LIMIT", HttpStatus: 429},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
			MaxRetries: proto.Uint32(3),
			Backoff:    &retrydv1.Backoff{InitialDelayMs: proto.Uint64(600_000), MaxDelayMs: proto.Uint64(600_000)},
		}},
	})
	if err != nil {
		t.Fatalf("FailedStep: %v", err)
	}
	id := resp.GetDecision().GetSchedule().GetRetryId()
	if id == "" {
		t.Fatalf("FailedStep = %v, want a scheduled retry", resp.GetDecision())
	}
	return id
}

// sameMap reports whether got is a JSON object equal to want.
func sameMap(got any, want map[string]any) bool {
	m, ok := got.(map[string]any)
	return ok && maps.Equal(m, want)
}

// testToken is the bearer token of the tenant chart-test in the credentials
// file the test writes in place of auth.existingSecret.
const testToken = "3f1d2c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3"

// writeCredentials writes a credentials file with one tenant, chart-test,
// whose token is testToken.
func writeCredentials(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "credentials.yaml")
	body := fmt.Sprintf("tenants:\n  - id: chart-test\n    tokens:\n      - sha256: %q\n", auth.HashToken(testToken))
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// bearer sends a token with every call, over the tests' plaintext loopback
// connections too.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// checkAuthServed checks auth.yaml's server: the RetryService refuses a
// call without the token, serves one with it, and the rendered
// --max-pending-retries-per-tenant=1 refuses the tenant's second pending
// retry with LIMIT_REACHED, recording nothing.
func checkAuthServed(ctx context.Context, t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	req := func(session string) *retrydv1.FailedStepRequest {
		return &retrydv1.FailedStepRequest{
			SessionId: session, Turn: 1, Step: 1, Provider: "p",
			Failure: &retrydv1.Failure{Code: "RATE_LIMIT"},
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: &retrydv1.RetryPolicy{
				MaxRetries: proto.Uint32(3),
				Backoff:    &retrydv1.Backoff{InitialDelayMs: proto.Uint64(600_000), MaxDelayMs: proto.Uint64(600_000)},
			}},
		}
	}
	anonymous := retrydv1.NewRetryServiceClient(dial(t, conn.Target(), nil))
	if _, err := anonymous.FailedStep(ctx, req("anonymous")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("FailedStep without a token = %v, want UNAUTHENTICATED", err)
	}
	rpc := retrydv1.NewRetryServiceClient(conn)
	first, err := rpc.FailedStep(ctx, req("limit-1"))
	if err != nil || first.GetDecision().GetSchedule() == nil {
		t.Fatalf("FailedStep with the token = %v, %v; want a scheduled retry", first.GetDecision(), err)
	}
	_, err = rpc.FailedStep(ctx, req("limit-2"))
	var info *errdetails.ErrorInfo
	for _, d := range status.Convert(err).Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if status.Code(err) != codes.ResourceExhausted || info.GetReason() != "LIMIT_REACHED" ||
		info.GetMetadata()["bound"] != "pending_retries_per_tenant" || info.GetMetadata()["limit"] != "1" {
		t.Errorf("a second pending retry = %v (%v), want RESOURCE_EXHAUSTED LIMIT_REACHED of pending_retries_per_tenant, limit 1", err, info)
	}
	if _, err := rpc.GetChains(ctx, &retrydv1.GetChainsRequest{SessionId: "limit-2"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetChains of the refused session = %v, want NOT_FOUND (nothing recorded)", err)
	}
}

// checkFleetServed checks policies.yaml's server: the fleet blocks of the
// rendered policy file are in force — a provider's own block over the
// top-level one, and the top-level one for any other provider.
func checkFleetServed(ctx context.Context, t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	rpc := retrydv1.NewRetryServiceClient(conn)
	for provider, capacity := range map[string]float64{"openai": 20, "mistral": 5, "deepseek": 50, "anyone-else": 50} {
		st, err := rpc.GetProviderState(ctx, &retrydv1.GetProviderStateRequest{Provider: provider})
		if err != nil || !st.GetProtected() || st.GetBudgetCapacity() != capacity ||
			st.GetCircuit() != retrydv1.CircuitState_CIRCUIT_STATE_CLOSED {
			t.Errorf("GetProviderState(%s) = %v, %v; want protected, capacity %v, circuit closed", provider, st, err, capacity)
		}
	}
}

// localRun is a rendered command line rewritten for this machine.
type localRun struct {
	args        []string
	addr        string // --listen
	metricsAddr string // --metrics-listen; empty without it
	healthAddr  string // --health-listen; empty without it
}

// anyLoopbackPort is the listen address localArgs gives: the kernel picks
// the port when retryd binds, and startRetryd reads it from the "serving"
// line. A port picked free beforehand can be taken by a parallel test
// before retryd binds it.
const anyLoopbackPort = "127.0.0.1:0"

// localArgs rewrites the rendered serve args for a run on this machine:
// --listen, --metrics-listen and --health-listen (if given) to
// anyLoopbackPort, --config to the rendered policy file, --store=file: to storeDir,
// and each flag naming a file of a Secret's volume (--tls-cert, --tls-key,
// --tls-client-ca, --auth-credentials) to its file in files, keyed by flag
// name; such a flag without a file there fails the test.
func localArgs(t *testing.T, rendered []string, config, storeDir string, files map[string]string) localRun {
	t.Helper()
	run := localRun{args: slices.Clone(rendered), addr: anyLoopbackPort}
	rewritten, stores := 0, 0
	for i, a := range run.args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch {
		case strings.HasPrefix(a, "--listen="):
			run.args[i] = "--listen=" + run.addr
			rewritten++
		case strings.HasPrefix(a, "--config="):
			run.args[i] = "--config=" + config
			rewritten++
		case strings.HasPrefix(a, "--metrics-listen="):
			run.metricsAddr = anyLoopbackPort
			run.args[i] = "--metrics-listen=" + run.metricsAddr
		case strings.HasPrefix(a, "--health-listen="):
			run.healthAddr = anyLoopbackPort
			run.args[i] = "--health-listen=" + run.healthAddr
		case strings.HasPrefix(a, "--store=file:"):
			run.args[i] = "--store=file:" + storeDir
			stores++
		case name == "tls-cert" || name == "tls-key" || name == "tls-client-ca" || name == "auth-credentials":
			path, ok := files[name]
			if !ok {
				t.Fatalf("args %q: no local file for --%s", rendered, name)
			}
			run.args[i] = "--" + name + "=" + path
		}
	}
	if rewritten != 2 {
		t.Fatalf("args %q lack --listen= or --config=", rendered)
	}
	if want := min(len(storeDir), 1); stores != want {
		t.Fatalf("args %q: %d --store=file: flags, want %d", rendered, stores, want)
	}
	return run
}

// testPKI is the certificates a TLS run uses in place of the chart's
// Secrets: a CA, a server certificate it signed for 127.0.0.1 (tls.crt and
// tls.key) and, for mTLS, a client certificate it signed, the same CA
// standing in for the client CA Secret (ca.crt).
type testPKI struct {
	files  map[string]string // flag name → file, for localArgs
	client *tls.Config       // trusts the CA; with a client certificate for mTLS
}

// newTestPKI writes the files of the TLS flags present in flags into a
// temporary directory.
func newTestPKI(t *testing.T, flags map[string]string) *testPKI {
	t.Helper()
	ca := retrydtest.NewCA(t, "retryd chart test CA")
	server := ca.Server(t, "retryd", 2)
	dir := t.TempDir()
	pki := &testPKI{files: map[string]string{}, client: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}
	for name, data := range map[string][]byte{"tls-cert": server.CertPEM, "tls-key": server.KeyPEM, "tls-client-ca": ca.PEM} {
		if _, ok := flags[name]; !ok {
			continue
		}
		path := filepath.Join(dir, filepath.Base(flags[name]))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		pki.files[name] = path
	}
	if _, ok := flags["tls-client-ca"]; ok {
		pki.client.Certificates = []tls.Certificate{ca.Client(t, "chart-test-client", 3).TLSCertificate(t)}
	}
	return pki
}

// dial connects to addr, over TLS trusting the test CA when pki is set,
// with opts after the transport credentials.
func dial(t *testing.T, addr string, pki *testPKI, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if pki != nil {
		creds = credentials.NewTLS(pki.client)
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// process is a retryd started by startRetryd.
type process struct {
	cmd     *exec.Cmd
	logs    *lockedBuffer
	exited  chan struct{}
	exitErr error // set before exited is closed
}

// startRetryd starts retryd with run's args and env, waits for its
// "serving" line and sets run's addresses to the ports it bound; a cleanup
// kills it if the test did not stop it.
func startRetryd(ctx context.Context, t *testing.T, bin string, run *localRun, env []string) *process {
	t.Helper()
	p := &process{cmd: exec.CommandContext(ctx, bin, run.args...), logs: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if addrs, ok := servingAddrs(p.logs.String()); ok {
			for key, addr := range map[string]*string{"addr": &run.addr, "metrics_addr": &run.metricsAddr, "health_addr": &run.healthAddr} {
				if *addr == "" {
					continue // not asked for
				}
				if *addr = addrs[key]; *addr == "" {
					t.Fatalf("retryd's serving line lacks %s\nretryd output:\n%s", key, p.logs.String())
				}
			}
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("retryd exited before serving: %v\nretryd output:\n%s", p.exitErr, p.logs.String())
		case <-ctx.Done():
			t.Fatalf("retryd did not serve: %v\nretryd output:\n%s", ctx.Err(), p.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("retryd did not log \"serving\" within 30s\nretryd output:\n%s", p.logs.String())
		}
	}
}

// servingAddrs finds retryd's "serving" line in logs, in the text or the
// JSON log format, and returns its address attributes by key (addr,
// metrics_addr, health_addr; those the server has).
func servingAddrs(logs string) (map[string]string, bool) {
	for line := range strings.Lines(logs) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil {
			if rec["msg"] != "serving" {
				continue
			}
			addrs := map[string]string{}
			for _, k := range []string{"addr", "metrics_addr", "health_addr"} {
				if v, ok := rec[k].(string); ok {
					addrs[k] = v
				}
			}
			return addrs, true
		}
		fields := strings.Fields(line) // slog's text format; addresses hold no spaces
		if !slices.Contains(fields, "msg=serving") {
			continue
		}
		addrs := map[string]string{}
		for _, f := range fields {
			k, v, _ := strings.Cut(f, "=")
			if k == "addr" || k == "metrics_addr" || k == "health_addr" {
				addrs[k] = v
			}
		}
		return addrs, true
	}
	return nil, false
}

// stop sends SIGTERM and expects a clean exit within the shutdown timeout
// and 5 seconds.
func (p *process) stop(t *testing.T, shutdown time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		if p.exitErr != nil {
			t.Errorf("retryd exited with %v after SIGTERM\n%s", p.exitErr, p.logs.String())
		}
	case <-time.After(shutdown + 5*time.Second):
		t.Errorf("retryd still running %v after SIGTERM (shutdown timeout %v)\n%s", shutdown+5*time.Second, shutdown, p.logs.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for the process's output copier and
// the test to use at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// httpStatus GETs url and returns the response's status code.
func httpStatus(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// getMetrics fetches http://addr/metrics and returns the body of a 200
// answer in the Prometheus text format.
func getMetrics(ctx context.Context, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		return "", fmt.Errorf("status %s, Content-Type %q:\n%s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	return string(body), nil
}

// podEnv resolves the container's env as the kubelet would, for a pod named
// retryd-0 in the test namespace: literal values with $(VAR) references to
// earlier variables expanded, downward-API fields, and Secret keys found in
// secrets ("name/key" → value). Variables from other sources (resource
// limits, other Secrets) are left out.
func podEnv(t *testing.T, env []corev1.EnvVar, secrets map[string]string) []string {
	t.Helper()
	fields := map[string]string{"metadata.name": "retryd-0", "metadata.namespace": namespace}
	resolved := map[string]string{}
	var out []string
	for _, e := range env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = os.Expand(strings.NewReplacer("$(", "${", ")", "}").Replace(e.Value), func(name string) string { return resolved[name] })
		case e.ValueFrom.FieldRef != nil:
			var ok bool
			if v, ok = fields[e.ValueFrom.FieldRef.FieldPath]; !ok {
				t.Fatalf("env %s: field %s not simulated", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.SecretKeyRef != nil && secrets[e.ValueFrom.SecretKeyRef.Name+"/"+e.ValueFrom.SecretKeyRef.Key] != "":
			v = secrets[e.ValueFrom.SecretKeyRef.Name+"/"+e.ValueFrom.SecretKeyRef.Key]
		default:
			t.Logf("env %s: source %+v not simulated; left out", e.Name, e.ValueFrom)
			continue
		}
		if strings.HasPrefix(e.Name, "OTEL_EXPORTER_OTLP") && strings.Contains(v, "://") && !isLoopbackURL(v) {
			t.Fatalf("env %s=%s: the test sends traffic to loopback only", e.Name, v)
		}
		resolved[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	return out
}

func isLoopbackURL(u string) bool {
	_, rest, _ := strings.Cut(u, "://")
	host, _, _ := strings.Cut(rest, "/")
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// pinPorts replaces each anyLoopbackPort of run with a loopback port free a
// moment ago, for a run whose log the test cannot read (in a container).
func (run *localRun) pinPorts(t *testing.T) {
	t.Helper()
	flags := map[string]*string{"--listen": &run.addr, "--metrics-listen": &run.metricsAddr, "--health-listen": &run.healthAddr}
	for i, a := range run.args {
		flag, value, _ := strings.Cut(a, "=")
		if addr, ok := flags[flag]; ok && value == anyLoopbackPort {
			*addr = freeLoopbackAddr(t)
			run.args[i] = flag + "=" + *addr
		}
	}
}

// freeLoopbackAddr returns a loopback address whose port was free a moment
// ago.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return "127.0.0.1:" + strconv.Itoa(lis.Addr().(*net.TCPAddr).Port)
}

// waitServing polls the overall health until SERVING, the process exits or
// 30 seconds pass.
func waitServing(ctx context.Context, health healthpb.HealthClient, exited <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("retryd exited before serving")
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := health.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("status %v", resp.GetStatus())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("health never answered SERVING within 30s: %v", last)
}

// listServices asks server reflection (what grpcurl list uses) for the
// service names.
func listServices(ctx context.Context, conn *grpc.ClientConn) ([]string, error) {
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if err := stream.CloseSend(); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names, nil
}

// TestPolicyChangeKeepsPods: a values change of the policies alone leaves
// the pod template as it was (retryd reloads the file in place, and
// Kubernetes updates the mounted ConfigMap); a change of a fleet block,
// which retryd reads only at start, changes it, so the pods roll.
func TestPolicyChangeKeepsPods(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := "providers:\n  openai:\n    retryPolicy: {maxRetries: 2}\n    fleet: {capacity: 20}\n"
	policyChanged := "policies:\n  relay: {mode: schedule, schedule: [1000]}\n" +
		"providers:\n  openai:\n    retryPolicy: {maxRetries: 5}\n    fleet: {capacity: 20}\n"
	fleetChanged := "providers:\n  openai:\n    retryPolicy: {maxRetries: 2}\n    fleet: {capacity: 30}\n"
	template := func(name, values string) (podTemplate string, policyFile string) {
		r := render(t, write(name+".yaml", values))
		b, err := json.Marshal(r.workload().pod)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), r.policyFile(t)
	}
	pod, file := template("base", base)
	pod2, file2 := template("policy-changed", policyChanged)
	pod3, _ := template("fleet-changed", fleetChanged)
	if file == file2 {
		t.Fatal("the policy change did not change the policy file")
	}
	if pod != pod2 {
		t.Errorf("a policy change alters the pod template (the pods would roll):\n%s\n%s", pod, pod2)
	}
	if pod == pod3 {
		t.Errorf("a fleet change leaves the pod template as it was (the pods would not roll)")
	}
}
