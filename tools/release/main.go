// Command release turns a copy of the repository into the release of its Go
// modules at one version: it rewrites every module's go.mod so that the
// repository's modules require each other at that version with no replace
// directive, adds their checksums to each go.sum, and writes each module's
// zip, go.mod and info as a GOPROXY directory. scripts/release runs it on a
// clean copy of a commit, never on a working tree.
//
//	go run -C tools/release . -src /tmp/copy -version v0.1.0 -proxy dist/goproxy
//
// Modules are released in dependency order (a module's zip holds its go.sum,
// which names the checksums of the zips of the modules it requires); the
// modules under tools/ pin executables and are not released. The command
// prints one line per released module, in that order: its directory, its
// module path, its tag and its zip's checksum, separated by tabs.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// repoModule is one Go module of the repository.
type repoModule struct {
	dir  string // relative to the repository root, "." for the root
	path string // module path
	file *modfile.File
}

// tag is the git tag that releases the module at version: a nested
// module's tag has its directory as a prefix.
func (m *repoModule) tag(version string) string {
	if m.dir == "." {
		return version
	}
	return m.dir + "/" + version
}

func run(args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("release", flag.ContinueOnError)
	src := fset.String("src", "", "`directory` of the repository copy to release (its go.mod and go.sum files are rewritten)")
	version := fset.String("version", "", "the release `version`, vX.Y.Z")
	proxy := fset.String("proxy", "", "GOPROXY `directory` to write the modules into")
	created := fset.String("time", "", "the release's time for the .info files, RFC 3339 (default: now)")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if *src == "" || *proxy == "" {
		return errors.New("-src and -proxy are required")
	}
	if !semver.IsValid(*version) || semver.Build(*version) != "" || semver.Canonical(*version) != *version {
		return fmt.Errorf("-version %q is not a canonical semantic version (vX.Y.Z or vX.Y.Z-pre)", *version)
	}
	when := time.Now().UTC()
	if *created != "" {
		t, err := time.Parse(time.RFC3339, *created)
		if err != nil {
			return fmt.Errorf("-time: %w", err)
		}
		when = t.UTC()
	}
	mods, err := findModules(*src)
	if err != nil {
		return err
	}
	order, err := dependencyOrder(mods)
	if err != nil {
		return err
	}
	r := &releaser{src: *src, version: *version, proxy: *proxy, time: when, mods: mods,
		zipSums: map[string]string{}, modSums: map[string]string{}}
	for _, m := range order {
		sum, err := r.release(m)
		if err != nil {
			return fmt.Errorf("%s: %w", m.path, err)
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s\t%s\n", m.dir, m.path, m.tag(*version), sum)
	}
	return nil
}

// findModules returns the repository's modules by path: every go.mod under
// src but those under tools/ (and under directories Go ignores).
func findModules(src string) (map[string]*repoModule, error) {
	mods := map[string]*repoModule{}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel == "tools" || name == "node_modules" || name == "testdata" || name == "vendor" ||
				(rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(p, data, nil)
		if err != nil {
			return err
		}
		if f.Module == nil {
			return fmt.Errorf("%s has no module directive", p)
		}
		m := &repoModule{dir: path.Dir(rel), path: f.Module.Mod.Path, file: f}
		if other, ok := mods[m.path]; ok {
			return fmt.Errorf("module %s is both %s and %s", m.path, other.dir, m.dir)
		}
		mods[m.path] = m
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("no go.mod under %s", src)
	}
	return mods, nil
}

// dependencyOrder sorts the modules so that each comes after every module
// of the repository it requires; modules with nothing between them keep
// the order of their directories.
func dependencyOrder(mods map[string]*repoModule) ([]*repoModule, error) {
	var all []*repoModule
	for _, m := range mods {
		all = append(all, m)
	}
	slices.SortFunc(all, func(a, b *repoModule) int { return strings.Compare(a.dir, b.dir) })
	done := map[string]bool{}
	var order []*repoModule
	for len(order) < len(all) {
		progress := false
		for _, m := range all {
			if done[m.path] {
				continue
			}
			ready := true
			for _, r := range m.file.Require {
				if mods[r.Mod.Path] != nil && !done[r.Mod.Path] {
					ready = false
				}
			}
			if ready {
				done[m.path] = true
				order = append(order, m)
				progress = true
				break
			}
		}
		if !progress {
			var left []string
			for _, m := range all {
				if !done[m.path] {
					left = append(left, m.path)
				}
			}
			return nil, fmt.Errorf("the modules %s require each other in a cycle", strings.Join(left, ", "))
		}
	}
	return order, nil
}

// releaser releases the modules one at a time, remembering the checksums
// of what it released for the go.sum files of the modules that follow.
type releaser struct {
	src, version, proxy string
	time                time.Time
	mods                map[string]*repoModule
	zipSums, modSums    map[string]string // by module path: "h1:…"
}

// release rewrites m's go.mod and go.sum for the release and writes its
// files into the proxy directory; it returns the zip's checksum.
func (r *releaser) release(m *repoModule) (string, error) {
	dir := filepath.Join(r.src, filepath.FromSlash(m.dir))
	f := m.file
	for _, req := range f.Require {
		if r.mods[req.Mod.Path] != nil {
			if err := f.AddRequire(req.Mod.Path, r.version); err != nil {
				return "", err
			}
		}
	}
	for _, rep := range slices.Clone(f.Replace) {
		if r.mods[rep.Old.Path] != nil {
			if err := f.DropReplace(rep.Old.Path, rep.Old.Version); err != nil {
				return "", err
			}
			continue
		}
		if modfile.IsDirectoryPath(rep.New.Path) {
			return "", fmt.Errorf("go.mod replaces %s with the directory %s, which no one outside the repository has", rep.Old.Path, rep.New.Path)
		}
	}
	f.Cleanup()
	gomod, err := f.Format()
	if err != nil {
		return "", err
	}
	// The released go.mod must resolve outside the repository: no
	// placeholder versions of the repository's modules.
	for _, req := range f.Require {
		if r.mods[req.Mod.Path] != nil && req.Mod.Version != r.version {
			return "", fmt.Errorf("go.mod still requires %s at %s", req.Mod.Path, req.Mod.Version)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), gomod, 0o644); err != nil {
		return "", err
	}
	if err := r.writeGoSum(m, dir); err != nil {
		return "", err
	}

	mv := module.Version{Path: m.path, Version: r.version}
	escaped, err := module.EscapePath(m.path)
	if err != nil {
		return "", err
	}
	at := filepath.Join(r.proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return "", err
	}
	zipPath := filepath.Join(at, r.version+".zip")
	zf, err := os.Create(zipPath)
	if err != nil {
		return "", err
	}
	if err := modzip.CreateFromDir(zf, mv, dir); err != nil {
		zf.Close()
		return "", fmt.Errorf("zip: %w", err)
	}
	if err := zf.Close(); err != nil {
		return "", err
	}
	zipSum, err := dirhash.HashZip(zipPath, dirhash.Hash1)
	if err != nil {
		return "", err
	}
	modSum, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	if err != nil {
		return "", err
	}
	r.zipSums[m.path], r.modSums[m.path] = zipSum, modSum

	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{r.version, r.time})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{
		r.version + ".mod":  gomod,
		r.version + ".info": append(info, '\n'),
		"list":              []byte(r.version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return zipSum, nil
}

// writeGoSum replaces the lines of the repository's modules in m's go.sum
// with their released checksums: the zip's and the go.mod's of each module
// m requires, and the go.mod's of each one those require in turn (the
// module graph Go loads), all released before m.
func (r *releaser) writeGoSum(m *repoModule, dir string) error {
	sumPath := filepath.Join(dir, "go.sum")
	old, err := os.ReadFile(sumPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	lines := map[string]bool{}
	for _, line := range strings.Split(string(old), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || r.mods[fields[0]] != nil {
			continue
		}
		lines[line] = true
	}
	direct := map[string]bool{}
	for _, req := range m.file.Require {
		if r.mods[req.Mod.Path] != nil {
			direct[req.Mod.Path] = true
		}
	}
	seen := map[string]bool{}
	var visit func(p string) error
	visit = func(p string) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		if r.modSums[p] == "" {
			return fmt.Errorf("requires %s, which is not released before it", p)
		}
		lines[fmt.Sprintf("%s %s/go.mod %s", p, r.version, r.modSums[p])] = true
		for _, req := range r.mods[p].file.Require {
			if r.mods[req.Mod.Path] != nil {
				if err := visit(req.Mod.Path); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for p := range direct {
		if err := visit(p); err != nil {
			return err
		}
		lines[fmt.Sprintf("%s %s %s", p, r.version, r.zipSums[p])] = true
	}
	if len(lines) == 0 {
		return nil
	}
	sorted := make([]string, 0, len(lines))
	for line := range lines {
		sorted = append(sorted, line)
	}
	slices.SortFunc(sorted, compareSumLines)
	return os.WriteFile(sumPath, []byte(strings.Join(sorted, "\n")+"\n"), 0o644)
}

// compareSumLines orders go.sum lines as go mod tidy writes them: by module
// path, then by version, a version's go.mod line after its zip line.
func compareSumLines(a, b string) int {
	fa, fb := strings.Fields(a), strings.Fields(b)
	if c := strings.Compare(fa[0], fb[0]); c != 0 {
		return c
	}
	va, ma := strings.CutSuffix(fa[1], "/go.mod")
	vb, mb := strings.CutSuffix(fb[1], "/go.mod")
	if c := semver.Compare(va, vb); c != 0 {
		return c
	}
	if c := strings.Compare(va, vb); c != 0 {
		return c
	}
	switch {
	case ma == mb:
		return strings.Compare(a, b)
	case ma:
		return 1
	default:
		return -1
	}
}
