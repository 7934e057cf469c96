package releasetest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
)

// release is what scripts/release wrote.
type release struct {
	// dist is the --out directory.
	dist string
	// version is the Go modules' version ("v0.1.0"), plain the VERSION
	// file's ("0.1.0").
	version, plain string
	// work holds what the tests share beside dist (the module cache of
	// their go commands).
	work string
}

var built struct {
	once sync.Once
	rel  *release
	err  error
	dir  string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// theRelease runs scripts/release once per test process and returns what
// it built; the test skips under -short or without the release's tools.
func theRelease(t *testing.T) *release {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a whole release (minutes); not with -short")
	}
	for _, p := range []struct{ program, install string }{
		{"git", "apt-get install -y git"},
		{"npm", "apt-get install -y npm, Node.js >= 20"},
		{"node", "apt-get install -y nodejs, Node.js >= 20"},
		{"python3", "apt-get install -y python3 python3-venv"},
	} {
		retrydtest.NeedProgram(t, p.program, p.install)
	}
	needVenv(t)
	built.once.Do(func() {
		built.rel, built.err = runRelease(&built.dir)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.rel
}

// needVenv skips (or fails) the test when python3 cannot make a virtual
// environment with pip (Debian splits venv and ensurepip off python3).
func needVenv(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("python3", "-c", "import venv, ensurepip").CombinedOutput(); err != nil {
		retrydtest.MissingTool(t, fmt.Sprintf("python3 cannot create a virtual environment with pip (apt-get install -y python3-venv): %s", bytes.TrimSpace(out)))
	}
}

func runRelease(dir *string) (*release, error) {
	root, err := retrydtest.RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return nil, err
	}
	plain := strings.TrimSpace(string(data))
	if *dir, err = os.MkdirTemp("", "releasetest-"); err != nil {
		return nil, err
	}
	rel := &release{dist: filepath.Join(*dir, "dist"), work: *dir, version: "v" + plain, plain: plain}
	start := time.Now()
	cmd := exec.Command(filepath.Join(root, "scripts", "release"), rel.version, "--out", rel.dist)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("scripts/release %s: %v\n%s", rel.version, err, out)
	}
	fmt.Fprintf(os.Stderr, "releasetest: scripts/release %s took %v\n", rel.version, time.Since(start).Round(time.Second))
	return rel, nil
}

// run runs name with args in dir with env added to the test's environment
// and returns its standard output; it fails the test with everything the
// command printed when it fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	t.Logf("%s %s (%v)", name, strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond))
	return stdout.String()
}

// TestChecksums: SHA256SUMS names every file of the release, each with
// its content's digest.
func TestChecksums(t *testing.T) {
	t.Parallel()
	rel := theRelease(t)
	f, err := os.Open(filepath.Join(rel.dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's", sc.Text())
		}
		data, err := os.ReadFile(filepath.Join(rel.dist, name))
		if err != nil {
			t.Errorf("SHA256SUMS names %s: %v", name, err)
			continue
		}
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s", name, got, sum)
		}
		listed[name] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir(rel.dist, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, _ := filepath.Rel(rel.dist, p)
		files = append(files, name)
		if name != "SHA256SUMS" && !listed[name] {
			t.Errorf("SHA256SUMS leaves %s out", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"RELEASE.md", "release-commit.patch",
		"retryd-client-" + rel.plain + ".tgz",
		"retryd-" + rel.plain + ".tar.gz", "retryd-" + rel.plain + "-py3-none-any.whl",
		"retryd-" + rel.plain + ".tgz",
		"retryd-image-" + rel.plain + ".oci.tar",
		"goproxy/github.com/retryd/retryd/clients/go/@v/" + rel.version + ".zip",
	} {
		if !listed[want] {
			t.Errorf("the release has no %s; it has %s", want, strings.Join(files, ", "))
		}
	}
}

// readJSON decodes the JSON file at path into v.
func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
