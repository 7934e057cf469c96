// Package godeps checks what an agent inherits when it imports retryd's Go
// API: it writes a throwaway module that imports the Go client
// (clients/go), its openai-go middleware (clients/go/openai), the
// generated API (gen/retryd/v1) and the policy package, as an agent's own
// module would, resolves it with the go command, and
// fails if `go mod graph` or `go list -deps` reaches any of the server's
// dependencies (storage, Kubernetes, container images, Prometheus) or the
// server module itself.
//
// The package has no non-test code; run it with
//
//	go test ./clients/godeps/
package godeps
