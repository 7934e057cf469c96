// Package retryd names the release this source tree builds. Version is
// the VERSION file beside this one, compiled in: every build of the
// binary reports it (go build, go install, the Dockerfile, the
// daemonless image in deploy/image) without a flag to forget, and the
// Helm chart's appVersion, the npm package and the Python wheel carry the
// same string (TestVersionsAgree).
package retryd

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var versionFile string

// Version is the release version, e.g. "0.1.0": the first line of VERSION.
var Version = strings.TrimSpace(versionFile)
