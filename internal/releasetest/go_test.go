package releasetest

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/retryd/retryd/internal/retrydtest"
)

// ownModule matches the module paths of the repository.
var ownModule = regexp.MustCompile(`^github\.com/retryd/retryd(/|$)`)

var machineGo struct {
	once sync.Once
	env  struct{ GOPROXY, GOMODCACHE, GOFLAGS string }
	err  error
}

// goEnv is the environment of a go command run as a user of the release
// would: the repository's modules come from the release's GOPROXY
// directory, everything else as on this machine. The module cache is the
// test process's own, so that the release's modules never land in the
// machine's cache, where a later release of the same version with other
// contents would be shadowed by them; it reads the machine's cache as a
// proxy, so nothing this machine has already is downloaded again. Go has
// no checksum of modules nobody published, so GONOSUMDB names them.
// -trimpath (and CGO_ENABLED=0, as the image's build) lets the build cache
// serve the packages scripts/release compiled, although the module cache
// is another directory.
func goEnv(t *testing.T, rel *release) []string {
	t.Helper()
	machineGo.once.Do(func() {
		out, err := exec.Command("go", "env", "-json", "GOPROXY", "GOMODCACHE", "GOFLAGS").Output()
		if err != nil {
			machineGo.err = err
			return
		}
		machineGo.err = json.Unmarshal(out, &machineGo.env)
	})
	if machineGo.err != nil {
		t.Fatalf("go env: %v", machineGo.err)
	}
	m := machineGo.env
	proxy := "file://" + filepath.Join(rel.dist, "goproxy") + ",file://" + filepath.Join(m.GOMODCACHE, "cache", "download")
	if m.GOPROXY != "" {
		proxy += "," + m.GOPROXY
	}
	return []string{
		"GOPROXY=" + proxy,
		"GOMODCACHE=" + filepath.Join(rel.work, "gomodcache"),
		"GOFLAGS=" + strings.TrimSpace(m.GOFLAGS+" -modcacherw -trimpath"),
		"CGO_ENABLED=0",
		"GONOSUMDB=github.com/retryd/retryd",
		"GOPRIVATE=", "GONOPROXY=", "GOWORK=off",
	}
}

// TestGoGetClient: a module outside the repository requires the Go client
// at the release's version with go get, and the program it builds
// schedules a retry on a live retryd.
func TestGoGetClient(t *testing.T) {
	t.Parallel()
	rel := theRelease(t)
	env := goEnv(t, rel)
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "consumer", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/agent\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, env, "go", "get", "github.com/retryd/retryd/clients/go@"+rel.version)
	run(t, dir, env, "go", "mod", "tidy")
	// Every module of the repository in the agent's build list is the
	// release's, resolved from clients/go's released go.mod.
	mods := run(t, dir, env, "go", "list", "-m", "all")
	own := 0
	for _, line := range strings.Split(mods, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !ownModule.MatchString(f[0]) {
			continue
		}
		own++
		if f[1] != rel.version || len(f) > 2 {
			t.Errorf("go list -m all: %s, want %s at %s with no replacement", line, f[0], rel.version)
		}
	}
	if own < 2 {
		t.Errorf("go list -m all lists %d of the repository's modules, want clients/go and gen at least:\n%s", own, mods)
	}
	run(t, dir, env, "go", "mod", "verify")
	bin := filepath.Join(dir, "agent")
	run(t, dir, env, "go", "build", "-o", bin, ".")

	srv := retrydtest.Start(t)
	out := run(t, dir, nil, bin, srv.Addr)
	if !strings.HasPrefix(out, "scheduled retry 1 of 2, id ") {
		t.Errorf("the agent built against clients/go@%s printed %q, want a scheduled retry 1 of 2", rel.version, out)
	}
	if events := retrydtest.Verify(t, srv.Conn(t)); len(events) != 1 || events[0].GetScheduled() == nil {
		t.Errorf("the server's event log is %v, want the one scheduled retry", events)
	}
}

// TestGoInstallServer: go install of the server at the release's version
// (which go refuses for a go.mod with replace directives) builds a retryd
// that reports that version.
func TestGoInstallServer(t *testing.T) {
	t.Parallel()
	rel := theRelease(t)
	gobin := t.TempDir()
	env := append(goEnv(t, rel), "GOBIN="+gobin)
	run(t, t.TempDir(), env, "go", "install", "github.com/retryd/retryd/cmd/retryd@"+rel.version)
	bin := filepath.Join(gobin, "retryd")
	if out := run(t, gobin, nil, bin, "version"); strings.TrimSpace(out) != "retryd "+rel.plain {
		t.Errorf("retryd version printed %q, want %q", out, "retryd "+rel.plain)
	}
	info := run(t, gobin, nil, "go", "version", "-m", bin)
	for _, want := range []string{
		"\tmod\tgithub.com/retryd/retryd\t" + rel.version + "\t",
		"\tdep\tgithub.com/retryd/retryd/clients/go\t" + rel.version + "\t",
		"\tdep\tgithub.com/retryd/retryd/gen\t" + rel.version + "\t",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("go version -m %s has no line %q:\n%s", bin, strings.TrimSpace(want), info)
		}
	}
	if strings.Contains(info, "=>") {
		t.Errorf("go version -m %s shows a replaced module:\n%s", bin, info)
	}
	// The installed binary serves.
	srv := startServing(t, bin)
	out := run(t, gobin, nil, bin, "verify", "--server", srv)
	if !strings.Contains(out, "0 violations") {
		t.Errorf("retryd verify against the installed retryd printed %q, want 0 violations", out)
	}
}

