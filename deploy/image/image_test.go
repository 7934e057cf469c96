package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from the test's directory: %v", err)
	}
	return root
}

// buildStatic builds a main package of the module with CGO_ENABLED=0 into
// the test's temporary directory and returns the binary's path.
func buildStatic(t *testing.T, pkg, out string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), out)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if outp, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build %s: %v\n%s", pkg, err, outp)
	}
	return bin
}

// readLayout re-reads the only image of the OCI layout at dir and returns it
// with its index descriptor.
func readLayout(t *testing.T, dir string) (v1.Image, v1.Descriptor) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("layout.FromPath: %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatalf("ImageIndex: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatalf("IndexManifest: %v", err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("layout has %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatalf("Image(%s): %v", desc.Digest, err)
	}
	return img, desc
}

// layerEntries reads every layer's tar and returns its headers by path
// (relative, without a trailing slash) and regular files' contents.
func layerEntries(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatalf("Layers: %v", err)
	}
	headers := map[string]*tar.Header{}
	contents := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatalf("Uncompressed: %v", err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("tar: %v", err)
			}
			p := strings.TrimSuffix(hdr.Name, "/")
			headers[p] = hdr
			if hdr.Typeflag == tar.TypeReg {
				data, err := io.ReadAll(tr)
				if err != nil {
					t.Fatalf("tar %s: %v", hdr.Name, err)
				}
				contents[p] = data
			}
		}
		rc.Close()
	}
	return headers, contents
}

