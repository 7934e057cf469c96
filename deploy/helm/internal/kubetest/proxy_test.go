package kubetest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/retryd/retryd/deploy/helm/internal/kubetest"
	"github.com/retryd/retryd/internal/retrydtest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestProxyRoutesServiceIPs: kube-proxy started by the harness routes a
// connection to a Service's cluster IP to the endpoint its EndpointSlice
// names, and refuses it once the Service has no endpoint left. The
// endpoint is a listener on an address of an interface the test
// makes (the API refuses loopback endpoints); nothing leaves the machine.
func TestProxyRoutesServiceIPs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes API server and kube-proxy; not with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("kube-proxy needs root (iptables)")
	}
	retrydtest.NeedProgram(t, "ip", "apt-get install iproute2")
	endpointIP := localAddress(t)

	ln, err := net.Listen("tcp", net.JoinHostPort(endpointIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(conn, "endpoint "+endpointIP)
			conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	cluster := kubetest.Start(t, kubetest.Options{APIServerOnly: true})
	client := cluster.Client(t)
	ctx := t.Context()
	// kube-proxy reads its node's addresses; no kubelet runs to set them.
	const nodeName = "proxy-test-node"
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: endpointIP}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{endpointIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Port: ptr.To(int32(port))}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	cluster.StartProxy(t, nodeName, "10.244.0.0/16")
	serviceAddr := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	dial := func() (string, error) {
		conn, err := net.DialTimeout("tcp", serviceAddr, 2*time.Second)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		b, err := io.ReadAll(conn)
		return string(b), err
	}
	// eventually dials until check accepts the outcome: kube-proxy
	// follows the API server a moment behind it.
	eventually := func(what string, check func(string, error) bool) {
		t.Helper()
		var got string
		var err error
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got, err = dial(); check(got, err) {
				return
			}
		}
		t.Fatalf("%s: dialling %s gave %q, %v", what, serviceAddr, got, err)
	}
	eventually("routed to the endpoint", func(got string, err error) bool {
		return err == nil && got == "endpoint "+endpointIP
	})

	if err := client.DiscoveryV1().EndpointSlices("default").Delete(ctx, slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("refused without an endpoint", func(_ string, err error) bool {
		return errors.Is(err, syscall.ECONNREFUSED)
	})
}

// localAddress makes an interface (a bridge with no port: this kernel has
// no dummy device) with an address of its own, removed
// when the test ends, and returns the address.
func localAddress(t *testing.T) string {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	name := "ktp" + hex.EncodeToString(b)
	ip := net.IPv4(10, 250, b[0], 1+b[1]%250).String()
	ipCmd := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	ipCmd("link", "add", name, "type", "bridge")
	t.Cleanup(func() { ipCmd("link", "del", name) })
	ipCmd("addr", "add", ip+"/32", "dev", name)
	ipCmd("link", "set", name, "up")
	return ip
}
