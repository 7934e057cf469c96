// Command coredns is CoreDNS (pinned in tools/coredns/go.mod) with only the
// plugins the chart tests' cluster DNS uses: the Corefile of
// deploy/helm/internal/kubetest (dns.go) names bind, ready, errors and
// kubernetes, and nothing else is compiled in. CoreDNS's own main package
// links every plugin it ships, with the cloud providers' SDKs of route53,
// azure and clouddns and the tracing exporters, which this test tool never
// runs; building them was most of a fresh machine's build time.
//
// This is how CoreDNS documents building a server with a chosen set of
// plugins: import coremain, set dnsserver.Directives, and import each
// plugin for its registration.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives are the plugins in the order CoreDNS runs them, the order of
// its plugin.cfg (core/dnsserver/zdirectives.go); a Corefile may name them
// in any order.
var directives = []string{
	"bind",
	"ready",
	"errors",
	"kubernetes",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
