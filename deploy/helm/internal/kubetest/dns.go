package kubetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/loopback"
)

// ClusterDomain is the DNS domain of the cluster's Services and Pods, the
// kubelet's clusterDomain.
const ClusterDomain = "cluster.local"

// DNS is CoreDNS serving the cluster's names from the API server: a
// Service's name.namespace.svc.cluster.local resolves to its cluster IP,
// or to its endpoints' addresses when it is headless. It answers nothing
// else (there is no upstream to forward to), so a pod's lookups never
// leave the machine.
type DNS struct {
	// Addr is the host:port it answers on, over UDP and TCP.
	Addr    string
	Process *Process
}

// StartDNS starts CoreDNS (pinned in tools/coredns) for the cluster's
// domain. host is the address it answers on: a node's address, where pods
// reach it on port 53 (the kubelet's clusterDNS), or "" for 127.0.0.1 on a
// free port. It reads the API server as cluster-admin and is ready once its
// caches of Services, EndpointSlices and Namespaces are filled. It is
// stopped when the test ends.
func (c *Cluster) StartDNS(t testing.TB, host string) *DNS {
	t.Helper()
	bin := Binary(t, CoreDNSPackage)
	dir := filepath.Join(c.Dir, "coredns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &DNS{}
	// Two ports when the DNS port is free too (on loopback), one for the
	// ready endpoint otherwise.
	n := 1
	if host == "" {
		n = 2
	}
	var err error
	d.Process, _, err = startOnFreePorts(n, func(ports []int) (*Process, error) {
		d.Addr = net.JoinHostPort(host, "53")
		if host == "" {
			d.Addr = loopback.HostPort(ports[1])
		}
		corefile := filepath.Join(dir, "Corefile")
		if err := os.WriteFile(corefile, []byte(c.corefile(d.Addr, loopback.HostPort(ports[0]))), 0o600); err != nil {
			return nil, err
		}
		return startProcess(dir, "coredns", bin, "-conf", corefile)
	}, func(p *Process, ports []int) error {
		return p.waitFor(readyTimeout, func() error { return httpOK(http.DefaultClient, "http://"+loopback.HostPort(ports[0])+"/ready") })
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Process.Stop()
		if t.Failed() {
			t.Logf("kubetest: end of coredns's log (%s):\n%s", d.Process.LogFile, d.Process.Tail())
		}
	})
	return d
}

// corefile is CoreDNS's configuration: the kubernetes plugin for the
// cluster's domain and the reverse zones, answering on addr, with its
// readiness served on ready.
func (c *Cluster) corefile(addr, ready string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf(`.:%s {
	bind %s
	errors
	ready %s
	kubernetes %s in-addr.arpa ip6.arpa {
		kubeconfig %s kubetest
		pods insecure
		ttl 5
	}
}
`, port, host, ready, ClusterDomain, c.Kubeconfig)
}

// Resolver is a resolver that asks only d.
func (d *DNS) Resolver() *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var dialer net.Dialer
			dialer.Timeout = 5 * time.Second
			return dialer.DialContext(ctx, network, d.Addr)
		},
	}
}
