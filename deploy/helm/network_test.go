package helm_test

import (
	"maps"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// networkObjects renders a values file of testdata/network and returns
// its NetworkPolicy and GRPCRoute (nil when not rendered), each decoded
// strictly into its API type by render.
func networkObjects(t *testing.T, name string) (*rendered, *networkingv1.NetworkPolicy, *gatewayv1.GRPCRoute) {
	t.Helper()
	r := render(t, filepath.Join("testdata", "network", name))
	var np *networkingv1.NetworkPolicy
	var route *gatewayv1.GRPCRoute
	for _, o := range r.objects {
		switch o := o.(type) {
		case *networkingv1.NetworkPolicy:
			setOnce(t, &np, o)
		case *gatewayv1.GRPCRoute:
			setOnce(t, &route, o)
		}
	}
	return r, np, route
}

// TestNetworkObjectsOffByDefault: no values file of testdata/ renders a
// NetworkPolicy or a GRPCRoute.
func TestNetworkObjectsOffByDefault(t *testing.T) {
	t.Parallel()
	for _, f := range goodValues(t) {
		for _, o := range render(t, f).objects {
			switch o.(type) {
			case *networkingv1.NetworkPolicy, *gatewayv1.GRPCRoute:
				t.Errorf("%s renders %T %s; both are off by default", f, o, o.GetName())
			}
		}
	}
}

// port is what a NetworkPolicy rule lets through: a port (a number or a
// container port's name) and its protocol.
type port struct {
	port, protocol string
}

func rulePorts(ps []networkingv1.NetworkPolicyPort) []port {
	var out []port
	for _, p := range ps {
		out = append(out, port{p.Port.String(), string(deref(p.Protocol))})
	}
	return out
}

// checkPolicyTargets: the policy selects the workload's pods, and every
// named port it admits is a port of the retryd container.
func checkPolicyTargets(t *testing.T, r *rendered, np *networkingv1.NetworkPolicy) {
	t.Helper()
	w := r.workload()
	if !selects(np.Spec.PodSelector, w.pod.Labels) || !maps.Equal(np.Spec.PodSelector.MatchLabels, w.selector.MatchLabels) {
		t.Errorf("podSelector %v does not select the pods %v by the workload's selector %v", np.Spec.PodSelector, w.pod.Labels, w.selector.MatchLabels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policyTypes %v, want Ingress and Egress", np.Spec.PolicyTypes)
	}
	c := r.container(t)
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port.String() != "" && p.Port.IntValue() == 0 && !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.Port.String() }) {
				t.Errorf("ingress admits port %q, which the container does not name: %v", p.Port.String(), c.Ports)
			}
		}
	}
}

