package helm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/deploy/helm/internal/kubetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// TestAPIServerInstallUpgradeUninstall applies the chart to a real
// Kubernetes API server (internal/kubetest: etcd and kube-apiserver) with
// the pinned helm: for every values file of the test matrix, `helm
// install`, then `helm upgrade` with a changed pod annotation, then `helm
// uninstall`, each in a namespace of its own that enforces the
// "restricted" Pod Security Standard. It fails when
//   - the API server rejects an object or answers with a warning (a
//     deprecated API, a field it dropped, a pod template that would
//     violate the namespace's policy), which helm prints;
//   - an object the server stored differs from what helm applied, beyond
//     the fields the server adds (see matchesApplied);
//   - an object the release made is still there after uninstall.
//
// No controller-manager, scheduler or node runs here: the objects are
// stored, and no pod is created.
func TestAPIServerInstallUpgradeUninstall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane; not with -short")
	}
	cluster := kubetest.Start(t, kubetest.Options{APIServerOnly: true})
	client := cluster.Client(t)
	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	installServiceMonitorCRD(t, dyn)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))
	api := &liveAPI{client: client, dyn: dyn, mapper: mapper}

	// The NetworkPolicy files of testdata/network too (the GRPCRoute's
	// needs the Gateway API's CRDs, which this server lacks).
	files := append(goodValues(t), filepath.Join("testdata", "network", "memory-tls.yaml"),
		filepath.Join("testdata", "network", "redis-otlp.yaml"))
	for _, rel := range files {
		name := strings.TrimSuffix(filepath.Base(rel), ".yaml")
		values, err := filepath.Abs(rel) // helm runs in the repository root
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := "chart-" + name
			api.createNamespace(t, ns)
			k := helmOn{kubeconfig: cluster.Kubeconfig, namespace: ns}

			k.run(t, "install", release, chartDir(t), "-f", values)
			api.checkRelease(t, k, "install")

			k.run(t, "upgrade", release, chartDir(t), "-f", values,
				"--set-string", "podAnnotations.retryd-test/revision=2")
			upgraded := api.checkRelease(t, k, "upgrade")
			if got := podTemplateAnnotation(t, api, upgraded, "retryd-test/revision"); got != "2" {
				t.Errorf("after upgrade, the workload's pod template has annotation retryd-test/revision=%q, want 2", got)
			}

			k.run(t, "uninstall", release, "--wait", "--timeout", "2m")
			api.checkGone(t, upgraded)
		})
	}
}

// helmOn runs the pinned helm against one namespace of the test cluster.
type helmOn struct{ kubeconfig, namespace string }

// run runs helm with args and fails the test when it fails or prints a
// warning from the API server.
func (h helmOn) run(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := h.exec(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	// client-go prints every Warning header of a response on stderr,
	// through klog ("W1202 ... warnings.go:...] <text>") or as "Warning:".
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "warnings.go") || strings.Contains(strings.ToLower(line), "warning") {
			t.Errorf("helm %s: the API server warned: %s", args[0], line)
		}
	}
	return stdout
}

