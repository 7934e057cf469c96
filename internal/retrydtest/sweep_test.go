package retrydtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestSweepBinaries: a build removes the binary directories of test
// processes that have ended and keeps those of processes still running.
func TestSweepBinaries(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)

	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	running := exec.Command("sleep", "60")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { running.Process.Kill(); running.Wait() })

	dir := func(pid int) string {
		d := filepath.Join(tmp, binDirPrefix+strconv.Itoa(pid)+"-123")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "retryd"), []byte("binary"), 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	gone, kept, own := dir(ended.Process.Pid), dir(running.Process.Pid), dir(os.Getpid())
	other := filepath.Join(tmp, "retrydtest-other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}

	sweepBinaries()

	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("the directory of an ended process is still there (%v)", err)
	}
	for _, d := range []string{kept, own, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(d), err)
		}
	}
}
