package containerdtest

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/retryd/retryd/internal/retrydtest"
)

// buildTimeout bounds each `go build` of an image's binaries.
const buildTimeout = 10 * time.Minute

// RetrydImage builds retryd's release image the way docs/operations.md
// says (static cmd/retryd and deploy/healthcheck, packaged by deploy/image)
// into an OCI layout under dir, and returns the layout's directory and the
// image's name, ghcr.io/retryd/retryd:<VERSION>.
func RetrydImage(dir string) (layoutDir, ref string, err error) {
	root, err := retrydtest.RepoRoot()
	if err != nil {
		return "", "", err
	}
	version, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return "", "", err
	}
	ref = "ghcr.io/retryd/retryd:" + strings.TrimSpace(string(version))
	bin := filepath.Join(dir, "bin")
	static := []string{"CGO_ENABLED=0"}
	for _, b := range []struct{ moduleDir, pkg, out string }{
		{root, "./cmd/retryd", "retryd"},
		{root, "./deploy/healthcheck", "retryd-healthcheck"},
		{filepath.Join(root, "deploy", "image"), ".", "retryd-image"},
	} {
		if err := goBuild(b.moduleDir, b.pkg, filepath.Join(bin, b.out), static); err != nil {
			return "", "", err
		}
	}
	layoutDir = filepath.Join(dir, "retryd-oci")
	out, err := exec.Command(filepath.Join(bin, "retryd-image"),
		"-binary", filepath.Join(bin, "retryd"), "-healthcheck", filepath.Join(bin, "retryd-healthcheck"),
		"-out", layoutDir, "-tag", ref, "-version", strings.TrimSpace(string(version))).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("containerdtest: deploy/image: %v: %s", err, out)
	}
	return layoutDir, ref, nil
}

// WritePauseImage builds the pause command (./pause) statically and writes
// it as the image PauseImage, an OCI layout under dir, whose directory it
// returns.
func WritePauseImage(dir string) (string, error) {
	root, err := retrydtest.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "pause")
	if err := goBuild(filepath.Join(root, "deploy", "helm"), "./internal/containerdtest/pause", bin, []string{"CGO_ENABLED=0"}); err != nil {
		return "", err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(data); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return "", fmt.Errorf("containerdtest: pause layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return "", fmt.Errorf("containerdtest: pause image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config = v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535", StopSignal: "SIGTERM"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return "", fmt.Errorf("containerdtest: pause image: %w", err)
	}
	ref, err := name.NewTag(PauseImage)
	if err != nil {
		return "", err
	}
	layoutDir := filepath.Join(dir, "pause-oci")
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("containerdtest: pause layout: %w", err)
	}
	// ctr names an imported image by this annotation.
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref.Name(),
		"org.opencontainers.image.ref.name": ref.TagStr(),
	}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		return "", fmt.Errorf("containerdtest: pause layout: %w", err)
	}
	return layoutDir, nil
}

// goBuild builds pkg of the module in moduleDir into out.
func goBuild(moduleDir, pkg, out string, env []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), env...)
	if outp, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("containerdtest: go build %s in %s: %v\n%s", pkg, moduleDir, err, outp)
	}
	return nil
}

// PauseImage is the name of the pod sandbox image WritePauseImage writes:
// the kubelet's usual one comes from a registry the tests cannot reach.
const PauseImage = "localhost/retryd-test/pause:1"
