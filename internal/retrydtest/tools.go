package retrydtest

import (
	"os"
	"os/exec"
	"testing"
)

// RequireToolsEnv names the environment variable that turns a missing tool
// from a skip into a failure. scripts/test sets it to 1 after installing
// every tool the suite uses, so a test that would quietly skip there fails
// instead; without it (a developer's machine) the test skips.
const RequireToolsEnv = "RETRYD_REQUIRE_TOOLS"

// NeedProgram returns the path of program on PATH. When it is missing, the
// test skips with one line naming the program and how to install it, or,
// with RETRYD_REQUIRE_TOOLS=1, fails with that line. Call it from the test's
// own goroutine with the test's own t: a skip ends the goroutine it runs on.
func NeedProgram(t testing.TB, program, install string) string {
	t.Helper()
	path, err := exec.LookPath(program)
	if err != nil {
		MissingTool(t, program+" is not installed ("+install+")")
	}
	return path
}

// MissingTool skips the test for a missing tool with reason, or fails it
// when RETRYD_REQUIRE_TOOLS=1 says every tool is installed.
func MissingTool(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(RequireToolsEnv) == "1" {
		t.Fatalf("%s; %s=1 says it must be here (scripts/test installs it)", reason, RequireToolsEnv)
	}
	t.Skip(reason)
}
