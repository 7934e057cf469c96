// Command image builds retryd's container image without a container engine
// and writes it as an OCI image layout (a directory that skopeo, crane,
// oras, podman and containerd can read).
//
// The image is one layer on an empty base: the static retryd binary at
// /usr/local/bin/retryd, optionally /usr/local/bin/retryd-healthcheck (the
// helm test's gRPC health client, from deploy/healthcheck) and a CA bundle,
// plus /etc/passwd and /etc/group naming the nonroot user 65532, and an empty
// world-writable /tmp. There is no shell and no libc: the binaries must be
// statically linked (CGO_ENABLED=0), which the command checks.
//
//	CGO_ENABLED=0 go build -trimpath -o bin/retryd ./cmd/retryd
//	CGO_ENABLED=0 go build -trimpath -o bin/retryd-healthcheck ./deploy/healthcheck
//	go build -C deploy/image -o ../../bin/retryd-image .
//	bin/retryd-image -binary bin/retryd -healthcheck bin/retryd-healthcheck \
//	    -out dist/oci -tag "ghcr.io/retryd/retryd:$(cat VERSION)"
//	skopeo copy "oci:dist/oci:$(cat VERSION)" "docker://ghcr.io/retryd/retryd:$(cat VERSION)"
//
// The binary reports the VERSION file's version (compiled in, package
// retryd); the image's version label is the same file's, found above the
// working directory, unless -version says otherwise.
//
// The build is reproducible: every timestamp is -created, which defaults to
// $SOURCE_DATE_EPOCH or, without it, the Unix epoch.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths and identity inside the image.
const (
	binaryPath      = "/usr/local/bin/retryd"
	healthcheckPath = "/usr/local/bin/retryd-healthcheck"
	caBundlePath    = "/etc/ssl/certs/ca-certificates.crt"
	nonrootUID      = 65532
	grpcPort        = "7700/tcp"
	defaultSource   = "https://github.com/retryd/retryd"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "image:", err)
		}
		os.Exit(2)
	}
}

// options is everything one image build needs.
type options struct {
	binary      string    // path of the static retryd binary
	healthcheck string    // path of the static retryd-healthcheck binary, or ""
	caBundle    string    // path of a PEM CA bundle, or ""
	out         string    // OCI layout directory
	tag         name.Tag  // reference the layout names the image by
	version     string    // org.opencontainers.image.version
	revision    string    // org.opencontainers.image.revision, or ""
	source      string    // org.opencontainers.image.source
	created     time.Time // every timestamp of the image
}

// run parses flags, builds the image and writes the layout.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts options
	fs.StringVar(&opts.binary, "binary", "", "`path` of the static retryd binary (required)")
	fs.StringVar(&opts.healthcheck, "healthcheck", "", "`path` of the static retryd-healthcheck binary (optional)")
	fs.StringVar(&opts.caBundle, "ca-bundle", "", "`path` of a PEM CA bundle installed at "+caBundlePath+" (optional)")
	fs.StringVar(&opts.out, "out", "", "OCI image layout `directory` to write; an existing layout there is replaced (required)")
	tag := fs.String("tag", "ghcr.io/retryd/retryd:dev", "image `reference` (repository:tag) recorded in the layout")
	fs.StringVar(&opts.version, "version", "", "org.opencontainers.image.version label; default the VERSION file of the repository around the working directory")
	fs.StringVar(&opts.revision, "revision", "", "org.opencontainers.image.revision label (VCS commit)")
	fs.StringVar(&opts.source, "source", defaultSource, "org.opencontainers.image.source label")
	created := fs.String("created", "", "creation time (RFC 3339) of the image; default $SOURCE_DATE_EPOCH or the Unix epoch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if opts.binary == "" || opts.out == "" {
		return errors.New("-binary and -out are required")
	}
	t, err := name.NewTag(*tag, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", *tag, err)
	}
	opts.tag = t
	if opts.version == "" {
		if opts.version, err = versionFile(); err != nil {
			return err
		}
	}
	opts.created, err = creationTime(*created, getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		return err
	}

	img, err := build(opts)
	if err != nil {
		return err
	}
	if err := writeLayout(opts.out, img, opts.tag); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image digest: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s (%s) to %s\n", opts.tag, digest, opts.out)
	return nil
}

