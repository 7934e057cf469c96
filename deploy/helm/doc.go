// Package helm tests the retryd Helm chart in retryd/: helm lint and helm
// template (with the Helm pinned in tools/helm) over the values files in
// testdata/, strict decoding of every rendered object into the Kubernetes API
// types, the schema's rejection of the values in testdata/bad/, and the
// rendered policy file and command line run through the real retryd binary.
//
// The package has no non-test code; run it with
//
//	go test -C deploy/helm ./...
//
// It is a module of its own, so that the Kubernetes API types it decodes
// into stay out of the server module's requirements.
//
// The chart ships deploy/observability's dashboard and alert rules
// (grafanaDashboard, prometheusRule). Helm reads no file outside the chart,
// so retryd/files/ holds copies that `go generate` here makes;
// TestObservabilityFilesAreCopies fails when a copy differs from its
// source, so edit deploy/observability and regenerate.
package helm

//go:generate cp ../observability/grafana-dashboard.json ../observability/alerts.yaml retryd/files/