func (h helmOn) exec(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, helm(t), append(args, "--namespace", h.namespace)...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(filterEnv(os.Environ(), "HELM_", "KUBECONFIG="),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+h.kubeconfig,
	)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// liveAPI reads objects back from the API server.
type liveAPI struct {
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

// createNamespace creates ns with the "restricted" Pod Security Standard
// enforced, so that a pod of the chart that breaks it is refused when its
// controller creates it.
func (a *liveAPI) createNamespace(t *testing.T, ns string) {
	t.Helper()
	_, err := a.client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"pod-security.kubernetes.io/warn":    "restricted",
			"pod-security.kubernetes.io/audit":   "restricted",
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}

// applied is one object of a release's manifest with the object the server
// holds for it.
type applied struct {
	want *unstructured.Unstructured
	gvr  schema.GroupVersionResource
	live *unstructured.Unstructured
}

func (o applied) String() string {
	return o.want.GetKind() + " " + o.want.GetNamespace() + "/" + o.want.GetName()
}

// checkRelease reads the release's manifest (`helm get manifest`: what helm
// applied, hooks excluded), reads every object of it back from the server,
// and checks that the server kept what was applied.
func (a *liveAPI) checkRelease(t *testing.T, h helmOn, step string) []applied {
	t.Helper()
	manifest := h.run(t, "get", "manifest", release)
	var objs []applied
	for _, doc := range strings.Split(manifest, "\n---") {
		var m map[string]any
		// The split takes the newline before "---": a block scalar that
		// ends the document keeps it.
		if err := yaml.Unmarshal([]byte(doc+"\n"), &m); err != nil {
			t.Fatalf("%s: manifest document: %v\n%s", step, err, doc)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetNamespace() == "" {
			u.SetNamespace(h.namespace)
		}
		gvk := u.GroupVersionKind()
		mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %s: %v", step, gvk, err)
		}
		live, err := a.dyn.Resource(mapping.Resource).Namespace(u.GetNamespace()).Get(t.Context(), u.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: read back %s %s: %v", step, gvk.Kind, u.GetName(), err)
		}
		o := applied{want: u, gvr: mapping.Resource, live: live}
		for _, diff := range matchesApplied(u.Object, live.Object, "") {
			t.Errorf("%s: %s: the server altered what helm applied: %s", step, o, diff)
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: the release's manifest has no objects:\n%s", step, manifest)
	}
	return objs
}

// matchesApplied compares what helm applied (want) with what the server
// returns (got) and describes each difference.
//
// The server adds fields: metadata (uid, resourceVersion, managedFields,
// creationTimestamp, generation), status, and defaults (a Service's
// clusterIP and each port's protocol, a Deployment's strategy details, a
// container's terminationMessagePath, ...). Those are not differences: only
// the fields helm applied are compared, so everything the server adds is
// ignored and everything it removed or changed is reported. Two changes are
// the API's own spelling rather than an alteration, and are accepted:
//   - an empty value applied (null, {}, [], 0, false, "") may be absent:
//     the API types omit empty fields when they encode;
//   - a resource quantity may come back in canonical form ("0.5" as
//     "500m", "1024Mi" as "1Gi"): equal quantities are equal.
func matchesApplied(want, got any, path string) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: applied an object, the server has %s", orRoot(path), describe(got))}
		}
		var diffs []string
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			p := path + "." + k
			gv, ok := g[k]
			if !ok {
				if !isEmpty(w[k]) {
					diffs = append(diffs, fmt.Sprintf("%s: applied %s, the server dropped it", p, describe(w[k])))
				}
				continue
			}
			diffs = append(diffs, matchesApplied(w[k], gv, p)...)
		}
		return diffs
	case []any:
		g, ok := got.([]any)
		if !ok {
			if len(w) == 0 && got == nil {
				return nil
			}
			return []string{fmt.Sprintf("%s: applied a list, the server has %s", path, describe(got))}
		}
		if len(w) != len(g) {
			return []string{fmt.Sprintf("%s: applied %d items, the server has %d", path, len(w), len(g))}
		}
		var diffs []string
		for i := range w {
			diffs = append(diffs, matchesApplied(w[i], g[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return diffs
	default:
		if equalScalars(want, got) || equalQuantities(want, got) {
			return nil
		}
		if isEmpty(want) && isEmpty(got) {
			return nil
		}
		return []string{fmt.Sprintf("%s: applied %s, the server has %s", path, describe(want), describe(got))}
	}
}

// equalScalars compares two decoded JSON scalars; numbers compare by value
// (YAML and the server's JSON may decode one as int64, the other as
// float64).
func equalScalars(a, b any) bool {
	if fa, ok := number(a); ok {
		fb, ok := number(b)
		return ok && fa == fb
	}
	return reflect.DeepEqual(a, b)
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	case int:
		return float64(n), true
	}
	return 0, false
}

// equalQuantities reports whether both values are the same resource
// quantity in different spellings.
func equalQuantities(a, b any) bool {
	qa, err := resource.ParseQuantity(fmt.Sprint(a))
	if err != nil {
		return false
	}
	qb, err := resource.ParseQuantity(fmt.Sprint(b))
	return err == nil && qa.Cmp(qb) == 0 && (isString(a) || isString(b))
}

func isString(v any) bool { _, ok := v.(string); return ok }

func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case int64:
		return x == 0
	case float64:
		return x == 0
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	}
	return false
}

