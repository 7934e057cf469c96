package kubetest

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/retryd/retryd/internal/loopback"
	"github.com/retryd/retryd/internal/retrydtest"
)

// Proxy is kube-proxy in iptables mode: it routes the cluster's Service IPs
// to their endpoints from this machine's own iptables rules, as on a node.
type Proxy struct {
	Process *Process
}

// StartProxy starts kube-proxy (pinned in tools/kubernetes) for the node
// nodeName, whose Node object must have an address (a kubelet sets it;
// without one kube-proxy waits 30 s before it starts anyway). clusterCIDR
// is the pods' range: traffic from outside it to a Service IP is treated
// as coming from outside the cluster. It needs root and iptables.
//
// Its rules are the machine's, not the test's: only one harness's
// kube-proxy runs at a time on a machine (a lock held while it runs), and
// when the test ends it is stopped and `kube-proxy --cleanup` removes
// every rule it made.
func (c *Cluster) StartProxy(t testing.TB, nodeName, clusterCIDR string) *Proxy {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kube-proxy needs root (iptables)")
	}
	retrydtest.NeedProgram(t, "iptables", "apt-get install iptables")
	bin := Binary(t, KubeProxyPackage)

	unlock, err := lockMachine("kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := c.CA.Issue("kube-proxy", "system:kube-proxy", nil)
	if err != nil {
		unlock()
		t.Fatal(err)
	}
	kubeconfig, err := c.writeKubeconfig("kube-proxy.kubeconfig", cert)
	if err != nil {
		unlock()
		t.Fatal(err)
	}
	dir := filepath.Join(c.Dir, "kube-proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		unlock()
		t.Fatal(err)
	}
	p := &Proxy{}
	p.Process, _, err = startOnFreePorts(2, func(ports []int) (*Process, error) {
		config := filepath.Join(dir, "config.yaml")
		// The conntrack settings of zero leave the kernel's values alone.
		if err := os.WriteFile(config, fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
mode: iptables
clusterCIDR: %s
healthzBindAddress: %s
metricsBindAddress: %s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, nodeName, clusterCIDR, loopback.HostPort(ports[0]), loopback.HostPort(ports[1])), 0o600); err != nil {
			return nil, err
		}
		return startProcess(dir, "kube-proxy", bin, "--config="+config)
	}, func(p *Process, ports []int) error {
		return p.waitFor(readyTimeout, func() error {
			return httpOK(http.DefaultClient, "http://"+loopback.HostPort(ports[0])+"/healthz")
		})
	})
	if err != nil {
		unlock()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer unlock()
		p.Process.Stop()
		if t.Failed() {
			t.Logf("kubetest: end of kube-proxy's log (%s):\n%s", p.Process.LogFile, p.Process.Tail())
		}
		if out, err := exec.Command(bin, "--cleanup").CombinedOutput(); err != nil {
			t.Errorf("kube-proxy --cleanup: %v\n%s", err, out)
		}
	})
	return p
}

// lockMachine takes a lock, shared by every test process on the machine,
// on what name changes machine-wide; the function returned releases it.
func lockMachine(name string) (func(), error) {
	path := filepath.Join(os.TempDir(), "retryd-kubetest-"+name+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("kubetest: lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
