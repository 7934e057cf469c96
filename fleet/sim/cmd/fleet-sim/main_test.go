package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/retryd/retryd/fleet/sim"
)

// TestRunWritesTheDocs: the command fills the table section of fleet.md,
// leaves the rest of it alone, and writes the plot beside it.
func TestRunWritesTheDocs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole report (8 simulations); skipped with -short")
	}
	dir := t.TempDir()
	doc := "# Fleet\n\nbefore\n" + sim.TableBegin + "\nold table\n" + sim.TableEnd + "\nafter\n"
	if err := os.WriteFile(filepath.Join(dir, "fleet.md"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"-docs", dir}, &out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "fleet.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := "# Fleet\n\nbefore\n" + sim.TableBegin + "\n" + out.String() + sim.TableEnd + "\nafter\n"
	if string(got) != want {
		t.Errorf("fleet.md:\n%s\nwant\n%s", got, want)
	}
	if !strings.Contains(out.String(), "| normal | policy only |") {
		t.Errorf("the table has no policy-only row:\n%s", out.String())
	}
	svg, err := os.ReadFile(filepath.Join(dir, "fleet-retries.svg"))
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg ")) {
		t.Errorf("fleet-retries.svg: %v, %.40q", err, svg)
	}
}

func TestRunRefusesADocWithoutItsSection(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fleet.md"), []byte("# Fleet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run([]string{"-docs", dir}, new(bytes.Buffer))
	if err == nil || !strings.Contains(err.Error(), "fleet.md") {
		t.Fatalf("run = %v, want an error naming fleet.md", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "fleet-retries.svg")); !os.IsNotExist(err) {
		t.Error("wrote the plot beside a document it could not update")
	}
}
