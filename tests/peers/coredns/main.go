// CoreDNS as its own main (coredns.go) builds it, with the plugins of a cluster's DNS
// only: those of the Corefile kubeadm installs (errors, health, ready, kubernetes,
// prometheus, forward, cache, loop, reload, loadbalance), with bind, hosts and log.
// Upstream's core/plugin imports all sixty, the clients of every cloud's DNS among them,
// which the real node never loads: building them was most of this peer's cold build.
// Each plugin registers itself when imported; dnsserver.Directives, upstream's, keeps
// their order.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
