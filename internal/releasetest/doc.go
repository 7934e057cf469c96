// Package releasetest installs every artifact of a release the way its
// users install it. Its tests run scripts/release once per test process
// (on the repository's HEAD commit, at the VERSION file's version) into a
// temporary directory, then, each from a clean project outside the
// repository:
//
//   - go get the Go client from the release's GOPROXY directory, build a
//     program with it and make it schedule a retry on a live retryd;
//   - go install the server at the release's version and run it;
//   - npm install the TypeScript package's tarball, import every subpath
//     it exports and schedule a retry with it;
//   - pip install the Python wheel into a fresh virtual environment,
//     check its version and schedule a retry with it;
//   - check SHA256SUMS and the released go.mod and go.sum files.
//
// The release builds everything, which takes minutes: the tests skip with
// -short. A missing npm, node or python3 skips the tests that need it, or
// fails them under RETRYD_REQUIRE_TOOLS=1.
//
//	go test -C internal/releasetest -count=1 -v ./...
package releasetest
