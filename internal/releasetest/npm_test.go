package releasetest

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/retryd/retryd/internal/retrydtest"
)

// packageJSON is what the test reads of a package.json.
type packageJSON struct {
	Name             string                     `json:"name"`
	Version          string                     `json:"version"`
	Exports          map[string]json.RawMessage `json:"exports"`
	PeerDependencies map[string]string          `json:"peerDependencies"`
}

// TestNPMPackage: a project outside the repository installs the release's
// tarball of @retryd/client (its dependencies from the npm registry),
// imports every subpath the package exports and schedules a retry on a
// live retryd with it.
func TestNPMPackage(t *testing.T) {
	t.Parallel()
	rel := theRelease(t)
	retrydtest.NeedProgram(t, "npm", "apt-get install -y npm, Node.js >= 20")
	node := retrydtest.NeedProgram(t, "node", "apt-get install -y nodejs, Node.js >= 20")
	tarball := filepath.Join(rel.dist, "retryd-client-"+rel.plain+".tgz")
	pkg := tarballPackageJSON(t, tarball)
	if pkg.Name != "@retryd/client" || pkg.Version != rel.plain {
		t.Errorf("the tarball's package is %s@%s, want @retryd/client@%s", pkg.Name, pkg.Version, rel.plain)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name": "agent", "private": true, "type": "module"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The optional peers too, as a user of the ai-sdk and openai subpaths
	// has them, so that every subpath loads.
	args := []string{"install", "--no-audit", "--no-fund", "--loglevel=error", tarball}
	for name, version := range pkg.PeerDependencies {
		args = append(args, name+"@"+version)
	}
	run(t, dir, nil, "npm", args...)

	subpaths := slices.Sorted(func(yield func(string) bool) {
		for k := range pkg.Exports {
			if !yield(k) {
				return
			}
		}
	})
	if !slices.Contains(subpaths, ".") {
		t.Errorf("the package exports %v, no \".\"", subpaths)
	}
	for _, sub := range subpaths {
		spec := "@retryd/client" + strings.TrimPrefix(sub, ".")
		out := run(t, dir, nil, node, "--input-type=module", "-e",
			`const m = await import(process.argv[1]); console.log(Object.keys(m).sort().join(" "));`, spec)
		names := strings.Fields(out)
		if len(names) == 0 {
			t.Errorf("import %q exports nothing", spec)
		}
		if sub == "." && !slices.Contains(names, "RetrydClient") {
			t.Errorf("import %q exports %v, no RetrydClient", spec, names)
		}
	}

	script, err := os.ReadFile(filepath.Join("testdata", "consumer.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "consumer.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := retrydtest.Start(t)
	if out := run(t, dir, nil, node, "consumer.mjs", srv.Addr); strings.TrimSpace(out) != "scheduled retry 1 of 2" {
		t.Errorf("the agent on @retryd/client@%s printed %q, want a scheduled retry 1 of 2", rel.plain, out)
	}
	if events := retrydtest.Verify(t, srv.Conn(t)); len(events) != 1 || events[0].GetScheduled() == nil {
		t.Errorf("the server's event log is %v, want the one scheduled retry", events)
	}
}

// tarballPackageJSON reads package/package.json from an npm tarball.
func tarballPackageJSON(t *testing.T, tarball string) packageJSON {
	t.Helper()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("%s has no package/package.json", tarball)
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name != "package/package.json" {
			continue
		}
		var pkg packageJSON
		if err := json.NewDecoder(tr).Decode(&pkg); err != nil {
			t.Fatalf("%s: package.json: %v", tarball, err)
		}
		return pkg
	}
}