// versionFile reads the VERSION file of the repository the working
// directory is in (the directory holding go.mod and VERSION, or one
// above it).
func versionFile() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "VERSION"))
		if err == nil {
			if v := strings.TrimSpace(string(data)); v != "" {
				return v, nil
			}
			return "", fmt.Errorf("%s is empty", filepath.Join(dir, "VERSION"))
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no VERSION file above the working directory; run from the repository or give -version")
		}
		dir = parent
	}
}

// creationTime is the -created flag, else SOURCE_DATE_EPOCH, else the epoch.
func creationTime(flagValue, sourceDateEpoch string) (time.Time, error) {
	switch {
	case flagValue != "":
		t, err := time.Parse(time.RFC3339, flagValue)
		if err != nil {
			return time.Time{}, fmt.Errorf("-created %q: %w", flagValue, err)
		}
		return t.UTC(), nil
	case sourceDateEpoch != "":
		sec, err := strconv.ParseInt(sourceDateEpoch, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", sourceDateEpoch, err)
		}
		return time.Unix(sec, 0).UTC(), nil
	default:
		return time.Unix(0, 0).UTC(), nil
	}
}

// build assembles the image: an empty base, one layer, the runtime config.
func build(opts options) (v1.Image, error) {
	retryd, arch, err := readStaticBinary(opts.binary)
	if err != nil {
		return nil, err
	}
	files := []file{
		{path: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{path: "/home/nonroot/", mode: 0o700, owner: nonrootUID},
		{path: "/tmp/", mode: 0o777 | os.ModeSticky},
		{path: binaryPath, mode: 0o755, data: retryd},
	}
	if opts.healthcheck != "" {
		hc, hcArch, err := readStaticBinary(opts.healthcheck)
		if err != nil {
			return nil, err
		}
		if hcArch != arch {
			return nil, fmt.Errorf("%s is %s but %s is %s", opts.healthcheck, hcArch, opts.binary, arch)
		}
		files = append(files, file{path: healthcheckPath, mode: 0o755, data: hc})
	}
	if opts.caBundle != "" {
		pem, err := os.ReadFile(opts.caBundle)
		if err != nil {
			return nil, fmt.Errorf("-ca-bundle: %w", err)
		}
		files = append(files, file{path: caBundlePath, mode: 0o644, data: pem})
	}

	layerTar, err := tarFiles(files, opts.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("tarball.LayerFromOpener: %w", err)
	}

	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Author:    "retryd deploy/image",
			Created:   v1.Time{Time: opts.created},
			CreatedBy: "go run ./deploy/image: static retryd binary on an empty base",
			Comment:   "no shell, no libc",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mutate.Append: %w", err)
	}

	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	labels := ociLabels(opts)
	cfg.Architecture = arch
	cfg.OS = "linux"
	cfg.Created = v1.Time{Time: opts.created}
	cfg.Author = "retryd maintainers"
	cfg.Config = v1.Config{
		Entrypoint: []string{binaryPath},
		Cmd:        []string{"serve"},
		User:       fmt.Sprintf("%d:%d", nonrootUID, nonrootUID),
		WorkingDir: "/",
		// Listen on every interface in a container (the binary's default
		// is loopback only); a --listen flag, as the Helm chart passes, wins.
		Env:          []string{"PATH=/usr/local/bin", "RETRYD_LISTEN=0.0.0.0:7700"},
		ExposedPorts: map[string]struct{}{grpcPort: {}},
		Labels:       labels,
		StopSignal:   "SIGTERM",
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("mutate.ConfigFile: %w", err)
	}
	annotated, ok := mutate.Annotations(img, labels).(v1.Image)
	if !ok {
		return nil, errors.New("mutate.Annotations did not return an image")
	}
	return annotated, nil
}

// ociLabels are the org.opencontainers.image.* labels (and manifest
// annotations) of the image.
func ociLabels(opts options) map[string]string {
	labels := map[string]string{
		"org.opencontainers.image.title":       "retryd",
		"org.opencontainers.image.description": "gRPC retry-decision service for LLM agent fleets",
		"org.opencontainers.image.source":      opts.source,
		"org.opencontainers.image.url":         opts.source,
		"org.opencontainers.image.version":     opts.version,
		"org.opencontainers.image.created":     opts.created.Format(time.RFC3339),
		"org.opencontainers.image.vendor":      "retryd",
	}
	if opts.revision != "" {
		labels["org.opencontainers.image.revision"] = opts.revision
	}
	return labels
}