// startServing runs bin serve on a free loopback port until the test
// ends and returns its address, read from its "serving" log line.
func startServing(t *testing.T, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	dec := json.NewDecoder(stderr)
	for {
		var line struct{ Msg, Addr string }
		if err := dec.Decode(&line); err != nil {
			t.Fatalf("%s serve ended before it served: %v", bin, err)
		}
		if line.Msg == "serving" {
			go io.Copy(io.Discard, stderr)
			return line.Addr
		}
	}
}

// TestReleasedGoModules: each released go.mod requires the repository's
// modules at the release's version with no replace directive, each zip
// holds its go.mod, and the checksums a released go.sum names for the
// repository's modules are those go computes for the release's zips.
func TestReleasedGoModules(t *testing.T) {
	t.Parallel()
	rel := theRelease(t)
	env := goEnv(t, rel)
	proxy := filepath.Join(rel.dist, "goproxy")
	var modules []string
	err := filepath.Walk(proxy, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Name() == "list" {
			mod, _ := filepath.Rel(proxy, filepath.Dir(filepath.Dir(p)))
			modules = append(modules, filepath.ToSlash(mod))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"github.com/retryd/retryd", "github.com/retryd/retryd/clients/go", "github.com/retryd/retryd/gen",
		"github.com/retryd/retryd/policy", "github.com/retryd/retryd/invariant", "github.com/retryd/retryd/internal/retrydtest"} {
		if !strings.Contains(" "+strings.Join(modules, " ")+" ", " "+want+" ") {
			t.Errorf("the release's GOPROXY has no %s; it has %v", want, modules)
		}
	}
	for _, mod := range modules {
		if strings.Contains(mod, "/tools/") {
			t.Errorf("the release holds %s; the tools modules pin executables and are not released", mod)
		}
	}

	// The checksums go computes, from a module that downloads them all.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/sums\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"mod", "download", "-json"}
	for _, mod := range modules {
		args = append(args, mod+"@"+rel.version)
	}
	sums := map[string]string{} // "path version" or "path version/go.mod" → h1
	dec := json.NewDecoder(strings.NewReader(run(t, dir, env, "go", args...)))
	for dec.More() {
		var d struct{ Path, Version, Sum, GoModSum, Zip, GoMod, Error string }
		if err := dec.Decode(&d); err != nil {
			t.Fatal(err)
		}
		if d.Error != "" {
			t.Fatalf("go mod download %s: %s", d.Path, d.Error)
		}
		sums[d.Path+" "+d.Version] = d.Sum
		sums[d.Path+" "+d.Version+"/go.mod"] = d.GoModSum
		checkReleasedModule(t, rel, d.Path, d.Zip, d.GoMod)
	}
	// Every module's go.sum, now that every checksum is known.
	for _, mod := range modules {
		zipFile := filepath.Join(proxy, filepath.FromSlash(mod), "@v", rel.version+".zip")
		goSum := zipEntry(t, zipFile, mod+"@"+rel.version+"/go.sum")
		for _, line := range strings.Split(goSum, "\n") {
			f := strings.Fields(line)
			if len(f) != 3 || !ownModule.MatchString(f[0]) {
				continue
			}
			if want, ok := sums[f[0]+" "+f[1]]; !ok || want != f[2] {
				t.Errorf("%s's go.sum: %s; go computes %q", mod, line, want)
			}
		}
	}
}

// checkReleasedModule checks one released module's go.mod: the .mod file
// go downloaded is the zip's, and it names the repository's modules at the
// release's version without replacing them.
func checkReleasedModule(t *testing.T, rel *release, path, zipFile, goModFile string) {
	t.Helper()
	goMod, err := os.ReadFile(goModFile)
	if err != nil {
		t.Fatal(err)
	}
	if inZip := zipEntry(t, zipFile, path+"@"+rel.version+"/go.mod"); inZip != string(goMod) {
		t.Errorf("%s: the zip's go.mod differs from the .mod file", path)
	}
	for _, line := range strings.Split(string(goMod), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "require" {
			f = f[1:]
		}
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "replace") || strings.Contains(line, "=>"):
			t.Errorf("%s's released go.mod replaces a module: %q", path, line)
		case len(f) >= 2 && ownModule.MatchString(f[0]) && f[1] != rel.version:
			t.Errorf("%s's released go.mod requires %s at %s, want %s", path, f[0], f[1], rel.version)
		}
	}
}

// zipEntry returns the content of the file name in the zip file.
func zipEntry(t *testing.T, zipFile, name string) string {
	t.Helper()
	zr, err := zip.OpenReader(zipFile)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	f, err := zr.Open(name)
	if err != nil {
		t.Fatalf("%s: %v", zipFile, err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, f); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
