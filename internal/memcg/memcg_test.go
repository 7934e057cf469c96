package memcg_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/retryd/retryd/internal/memcg"
)

// TestGroup: a process started in a group is in it, sees its limit, and
// the group counts what it used; a process that passes the limit is
// killed and counted.
func TestGroup(t *testing.T) {
	t.Parallel()
	const limit = 64 << 20
	g, err := memcg.New(fmt.Sprintf("retryd-memcg-test-%d", os.Getpid()), limit)
	if err != nil {
		t.Skipf("cannot make a memory cgroup here: %v", err)
	}
	defer func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	}()
	out, err := g.Command(context.Background(), "/bin/sh", "-c", "cat /proc/self/cgroup").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "retryd-memcg-test-") {
		t.Fatalf("the process is not in the group: %s", out)
	}
	// 128 MiB in one process: over the limit, killed.
	err = g.Command(context.Background(), "/bin/sh", "-c", `x=$(head -c 134217728 /dev/zero | tr '\0' a); echo ${#x}`).Run()
	if err == nil {
		t.Fatal("a process holding twice the limit was not killed")
	}
	if n, err := g.OOMKills(); err != nil || n < 1 {
		t.Errorf("OOMKills: %d, %v; want at least 1", n, err)
	}
	if peak, err := g.Peak(); err != nil || peak <= 0 || peak > limit {
		t.Errorf("Peak: %d, %v; want within (0, %d]", peak, err, limit)
	}
}
