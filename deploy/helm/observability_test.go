package helm_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// observabilityFiles are the files the chart ships from
// deploy/observability, copied into retryd/files by go generate.
var observabilityFiles = []string{"grafana-dashboard.json", "alerts.yaml"}

// TestObservabilityFilesAreCopies: the chart's copies of the dashboard
// and the alert rules are byte for byte deploy/observability's, which the
// Prometheus tests there prove; an edit of one without the other fails.
func TestObservabilityFilesAreCopies(t *testing.T) {
	t.Parallel()
	for _, name := range observabilityFiles {
		source, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "observability", name))
		if err != nil {
			t.Fatal(err)
		}
		shipped, err := os.ReadFile(filepath.Join(chartDir(t), "files", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(source, shipped) {
			t.Errorf("deploy/helm/retryd/files/%s differs from deploy/observability/%s: run `go generate` in deploy/helm", name, name)
		}
	}
}

// observabilityObjects renders the chart with a values file and returns
// the dashboard ConfigMap and the PrometheusRule (nil when not rendered),
// each decoded strictly: the PrometheusRule into prometheus-operator's own
// type.
func observabilityObjects(t *testing.T, valuesFile string) (*corev1.ConfigMap, *monitoringv1.PrometheusRule) {
	t.Helper()
	stdout, stderr, err := runHelm(t, "template", release, chartDir(t),
		"--namespace", namespace, "--kube-version", kubeVersion, "-f", absPath(t, valuesFile))
	if err != nil {
		t.Fatalf("helm template -f %s: %v\n%s", valuesFile, err, stderr)
	}
	var dashboard *corev1.ConfigMap
	var rule *monitoringv1.PrometheusRule
	for i, doc := range splitDocuments(stdout) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "monitoring.coreos.com/v1 PrometheusRule":
			r := &monitoringv1.PrometheusRule{}
			if err := decodeStrict(doc, r); err != nil {
				t.Fatalf("the PrometheusRule does not decode strictly: %v\n%s", err, doc)
			}
			setOnce(t, &rule, r)
		case "v1 ConfigMap":
			cm := &corev1.ConfigMap{}
			if err := decodeStrict(doc, cm); err != nil {
				t.Fatalf("a ConfigMap does not decode strictly: %v\n%s", err, doc)
			}
			if strings.HasSuffix(cm.Name, "-dashboard") {
				setOnce(t, &dashboard, cm)
			}
		}
	}
	return dashboard, rule
}

// TestObservabilityOffByDefault: without grafanaDashboard and
// prometheusRule enabled, neither object is rendered.
func TestObservabilityOffByDefault(t *testing.T) {
	t.Parallel()
	for _, f := range goodValues(t) {
		dashboard, rule := observabilityObjects(t, f)
		if dashboard != nil || rule != nil {
			t.Errorf("%s: dashboard ConfigMap %v, PrometheusRule %v rendered; both are off by default", f, dashboard != nil, rule != nil)
		}
	}
}

// TestObservabilityShipped renders both with every setting changed: the
// ConfigMap carries the dashboard unchanged under the sidecar's label, in
// the namespace asked for; the PrometheusRule carries alerts.yaml's groups
// with the job matcher set to the ServiceMonitor's job, and promtool
// accepts the groups it carries.
func TestObservabilityShipped(t *testing.T) {
	t.Parallel()
	dashboard, rule := observabilityObjects(t, filepath.Join("testdata", "observability", "both.yaml"))
	if dashboard == nil || rule == nil {
		t.Fatalf("dashboard ConfigMap %v, PrometheusRule %v: want both", dashboard != nil, rule != nil)
	}

	source, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "observability", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if dashboard.Data["retryd.json"] != string(source) || len(dashboard.Data) != 1 {
		t.Errorf("the dashboard ConfigMap's data is not deploy/observability/grafana-dashboard.json as retryd.json (keys %v)", keys(dashboard.Data))
	}
	if !json.Valid([]byte(dashboard.Data["retryd.json"])) {
		t.Errorf("retryd.json is not JSON")
	}
	if dashboard.Namespace != "monitoring" || dashboard.Labels["grafana.example.com/dashboard"] != "retryd" ||
		dashboard.Annotations["grafana_folder"] != "Agents" || dashboard.Labels["app.kubernetes.io/name"] != "agent-retries" {
		t.Errorf("dashboard ConfigMap %s/%s labels %v annotations %v; want namespace monitoring, the sidecar's label and the folder annotation",
			dashboard.Namespace, dashboard.Name, dashboard.Labels, dashboard.Annotations)
	}

	if rule.Namespace != namespace || rule.Labels["release"] != "kube-prometheus-stack" || rule.Labels["app.kubernetes.io/name"] != "agent-retries" {
		t.Errorf("PrometheusRule %s/%s labels %v", rule.Namespace, rule.Name, rule.Labels)
	}
	// The shipped rules, decoded the same strict way, with the chart's job.
	alerts, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "observability", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(alerts, []byte(`job="retryd"`)) {
		t.Fatal(`alerts.yaml selects no job="retryd": nothing for the chart to rewrite`)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := decodeStrict(bytes.ReplaceAll(alerts, []byte(`job="retryd"`), []byte(`job="agent-retries"`)), &want); err != nil {
		t.Fatalf("alerts.yaml does not decode strictly as a PrometheusRule's spec: %v", err)
	}
	if !reflect.DeepEqual(rule.Spec, want) {
		got, _ := yaml.Marshal(rule.Spec)
		t.Errorf("the PrometheusRule's groups are not alerts.yaml's with the chart's job:\n%s", got)
	}
	if n := countAlerts(rule.Spec); n == 0 || n != bytes.Count(alerts, []byte("- alert: ")) {
		t.Errorf("the PrometheusRule carries %d alerts, alerts.yaml %d", n, bytes.Count(alerts, []byte("- alert: ")))
	}

	promtool := retrydtest.NeedProgram(t, "promtool", "apt-get install -y prometheus")
	groups, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, groups, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the PrometheusRule's groups: %v\n%s", err, out)
	}
}

