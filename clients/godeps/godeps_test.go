package godeps_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/retrydtest"
)

// agentModules are the repository's modules an agent imports: the Go
// client, its openai-go middleware, the generated API and the policy
// engine.
var agentModules = []string{"clients/go", "clients/go/openai", "gen", "policy"}

// testModules are required by the client's tests, so they are in the
// client's go.mod and therefore in the consumer's graph (go mod tidy loads
// the tests of the packages the consumer imports).
var testModules = []string{"invariant", "internal/retrydtest"}

// forbidden are module paths (a trailing "/" makes a prefix) that only the
// server, its deployment tests or its benchmarks need.
var forbidden = []string{
	"github.com/retryd/retryd",               // the server module itself
	"github.com/redis/go-redis/",             // storage
	"go.etcd.io/bbolt",                       // storage
	"k8s.io/",                                // Kubernetes API types (chart tests)
	"sigs.k8s.io/",                           // Kubernetes YAML and structured merge
	"github.com/google/go-containerregistry", // container image builder
	"github.com/prometheus/",                 // Prometheus client and formats
	"go.opentelemetry.io/otel/exporters/prometheus",
}

// isForbidden reports the entry of forbidden that module path mod matches.
func isForbidden(mod string) (string, bool) {
	for _, f := range forbidden {
		if strings.HasSuffix(f, "/") && strings.HasPrefix(mod, f) || mod == f {
			return f, true
		}
	}
	return "", false
}

// consumerMain uses one name from each package an agent imports, so none
// of the imports is unused.
const consumerMain = `package main

import (
	"fmt"

	retryd "github.com/retryd/retryd/clients/go"
	retrydopenai "github.com/retryd/retryd/clients/go/openai"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
)

func main() {
	_, err := policy.Resolve(&retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_NORMAL})
	fmt.Println(retryd.New, retrydopenai.New, err)
}
`

// TestConsumerModuleGraph resolves a module that imports the Go client, its
// openai-go middleware, the generated API and policy, and checks that neither its module graph nor
// its packages reach the server's dependencies.
func TestConsumerModuleGraph(t *testing.T) {
	t.Parallel()
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module example.com/agent\n\ngo 1.26.0\n\n")
	for _, m := range agentModules {
		fmt.Fprintf(&gomod, "require github.com/retryd/retryd/%s v0.0.0-00010101000000-000000000000\n", m)
	}
	for _, m := range slices.Concat(agentModules, testModules) {
		fmt.Fprintf(&gomod, "replace github.com/retryd/retryd/%s => %s\n", m, filepath.Join(root, filepath.FromSlash(m)))
	}
	write(t, filepath.Join(dir, "go.mod"), gomod.String())
	write(t, filepath.Join(dir, "main.go"), consumerMain)

	goCmd(t, dir, "mod", "tidy")
	goCmd(t, dir, "build", "-o", os.DevNull, ".")

	// Every module of the graph, from both ends of each edge.
	graph := map[string]bool{}
	for line := range strings.Lines(goCmd(t, dir, "mod", "graph")) {
		for _, node := range strings.Fields(line) {
			path, _, _ := strings.Cut(node, "@")
			graph[path] = true
		}
	}
	for _, want := range []string{"github.com/retryd/retryd/clients/go", "github.com/retryd/retryd/gen", "google.golang.org/grpc"} {
		if !graph[want] {
			t.Errorf("go mod graph has no %s: the consumer did not resolve the client", want)
		}
	}
	for _, mod := range slices.Sorted(maps.Keys(graph)) {
		if f, bad := isForbidden(mod); bad {
			t.Errorf("go mod graph of a module importing the Go client contains %s (forbidden: %s)", mod, f)
		}
	}

	// Every package the consumer's binary links, with its module.
	deps := goCmd(t, dir, "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", ".")
	var linked int
	for line := range strings.Lines(deps) {
		pkg, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		if f, bad := isForbidden(mod); bad {
			t.Errorf("the consumer links %s from module %s (forbidden: %s)", pkg, mod, f)
		}
		if strings.HasPrefix(pkg, "github.com/retryd/retryd/") {
			linked++
		}
	}
	if linked == 0 {
		t.Errorf("go list -deps shows no retryd package:\n%s", deps)
	}
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goCmd runs the go command in dir in module mode (no workspace, go.mod
// updates allowed) and returns its standard output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}
