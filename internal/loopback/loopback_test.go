package loopback

import (
	"net"
	"testing"
)

func TestFreePortsAreDistinctAndBindable(t *testing.T) {
	ports, err := FreePorts(8)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d reserved twice in %v", p, ports)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", HostPort(p))
		if err != nil {
			t.Fatalf("port %d was not released: %v", p, err)
		}
		ln.Close()
	}
}
