package retrydtest

import (
	"os"
	"testing"
)

// EndToEndEnv names the environment variable that runs the end-to-end
// suites: the ones whose harnesses build a Kubernetes control plane and
// node, CoreDNS or Jaeger from source (tens of minutes on a machine whose
// Go build cache is empty). scripts/test-e2e sets it to 1; scripts/test
// leaves it unset, and those suites skip there.
const EndToEndEnv = "RETRYD_E2E"

// EndToEnd skips the test unless RETRYD_E2E=1. The end-to-end harnesses
// (kubetest, jaegertest) call it before they build anything, so a test that
// uses one is end-to-end without saying so itself. Call it from the test's
// own goroutine with the test's own t: a skip ends the goroutine it runs on.
func EndToEnd(t testing.TB, what string) {
	t.Helper()
	if os.Getenv(EndToEndEnv) != "1" {
		t.Skipf("%s: an end-to-end suite; scripts/test-e2e runs it (%s=1)", what, EndToEndEnv)
	}
}