// checkImage asserts what every retryd image must be: OCI media types, the
// retryd entrypoint and serve command, a non-root user, port 7700, OCI
// labels, the binary in the layer and no shell.
func checkImage(t *testing.T, img v1.Image, retryd []byte) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	mt, err := img.MediaType()
	if err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type = %q, %v; want %q", mt, err, types.OCIManifestSchema1)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatalf("Manifest: %v", err)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type = %q, want %q", m.Config.MediaType, types.OCIConfigJSON)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("layers = %+v, want one %q", m.Layers, types.OCILayer)
	}
	if got := m.Annotations["org.opencontainers.image.title"]; got != "retryd" {
		t.Errorf("manifest annotation title = %q, want retryd", got)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("ConfigFile: %v", err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform = %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/retryd"}) {
		t.Errorf("Entrypoint = %q, want [/usr/local/bin/retryd]", c.Entrypoint)
	}
	if !slices.Equal(c.Cmd, []string{"serve"}) {
		t.Errorf("Cmd = %q, want [serve]", c.Cmd)
	}
	if c.User != "65532:65532" {
		t.Errorf("User = %q, want 65532:65532 (non-root)", c.User)
	}
	if !slices.Contains(c.Env, "RETRYD_LISTEN=0.0.0.0:7700") {
		t.Errorf("Env = %q, want RETRYD_LISTEN=0.0.0.0:7700 so `serve` is reachable from outside the container", c.Env)
	}
	if _, ok := c.ExposedPorts["7700/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("ExposedPorts = %v, want only 7700/tcp", c.ExposedPorts)
	}
	for _, k := range []string{"title", "description", "source", "version", "created"} {
		if c.Labels["org.opencontainers.image."+k] == "" {
			t.Errorf("label org.opencontainers.image.%s missing; labels %v", k, c.Labels)
		}
	}
	if len(cf.RootFS.DiffIDs) != 1 || len(cf.History) != 1 {
		t.Errorf("rootfs has %d diff IDs and %d history entries, want 1 and 1", len(cf.RootFS.DiffIDs), len(cf.History))
	}

	headers, contents := layerEntries(t, img)
	bin, ok := headers["usr/local/bin/retryd"]
	if !ok {
		t.Fatalf("layer has no usr/local/bin/retryd; entries %v", keys(headers))
	}
	if bin.Typeflag != tar.TypeReg || bin.Mode&0o111 == 0 || bin.Uid != 0 {
		t.Errorf("usr/local/bin/retryd: type %c mode %o uid %d; want a root-owned executable", bin.Typeflag, bin.Mode, bin.Uid)
	}
	if !bytes.Equal(contents["usr/local/bin/retryd"], retryd) {
		t.Errorf("usr/local/bin/retryd differs from the binary given (%d bytes, want %d)", len(contents["usr/local/bin/retryd"]), len(retryd))
	}
	for _, shell := range []string{"bin/sh", "bin/bash", "bin/busybox", "usr/bin/sh", "bin"} {
		if _, ok := headers[shell]; ok {
			t.Errorf("layer contains %s; the image must have no shell", shell)
		}
	}
	if tmp := headers["tmp"]; tmp == nil || tmp.Typeflag != tar.TypeDir || tmp.Mode != 0o1777 {
		t.Errorf("tmp = %+v, want a directory with mode 1777", tmp)
	}
	if !strings.Contains(string(contents["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("etc/passwd lacks the nonroot user: %q", contents["etc/passwd"])
	}
	return headers, contents
}

func keys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestRetrydImage is the acceptance test of the daemonless build: the real
// static retryd binary, built into an OCI layout and read back.
func TestRetrydImage(t *testing.T) {
	t.Parallel()
	retrydBin := buildStatic(t, "./cmd/retryd", "retryd")
	healthBin := buildStatic(t, "./deploy/healthcheck", "retryd-healthcheck")
	out := filepath.Join(t.TempDir(), "oci")
	var stdout, stderr bytes.Buffer
	args := []string{
		"-binary", retrydBin, "-healthcheck", healthBin, "-out", out,
		"-tag", "ghcr.io/retryd/retryd:0.1.0", "-revision", "0123abc",
	}
	version := repoVersion(t)
	if err := run(args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("run %q: %v\n%s", args, err, stderr.String())
	}

	retryd, err := os.ReadFile(retrydBin)
	if err != nil {
		t.Fatal(err)
	}
	img, desc := readLayout(t, out)
	headers, contents := checkImage(t, img, retryd)
	// The binary in the image reports the VERSION file's version.
	inImage := filepath.Join(t.TempDir(), "retryd-from-image")
	if err := os.WriteFile(inImage, contents["usr/local/bin/retryd"], 0o755); err != nil {
		t.Fatal(err)
	}
	if got := runVersion(t, inImage); got != "retryd "+version {
		t.Errorf("the image's retryd version printed %q, want %q (the VERSION file)", got, "retryd "+version)
	}
	if _, ok := headers["usr/local/bin/retryd-healthcheck"]; !ok {
		t.Errorf("layer has no usr/local/bin/retryd-healthcheck (the helm test's client)")
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != "0.1.0" {
		t.Errorf("index ref.name = %q, want 0.1.0", got)
	}
	if got := desc.Annotations["io.containerd.image.name"]; got != "ghcr.io/retryd/retryd:0.1.0" {
		t.Errorf("index io.containerd.image.name = %q", got)
	}
	if desc.ArtifactType != "" || desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("index descriptor: artifactType %q mediaType %q, want a plain OCI image manifest", desc.ArtifactType, desc.MediaType)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != runtime.GOARCH {
		t.Errorf("index platform = %+v, want linux/%s", desc.Platform, runtime.GOARCH)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cf.Config.Labels["org.opencontainers.image.revision"]; got != "0123abc" {
		t.Errorf("revision label = %q, want 0123abc", got)
	}
	if got := cf.Config.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("version label = %q, want %q (the VERSION file)", got, version)
	}
}

// TestBuildWithoutRetryd checks the builder itself with a static binary that
// always compiles (the health check), so a broken cmd/retryd does not hide a
// broken image builder.
func TestBuildWithoutRetryd(t *testing.T) {
	t.Parallel()
	bin := buildStatic(t, "./deploy/healthcheck", "stand-in")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("layout", func(t *testing.T) {
		t.Parallel()
		out := filepath.Join(t.TempDir(), "oci")
		args := []string{"-binary", bin, "-ca-bundle", ca, "-out", out, "-tag", "registry.example.test/retryd:v9"}
		for range 2 { // the second run replaces the first layout
			if err := run(args, func(string) string { return "1700000000" }, io.Discard, io.Discard); err != nil {
				t.Fatalf("run: %v", err)
			}
		}
		img, _ := readLayout(t, out)
		headers, contents := checkImage(t, img, data)
		if _, ok := contents["etc/ssl/certs/ca-certificates.crt"]; !ok {
			t.Errorf("CA bundle missing")
		}
		if _, ok := headers["usr/local/bin/retryd-healthcheck"]; ok {
			t.Errorf("healthcheck present though -healthcheck was not given")
		}
		want := time.Unix(1700000000, 0).UTC()
		for p, h := range headers {
			if !h.ModTime.Equal(want) {
				t.Errorf("%s mtime %v, want SOURCE_DATE_EPOCH %v", p, h.ModTime, want)
			}
		}
	})

	t.Run("reproducible", func(t *testing.T) {
		t.Parallel()
		opts := options{binary: bin, out: t.TempDir(), tag: name.MustParseReference("retryd:1").(name.Tag), version: "1", source: defaultSource}
		a, err := build(opts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := build(opts)
		if err != nil {
			t.Fatal(err)
		}
		da, _ := a.Digest()
		db, _ := b.Digest()
		if da != db {
			t.Errorf("two builds of the same input differ: %s and %s", da, db)
		}
	})

	t.Run("refuses", func(t *testing.T) {
		t.Parallel()
		notLayout := t.TempDir()
		if err := os.WriteFile(filepath.Join(notLayout, "keep.txt"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		notELF := filepath.Join(t.TempDir(), "script")
		if err := os.WriteFile(notELF, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			args []string
			want string
		}{
			{"no binary", []string{"-out", t.TempDir()}, "-binary and -out are required"},
			{"not ELF", []string{"-binary", notELF, "-out", t.TempDir()}, "not an ELF executable"},
			{"bad tag", []string{"-binary", bin, "-out", t.TempDir(), "-tag", "UPPER/case:x"}, "-tag"},
			{"bad created", []string{"-binary", bin, "-out", t.TempDir(), "-created", "yesterday"}, "-created"},
			{"foreign dir", []string{"-binary", bin, "-out", notLayout}, "not an OCI layout"},
		}
		if sh, err := exec.LookPath("sh"); err == nil {
			if _, _, err := readStaticBinary(sh); err != nil && strings.Contains(err.Error(), "dynamically linked") {
				cases = append(cases, struct {
					name string
					args []string
					want string
				}{"dynamic", []string{"-binary", sh, "-out", t.TempDir()}, "CGO_ENABLED=0"})
			}
		}
		for _, tc := range cases {
			err := run(tc.args, func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: run(%q) = %v, want an error containing %q", tc.name, tc.args, err, tc.want)
			}
		}
		if _, err := os.Stat(filepath.Join(notLayout, "keep.txt")); err != nil {
			t.Errorf("a refused -out lost its files: %v", err)
		}
	})
}

// repoVersion is the VERSION file at the repository root.
func repoVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// runVersion runs `bin version` and returns its output's one line.
func runVersion(t *testing.T, bin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		t.Fatalf("%s version: %v", bin, err)
	}
	return strings.TrimSpace(string(out))
}

// TestDockerfileVersion runs the Dockerfile's build of retryd as BuildKit
// would (its RUN line, with the build stage's arguments), with no engine,
// and checks that the binary reports the VERSION file's version; and that
// the stage refuses a VERSION argument naming another.
func TestDockerfileVersion(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Instructions, with continuation lines joined and comments dropped.
	var runs []string
	var cur strings.Builder
	for line := range strings.SplitSeq(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if body, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(body)
			continue
		}
		cur.WriteString(line)
		if instr := strings.TrimSpace(cur.String()); strings.HasPrefix(instr, "RUN ") {
			runs = append(runs, strings.TrimPrefix(instr, "RUN "))
		}
		cur.Reset()
	}
	var check, build string
	for _, r := range runs {
		switch {
		case strings.Contains(r, "./cmd/retryd"):
			build = r
		case strings.Contains(r, "cat VERSION"):
			check = r
		}
	}
	if build == "" || check == "" {
		t.Fatalf("the Dockerfile has no RUN building ./cmd/retryd, or none checking VERSION; RUN lines:\n%s", strings.Join(runs, "\n"))
	}
	// BuildKit's cache mounts are options of RUN, not shell words.
	for strings.HasPrefix(build, "--mount=") {
		_, build, _ = strings.Cut(build, " ")
		build = strings.TrimSpace(build)
	}
	out := t.TempDir()
	build = strings.ReplaceAll(build, "/out/", out+"/")
	sh := func(script string, env ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", "-c", script)
		cmd.WaitDelay = 10 * time.Second // the go command under a killed sh must not hold the output open
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		return cmd.CombinedOutput()
	}
	version := repoVersion(t)
	if outp, err := sh(check, "VERSION="+version); err != nil {
		t.Errorf("the VERSION check refuses the VERSION file's own version: %v\n%s", err, outp)
	}
	if outp, err := sh(check, "VERSION=9.9.9"); err == nil || !strings.Contains(string(outp), "9.9.9") {
		t.Errorf("the VERSION check accepted --build-arg VERSION=9.9.9: %v\n%s", err, outp)
	}
	if outp, err := sh(build, "TARGETOS=linux", "TARGETARCH="+runtime.GOARCH, "VERSION="+version); err != nil {
		t.Fatalf("the Dockerfile's build: %v\n%s", err, outp)
	}
	if got := runVersion(t, filepath.Join(out, "retryd")); got != "retryd "+version {
		t.Errorf("the Dockerfile's retryd version printed %q, want %q (the VERSION file)", got, "retryd "+version)
	}
}