func countAlerts(spec monitoringv1.PrometheusRuleSpec) int {
	n := 0
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				n++
			}
		}
	}
	return n
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestObservabilityTuned renders the rules with runbookBaseURL and some
// alerts' waits and thresholds changed: every runbook_url is the base URL
// and the alert's anchor, a changed alert has its new `for` and the new
// number after its expression's final ">", every other alert is
// alerts.yaml's, and promtool accepts the result.
func TestObservabilityTuned(t *testing.T) {
	t.Parallel()
	_, rule := observabilityObjects(t, filepath.Join("testdata", "observability", "tuned.yaml"))
	_, defaults := observabilityObjects(t, filepath.Join("testdata", "observability", "both.yaml"))
	if rule == nil || defaults == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	type tuning struct{ wait, threshold string }
	changed := map[string]tuning{
		"RetrydDown":                {wait: "3m"},
		"RetrydHighDelegationRatio": {wait: "30m", threshold: "0.8"},
		"RetrydStartLatenessHigh":   {threshold: "2.5"},
		"RetrydAdmissionRefusals":   {threshold: "0.05"},
	}
	original := map[string]monitoringv1.Rule{}
	for _, g := range defaults.Spec.Groups {
		for _, r := range g.Rules {
			original[r.Alert] = r
		}
	}
	final := regexp.MustCompile(`>\s*([0-9.]+)\s*$`)
	seen := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			seen++
			orig := original[r.Alert]
			if want := "https://wiki.example.com/ops/retryd-runbooks#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			// both.yaml renames the job; tuned.yaml keeps the chart's name.
			wantFor, wantExpr := orig.For, strings.ReplaceAll(orig.Expr.String(), `job="agent-retries"`, `job="retryd"`)
			if c := changed[r.Alert]; c.wait != "" {
				wantFor = ptr(monitoringv1.Duration(c.wait))
			}
			if c := changed[r.Alert]; c.threshold != "" {
				m := final.FindStringSubmatchIndex(wantExpr)
				if m == nil {
					t.Fatalf("%s: alerts.yaml's expression ends in no > comparison: %s", r.Alert, wantExpr)
				}
				wantExpr = wantExpr[:m[2]] + c.threshold + wantExpr[m[3]:]
			}
			if deref(r.For) != deref(wantFor) {
				t.Errorf("%s: for %v, want %v", r.Alert, deref(r.For), deref(wantFor))
			}
			if r.Expr.String() != wantExpr {
				t.Errorf("%s: expr\n%s\nwant\n%s", r.Alert, r.Expr.String(), wantExpr)
			}
			if !reflect.DeepEqual(r.Labels, orig.Labels) {
				t.Errorf("%s: labels %v, want alerts.yaml's %v", r.Alert, r.Labels, orig.Labels)
			}
		}
	}
	if seen != len(original) {
		t.Errorf("%d alerts rendered, alerts.yaml has %d", seen, len(original))
	}

	promtool := retrydtest.NeedProgram(t, "promtool", "apt-get install -y prometheus")
	groups, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, groups, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the tuned PrometheusRule's groups: %v\n%s", err, out)
	}
}