// readStaticBinary reads an ELF executable and returns it with its GOARCH
// name, or an error if it is not a statically linked Linux executable: the
// image has no dynamic loader or libc to run anything else.
func readStaticBinary(path string) ([]byte, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("read binary: %w", err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, "", fmt.Errorf("%s: not an ELF executable: %w", path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return nil, "", fmt.Errorf("%s: ELF type %v is not an executable", path, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, "", fmt.Errorf("%s is dynamically linked (it names a program interpreter); build it with CGO_ENABLED=0", path)
		}
	}
	arch, ok := map[elf.Machine]string{
		elf.EM_X86_64:  "amd64",
		elf.EM_AARCH64: "arm64",
		elf.EM_386:     "386",
		elf.EM_ARM:     "arm",
		elf.EM_PPC64:   "ppc64le",
		elf.EM_S390:    "s390x",
		elf.EM_RISCV:   "riscv64",
	}[f.Machine]
	if !ok {
		return nil, "", fmt.Errorf("%s: unsupported ELF machine %v", path, f.Machine)
	}
	return data, arch, nil
}

// file is one entry of the image's layer. A path ending in "/" is a
// directory.
type file struct {
	path  string
	mode  os.FileMode
	owner int
	data  []byte
}

// tarFiles writes the layer's tar: every parent directory first (0755,
// root-owned), then the entries in the given order, all stamped with mtime.
func tarFiles(files []file, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	written := map[string]bool{}
	writeDir := func(dir string, mode os.FileMode, owner int) error {
		if written[dir] {
			return nil
		}
		written[dir] = true
		return tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeDir, Name: dir + "/", Mode: tarMode(mode),
			Uid: owner, Gid: owner, ModTime: mtime, Format: tar.FormatPAX,
		})
	}
	for _, f := range files {
		clean := filepath.ToSlash(filepath.Clean(f.path))[1:] // relative: no leading "/"
		if err := writeParents(clean, writeDir); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.path, err)
		}
		if f.path[len(f.path)-1] == '/' {
			if err := writeDir(clean, f.mode, f.owner); err != nil {
				return nil, fmt.Errorf("tar %s: %w", f.path, err)
			}
			continue
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg, Name: clean, Mode: tarMode(f.mode), Size: int64(len(f.data)),
			Uid: f.owner, Gid: f.owner, ModTime: mtime, Format: tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.path, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	return buf.Bytes(), nil
}

// writeParents writes every ancestor directory of the relative path rel,
// outermost first.
func writeParents(rel string, writeDir func(string, os.FileMode, int) error) error {
	dir := filepath.ToSlash(filepath.Dir(rel))
	if dir == "." {
		return nil
	}
	if err := writeParents(dir, writeDir); err != nil {
		return err
	}
	return writeDir(dir, 0o755, 0)
}

// tarMode converts permission and sticky bits to a tar header mode.
func tarMode(m os.FileMode) int64 {
	mode := int64(m.Perm())
	if m&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// writeLayout writes img as the only image of the OCI layout at dir, named
// by ref. An existing layout at dir is replaced; any other non-empty
// directory is refused.
func writeLayout(dir string, img v1.Image, ref name.Tag) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("-out: %w", err)
	case len(entries) > 0:
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return fmt.Errorf("-out %s is a non-empty directory that is not an OCI layout; refusing to replace it", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("replace layout: %w", err)
		}
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("layout.Write: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	if err := p.WriteImage(img); err != nil {
		return fmt.Errorf("layout WriteImage: %w", err)
	}
	desc, err := partial.Descriptor(img)
	if err != nil {
		return fmt.Errorf("image descriptor: %w", err)
	}
	// A plain image, not an OCI artifact: leave artifactType out so older
	// readers of index.json see the usual descriptor.
	desc.ArtifactType = ""
	desc.Platform = &v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture}
	desc.Annotations = map[string]string{
		// The tag, as skopeo's oci:DIR:TAG and crane expect it.
		"org.opencontainers.image.ref.name": ref.TagStr(),
		// The full name, as `ctr image import` expects it.
		"io.containerd.image.name": ref.Name(),
	}
	if err := p.AppendDescriptor(*desc); err != nil {
		return fmt.Errorf("layout AppendDescriptor: %w", err)
	}
	return nil
}
