// Package observability holds what an operator loads beside retryd: a
// Grafana dashboard (grafana-dashboard.json) and Prometheus alert rules
// (alerts.yaml, with promtool unit tests in alerts_test.yaml). Its tests
// prove both against a real Prometheus scraping a real retryd.
package observability
