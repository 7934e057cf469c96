// Command pause is the process of the test node's pod sandboxes: it holds
// a pod's namespaces open and does nothing until it is told to stop. The
// harness builds it statically and packages it as containerdtest.PauseImage,
// because the kubelet's usual sandbox image comes from a registry the
// tests cannot reach.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
