package kubetest_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/retryd/retryd/deploy/helm/internal/kubetest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestClusterDNS: CoreDNS started by the harness answers a Service's name
// with its cluster IP, a headless Service's name with its endpoints'
// addresses, follows a change of those endpoints, and answers a name that
// exists nowhere with "not found", as a pod's resolver sees them.
func TestClusterDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes API server and CoreDNS; not with -short")
	}
	cluster := kubetest.Start(t, kubetest.Options{APIServerOnly: true})
	client := cluster.Client(t)
	ctx := t.Context()
	const ns = "dns-test"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	port := []corev1.ServicePort{{Name: "grpc", Port: 7700}}
	svc, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "retryd"},
		Spec:       corev1.ServiceSpec{Ports: port},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "retryd-headless"},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: port},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller-manager runs, so the endpoints are written as its
	// EndpointSlice controller would.
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "retryd-headless-1", Labels: map[string]string{discoveryv1.LabelServiceName: "retryd-headless"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.244.0.8"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To[int32](7700)}},
	}
	if slice, err = client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dns := cluster.StartDNS(t, "")
	r := dns.Resolver()
	lookup := func(name string) ([]string, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		addrs, err := r.LookupHost(ctx, name)
		slices.Sort(addrs)
		return addrs, err
	}
	// eventually retries a lookup until it gives want: CoreDNS follows
	// the API server through a watch, a moment behind it.
	eventually := func(name string, want ...string) {
		t.Helper()
		var got []string
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got, err = lookup(name); err == nil && slices.Equal(got, want) {
				return
			}
		}
		t.Fatalf("%s resolves to %v (%v), want %v", name, got, err, want)
	}

	eventually("retryd."+ns+".svc."+kubetest.ClusterDomain, svc.Spec.ClusterIP)
	eventually("retryd-headless."+ns+".svc."+kubetest.ClusterDomain, "10.244.0.7", "10.244.0.8")

	slice.Endpoints = slice.Endpoints[:1]
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("retryd-headless."+ns+".svc."+kubetest.ClusterDomain, "10.244.0.7")

	if addrs, err := lookup("absent." + ns + ".svc." + kubetest.ClusterDomain); err == nil {
		t.Errorf("a Service that does not exist resolves to %v", addrs)
	}
}
