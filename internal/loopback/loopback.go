// Package loopback reserves free TCP ports on 127.0.0.1 for the processes
// the tests start (redis-server, Jaeger, etcd and kube-apiserver).
package loopback

import (
	"fmt"
	"net"
	"strconv"
)

// FreePorts reserves n distinct free loopback TCP ports. The listeners are
// held until all are chosen, so the ports differ, then released for the
// process that is to bind them. Another process can take one in between:
// callers start again on new ports when a bind fails.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserve a loopback port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort is FreePorts(1).
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// HostPort is "127.0.0.1:port".
func HostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
