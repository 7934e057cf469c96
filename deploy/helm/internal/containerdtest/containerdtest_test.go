package containerdtest

import (
	"strings"
	"testing"
	"time"
)

// TestPauseImage imports the pause image and runs it as a pod sandbox
// would be: it must keep running until SIGTERM and then exit 0 at once.
func TestPauseImage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd (-short)")
	}
	c := Start(t, Options{})
	layout, err := WritePauseImage(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Import(layout); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ctr("run", "--detach", "--read-only", PauseImage, "sandbox"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if running, err := c.Running(); err != nil || len(running) != 1 {
		t.Fatalf("running tasks %v (%v), want the sandbox", running, err)
	}
	if _, err := c.Ctr("tasks", "kill", "--signal", "SIGTERM", "sandbox"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := c.Ctr("tasks", "ls")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "STOPPED") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pause process did not stop on SIGTERM:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// ctr warns "task sandbox exit with non-zero exit code N" otherwise.
	if out, err := c.Ctr("tasks", "delete", "sandbox"); err != nil || strings.Contains(out, "exit code") {
		t.Errorf("deleting the stopped sandbox: %q %v, want exit status 0", out, err)
	}
}
