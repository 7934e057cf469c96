package releasetest

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/retryd/retryd/internal/retrydtest"
)

// TestPythonWheel: a fresh virtual environment installs the release's
// wheel with its dependencies from PyPI; the package reports the release's
// version and schedules a retry on a live retryd.
func TestPythonWheel(t *testing.T) {
	t.Parallel()
	rel := theRelease(t)
	python := retrydtest.NeedProgram(t, "python3", "apt-get install -y python3 python3-venv")
	needVenv(t)
	dir := t.TempDir()
	venv := filepath.Join(dir, "venv")
	run(t, dir, nil, python, "-m", "venv", venv)
	wheel := filepath.Join(rel.dist, "retryd-"+rel.plain+"-py3-none-any.whl")
	run(t, dir, nil, filepath.Join(venv, "bin", "pip"), "install", "--quiet", "--disable-pip-version-check", wheel)

	script, err := filepath.Abs(filepath.Join("testdata", "consumer.py"))
	if err != nil {
		t.Fatal(err)
	}
	srv := retrydtest.Start(t)
	out := run(t, dir, nil, filepath.Join(venv, "bin", "python"), script, srv.Addr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != rel.plain || lines[1] != "scheduled retry 1 of 2" {
		t.Errorf("the agent on the retryd wheel printed %q, want retryd.__version__ %s and a scheduled retry 1 of 2", out, rel.plain)
	}
	if events := retrydtest.Verify(t, srv.Conn(t)); len(events) != 1 || events[0].GetScheduled() == nil {
		t.Errorf("the server's event log is %v, want the one scheduled retry", events)
	}
}
