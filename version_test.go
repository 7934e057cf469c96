package retryd

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

// TestVersionsAgree: the Helm chart's appVersion (the image tag it runs by
// default), the npm package and the Python wheel carry the VERSION file's
// version, which the binary reports.
func TestVersionsAgree(t *testing.T) {
	t.Parallel()
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(Version) {
		t.Fatalf("VERSION is %q, want MAJOR.MINOR.PATCH (the same string is a Go, npm, Helm and PEP 440 version)", Version)
	}
	read := func(path string) string {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	field := func(path, pattern string) string {
		t.Helper()
		m := regexp.MustCompile(pattern).FindStringSubmatch(read(path))
		if m == nil {
			t.Fatalf("%s: no match for %s", path, pattern)
		}
		return m[1]
	}
	var pkg struct{ Version string }
	if err := json.Unmarshal([]byte(read("clients/ts/package.json")), &pkg); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, got string }{
		{"deploy/helm/retryd/Chart.yaml appVersion", field("deploy/helm/retryd/Chart.yaml", `(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`)},
		{"clients/ts/package.json version", pkg.Version},
		{"clients/python/src/retryd/_version.py __version__", field("clients/python/src/retryd/_version.py", `(?m)^__version__ = "([^"]+)"$`)},
	} {
		if c.got != Version {
			t.Errorf("%s is %q, VERSION %q: a release sets them together (docs/operations.md, Release)", c.what, c.got, Version)
		}
	}
}