// TestNetworkPolicyRedisOTLP: with Redis and OTLP, agents of the labelled
// namespaces (and no other pod) reach the gRPC port, Prometheus' namespace
// the metrics port, and the pods reach DNS, Redis' pods on its ports and
// the collector on the endpoint's port.
func TestNetworkPolicyRedisOTLP(t *testing.T) {
	t.Parallel()
	r, np, _ := networkObjects(t, "redis-otlp.yaml")
	if np == nil {
		t.Fatal("no NetworkPolicy rendered")
	}
	checkPolicyTargets(t, r, np)
	if len(np.Spec.Ingress) != 2 {
		t.Fatalf("ingress %+v, want a gRPC and a metrics rule", np.Spec.Ingress)
	}
	grpc, metrics := np.Spec.Ingress[0], np.Spec.Ingress[1]
	if got := rulePorts(grpc.Ports); !slices.Equal(got, []port{{"grpc", "TCP"}}) {
		t.Errorf("agents' rule admits %v, want grpc/TCP", got)
	}
	if len(grpc.From) != 1 || grpc.From[0].NamespaceSelector == nil || grpc.From[0].PodSelector != nil ||
		grpc.From[0].NamespaceSelector.MatchLabels["agents.example.com/retryd"] != "allowed" {
		t.Errorf("agents' rule admits %+v, want only the namespaces labelled agents.example.com/retryd=allowed", grpc.From)
	}
	if got := rulePorts(metrics.Ports); !slices.Equal(got, []port{{"metrics", "TCP"}}) {
		t.Errorf("metrics rule admits %v, want metrics/TCP", got)
	}
	if len(metrics.From) != 1 || metrics.From[0].NamespaceSelector == nil ||
		metrics.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("metrics rule admits %+v, want the namespace monitoring", metrics.From)
	}

	if len(np.Spec.Egress) != 3 {
		t.Fatalf("egress %+v, want DNS, Redis and OTLP rules", np.Spec.Egress)
	}
	dns, redis, otlp := np.Spec.Egress[0], np.Spec.Egress[1], np.Spec.Egress[2]
	if got := rulePorts(dns.Ports); !slices.Equal(got, []port{{"53", "UDP"}, {"53", "TCP"}}) || len(dns.To) != 0 {
		t.Errorf("DNS rule %v to %v, want 53 UDP and TCP anywhere", got, dns.To)
	}
	if got := rulePorts(redis.Ports); !slices.Equal(got, []port{{"6379", "TCP"}, {"26379", "TCP"}}) {
		t.Errorf("Redis rule ports %v, want 6379 and 26379", got)
	}
	if len(redis.To) != 1 || redis.To[0].PodSelector == nil || redis.To[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "redis" {
		t.Errorf("Redis rule to %+v, want the pods labelled app.kubernetes.io/name=redis", redis.To)
	}
	if got := rulePorts(otlp.Ports); !slices.Equal(got, []port{{"4317", "TCP"}}) || len(otlp.To) != 0 {
		t.Errorf("OTLP rule %v to %v, want 4317 (otel.endpoint's port) anywhere", got, otlp.To)
	}

	// The pods push metrics (and no spans) to the same endpoint.
	c := r.container(t)
	for name, want := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4317",
		"OTEL_TRACES_EXPORTER":        "none",
		"OTEL_METRICS_EXPORTER":       "otlp",
		"OTEL_METRIC_EXPORT_INTERVAL": "15000",
	} {
		if got := envValue(c.Env, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

// TestNetworkPolicyDefaults: the defaults admit agents of the labelled
// namespaces and of the release's own to the gRPC and (with TLS) health
// ports, Prometheus' namespace to the metrics port, and let the pods out
// to DNS only when neither Redis nor OTLP is used.
func TestNetworkPolicyDefaults(t *testing.T) {
	t.Parallel()
	r, np, route := networkObjects(t, "memory-tls.yaml")
	if np == nil {
		t.Fatal("no NetworkPolicy rendered")
	}
	if route != nil {
		t.Errorf("a GRPCRoute rendered; it is off by default")
	}
	checkPolicyTargets(t, r, np)
	if len(np.Spec.Ingress) != 2 {
		t.Fatalf("ingress %+v, want a gRPC and a metrics rule", np.Spec.Ingress)
	}
	grpc := np.Spec.Ingress[0]
	if got := rulePorts(grpc.Ports); !slices.Equal(got, []port{{"grpc", "TCP"}, {"health", "TCP"}}) {
		t.Errorf("agents' rule admits %v, want grpc and health", got)
	}
	if len(grpc.From) != 2 || grpc.From[0].NamespaceSelector == nil ||
		grpc.From[0].NamespaceSelector.MatchLabels["retryd.dev/client"] != "true" ||
		grpc.From[1].PodSelector == nil || len(grpc.From[1].PodSelector.MatchLabels) != 0 || grpc.From[1].NamespaceSelector != nil {
		t.Errorf("agents' rule admits %+v, want namespaces labelled retryd.dev/client=true and every pod of the release's namespace", grpc.From)
	}
	if len(np.Spec.Egress) != 1 || !slices.Equal(rulePorts(np.Spec.Egress[0].Ports), []port{{"53", "UDP"}, {"53", "TCP"}}) {
		t.Errorf("egress %+v, want DNS only", np.Spec.Egress)
	}
}

// TestGRPCRoute: the route attaches to the Gateway named, answers for the
// hostnames given and sends retryd's API and health, exactly, to the
// chart's Service on its gRPC port.
func TestGRPCRoute(t *testing.T) {
	t.Parallel()
	r, np, route := networkObjects(t, "grpc-route.yaml")
	if route == nil {
		t.Fatal("no GRPCRoute rendered")
	}
	if np != nil {
		t.Errorf("a NetworkPolicy rendered; it is off by default")
	}
	if route.Labels["example.test/route"] != "public" || route.Labels["app.kubernetes.io/name"] != "retryd" {
		t.Errorf("labels %v", route.Labels)
	}
	if len(route.Spec.ParentRefs) != 1 {
		t.Fatalf("parentRefs %+v", route.Spec.ParentRefs)
	}
	if p := route.Spec.ParentRefs[0]; p.Name != "agents-gateway" || deref(p.Namespace) != "gateways" || deref(p.SectionName) != "grpc" {
		t.Errorf("parentRef %+v, want gateways/agents-gateway section grpc", p)
	}
	if !slices.Equal(route.Spec.Hostnames, []gatewayv1.Hostname{"retryd.agents.example.com"}) {
		t.Errorf("hostnames %v", route.Spec.Hostnames)
	}
	if len(route.Spec.Rules) != 1 {
		t.Fatalf("rules %+v, want one", route.Spec.Rules)
	}
	rule := route.Spec.Rules[0]
	var services []string
	for _, m := range rule.Matches {
		if m.Method == nil || deref(m.Method.Type) != gatewayv1.GRPCMethodMatchExact || m.Method.Method != nil {
			t.Errorf("match %+v, want an exact match of a whole service", m)
			continue
		}
		services = append(services, deref(m.Method.Service))
	}
	if !slices.Equal(services, []string{retryService, "grpc.health.v1.Health"}) {
		t.Errorf("the route matches %v, want %s and grpc.health.v1.Health", services, retryService)
	}
	var svc *corev1.Service
	for _, s := range r.services {
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			svc = s
		}
	}
	if svc == nil || len(rule.BackendRefs) != 1 {
		t.Fatalf("Service %v, backendRefs %+v", svc, rule.BackendRefs)
	}
	if b := rule.BackendRefs[0]; string(b.Name) != svc.Name || b.Port == nil || int32(*b.Port) != svc.Spec.Ports[0].Port ||
		svc.Spec.Ports[0].Name != "grpc" || b.Kind != nil && *b.Kind != "Service" {
		t.Errorf("backendRef %+v, want Service %s port %d (grpc)", b.BackendObjectReference, svc.Name, svc.Spec.Ports[0].Port)
	}
}