func describe(v any) string {
	if v == nil {
		return "nothing"
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func orRoot(path string) string {
	if path == "" {
		return "the object"
	}
	return path
}

// liveWorkload returns the release's Deployment or StatefulSet.
func liveWorkload(t *testing.T, objs []applied) applied {
	t.Helper()
	for _, o := range objs {
		if k := o.want.GetKind(); k == "Deployment" || k == "StatefulSet" {
			return o
		}
	}
	t.Fatal("the release has no Deployment or StatefulSet")
	return applied{}
}

// podTemplateAnnotation reads an annotation of the live workload's pod
// template.
func podTemplateAnnotation(t *testing.T, a *liveAPI, objs []applied, key string) string {
	t.Helper()
	w := liveWorkload(t, objs)
	annotations, _, err := unstructured.NestedStringMap(w.live.Object, "spec", "template", "metadata", "annotations")
	if err != nil {
		t.Fatal(err)
	}
	return annotations[key]
}

// checkGone fails for every object of the release the server still has
// after uninstall.
func (a *liveAPI) checkGone(t *testing.T, objs []applied) {
	t.Helper()
	for _, o := range objs {
		_, err := a.dyn.Resource(o.gvr).Namespace(o.want.GetNamespace()).Get(t.Context(), o.want.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			t.Errorf("after uninstall, read %s: %v", o, err)
		default:
			t.Errorf("after uninstall, the server still has %s", o)
		}
	}
}

// installServiceMonitorCRD installs the CustomResourceDefinition in
// testdata/crd/ for prometheus-operator's ServiceMonitor, which the chart
// renders when serviceMonitor.enabled, and waits until the API serves it.
func installServiceMonitorCRD(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "crd", "servicemonitors.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd, err := dyn.Resource(crds).Create(t.Context(), &unstructured.Unstructured{Object: m}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the ServiceMonitor CRD: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := dyn.Resource(crds).Get(t.Context(), crd.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if c, ok := c.(map[string]any); ok && c["type"] == "Established" && c["status"] == "True" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal(errors.New("the ServiceMonitor CRD is not Established after 1m"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestMatchesApplied pins what the API-server test counts as the server
// altering an object and what it accepts as the server's own additions
// and spellings.
func TestMatchesApplied(t *testing.T) {
	t.Parallel()
	parse := func(s string) map[string]any {
		t.Helper()
		var m map[string]any
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	applied := `
metadata: {name: a, annotations: {}}
spec:
  replicas: 1
  template:
    spec:
      containers:
        - name: retryd
          args: [serve, --listen, ":7700"]
          resources: {requests: {cpu: "0.5", memory: 1024Mi}}
          env: []
`
	for _, tc := range []struct {
		name, live string
		want       []string // substrings of the differences, in order
	}{{
		name: "server additions and spellings",
		live: `
metadata: {name: a, uid: x, resourceVersion: "7"}
spec:
  replicas: 1
  strategy: {type: Recreate}
  template:
    spec:
      containers:
        - name: retryd
          args: [serve, --listen, ":7700"]
          resources: {requests: {cpu: 500m, memory: 1Gi}}
          terminationMessagePath: /dev/termination-log
status: {replicas: 0}
`,
	}, {
		name: "a dropped field, a changed value, a changed quantity, a shorter list",
		live: `
metadata: {name: a}
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: retryd
          args: [serve, --listen]
          resources: {requests: {cpu: 400m}}
`,
		want: []string{
			".spec.replicas: applied \"1\", the server has \"2\"",
			".spec.template.spec.containers[0].args: applied 3 items, the server has 2",
			".spec.template.spec.containers[0].resources.requests.cpu: applied \"\\\"0.5\\\"\", the server has \"400m\"",
			".spec.template.spec.containers[0].resources.requests.memory: applied \"1024Mi\", the server dropped it",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := matchesApplied(parse(applied), parse(tc.live), "")
			if len(got) != len(tc.want) {
				t.Fatalf("differences:\n%s\nwant %d", strings.Join(got, "\n"), len(tc.want))
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("difference %d = %s, want it to contain %s", i, got[i], tc.want[i])
				}
			}
		})
	}
}
