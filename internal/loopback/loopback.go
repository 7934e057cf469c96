// Package loopback reserves free TCP ports on 127.0.0.1 for the processes
// the tests start (redis-server, Jaeger, etcd and kube-apiserver), and
// loopback addresses of their own for servers whose address must not be
// taken over once they stop (Host).
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// FreePorts reserves n distinct free loopback TCP ports. The listeners are
// held until all are chosen, so the ports differ, then released for the
// process that is to bind them. Another process can take one in between:
// callers start again on new ports when a bind fails.
func FreePorts(n int) ([]int, error) { return FreePortsOn("127.0.0.1", n) }

// FreePortsOn is FreePorts on the loopback address host (see Host).
func FreePortsOn(host string, n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("reserve a loopback port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort is FreePorts(1).
func FreePort() (int, error) { return FreePortOn("127.0.0.1") }

// FreePortOn is FreePortsOn(host, 1).
func FreePortOn(host string) (int, error) {
	ports, err := FreePortsOn(host, 1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// HostPort is "127.0.0.1:port".
func HostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Host returns a loopback address picked at random in 127.0.0.0/8
// outside 127.0.0.0/16, for one server. Once a server on 127.0.0.1 stops,
// any other process may bind its port next, and a client that still
// dials it (a Redis Cluster client whose slot map names a dead master)
// then talks to a stranger. On an address of its own a port is taken over
// only by a server that picks the same address, one chance in about 16
// million. Linux routes all of 127.0.0.0/8 to the loopback interface.
func Host() string {
	return fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254))
}
