package main_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/memcg"
	"github.com/retryd/retryd/internal/retrydtest"
)

// TestMemoryLimitFromCgroup runs retryd as a pod with a memory limit runs
// it, in a memory cgroup of its own: it sets the Go runtime's soft limit
// to 90 % of the group's, or to GOMEMLIMIT when that is set, and to
// nothing with --memory-limit-ratio 0.
func TestMemoryLimitFromCgroup(t *testing.T) {
	t.Parallel()
	bin := retrydtest.Binary(t)
	const limit = 256 << 20
	g, err := memcg.New(fmt.Sprintf("retryd-memlimit-test-%d", os.Getpid()), limit)
	if err != nil {
		t.Skipf("cannot make a memory cgroup here: %v", err)
	}
	defer func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	}()
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string // in the log before "serving"; "" for no limit line
	}{
		{name: "the group's limit", want: fmt.Sprintf(`msg="soft memory limit" bytes=%d ratio=0.9`, 241591910)}, // 0.9 × 256 MiB, rounded down
		{name: "a ratio of its own", args: []string{"--memory-limit-ratio", "0.5"}, want: fmt.Sprintf(`msg="soft memory limit" bytes=%d ratio=0.5`, limit/2)},
		{name: "GOMEMLIMIT wins", env: []string{"GOMEMLIMIT=100MiB"}, want: `msg="soft memory limit from GOMEMLIMIT" GOMEMLIMIT=100MiB bytes=104857600`},
		{name: "off", args: []string{"--memory-limit-ratio", "0"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := g.Command(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...)...)
		cmd.Env = append(os.Environ(), tc.env...)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var logs []string
		for sc := bufio.NewScanner(stderr); sc.Scan(); {
			logs = append(logs, sc.Text())
			if strings.Contains(sc.Text(), "msg=serving") {
				break
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		cancel()
		got := strings.Join(logs, "\n")
		switch {
		case !strings.Contains(got, "msg=serving"):
			t.Errorf("%s: never served:\n%s", tc.name, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s: log lacks %q:\n%s", tc.name, tc.want, got)
		case tc.want == "" && strings.Contains(got, "soft memory limit"):
			t.Errorf("%s: set a limit:\n%s", tc.name, got)
		}
	}
}
