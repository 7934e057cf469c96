package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Subnets. The namespaces' addresses are 10.Y.X.Z: Y the kind of network
// (10.250 a NetServer's, 10.249 a ClientNet's, 10.248 and 10.247 a
// StoreNet's), X the subnet, Z the path. The paths' ends in the test's
// namespace share it with every other test process on the machine — the
// other packages of a `go test ./...`, a benchmark run from another
// checkout — and Linux lets two interfaces there hold the same address
// without a word: each adds its own route to the same prefix, and the
// first one added carries every packet. So a namespace whose subnet
// another process holds already would send some of its paths' packets to
// that process's server, silently (one replica of a test writing to its
// own Redis and another reading the other process's, which has none of
// it). The first choice of subnet, (7·PID + the namespace's number) mod
// 250, makes that rare, not impossible: two processes' namespaces choose
// alike whenever 7 times the difference of their PIDs plus the difference
// of their numbers is a multiple of 250.
//
// claimSubnet therefore takes only a subnet that no address of the test's
// namespace is in, and the test processes take one at a time (a file
// lock, which the kernel releases when a process dies) until each has
// added its addresses there. A process that does not take the lock can
// still add the same subnet in between: checkRoute then fails the test
// rather than let it run on another process's server.

// subnets is how many subnets a kind of network has.
const subnets = 250

// claimSubnet returns the subnet for the namespace numbered n, one that
// holds no address of the test's namespace in any of the networks named
// (such as "10.250"), with the lock held: release, which may be called
// again, lets other processes choose once the caller added its addresses.
func claimSubnet(t testing.TB, n int64, networks ...string) (subnet int, release func()) {
	t.Helper()
	release = lockSubnets(t)
	used, err := usedSubnets(networks)
	if err != nil {
		release()
		t.Fatalf("redistest: reading the addresses of the test's namespace: %v", err)
	}
	first := (os.Getpid()*7 + int(n)) % subnets
	for i := range subnets {
		if s := (first + i) % subnets; !used[s] {
			return s, release
		}
	}
	release()
	t.Fatalf("redistest: every subnet of %s is in use in the test's namespace", strings.Join(networks, ", "))
	return 0, nil
}

// lockSubnets takes the lock the test processes choose subnets under, and
// returns its release.
func lockSubnets(t testing.TB) func() {
	t.Helper()
	path := filepath.Join(os.TempDir(), "retrydtest-subnets.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		t.Fatalf("redistest: locking %s: %v", path, err)
	}
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) } // closing releases the lock
}

// usedSubnets returns the subnets of networks (such as "10.250") that an
// address of the test's namespace is in.
func usedSubnets(networks []string) (map[int]bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	used := map[int]bool{}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip4 := ipn.IP.To4()
		if ip4 == nil {
			continue
		}
		for _, network := range networks {
			if fmt.Sprintf("%d.%d", ip4[0], ip4[1]) == network {
				used[int(ip4[2])] = true
			}
		}
	}
	return used, nil
}

// checkRoute fails the test unless the test's namespace sends packets for
// addr over dev: another process's interface holding an address of the
// same subnet, added first, would carry them instead.
func checkRoute(t testing.TB, addr, dev string) {
	t.Helper()
	out, err := exec.Command("ip", "-o", "route", "get", addr).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: ip route get %s: %v: %s", addr, err, out)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "dev" && f[i+1] == dev {
			return
		}
	}
	t.Fatalf("redistest: the test's namespace routes %s as %q, not over %s: another process's network holds the same subnet",
		addr, strings.TrimSpace(string(out)), dev)
}
