// Command echo is the baseline of retryd-bench: a bare grpc-go server with
// one unary method, retrydbench.Echo/Echo, that decodes a
// google.protobuf.BytesValue with the default proto codec and returns it.
// The service is registered with a hand-written grpc.ServiceDesc, so there
// is no generated code; there are no interceptors, stats handlers, health
// or reflection services. It is the framework's own cost of one unary call
// of about the same request size as a FailedStep: HTTP/2 framing, the
// handler dispatch and a proto decode and encode, and nothing else.
//
//	echo [--listen 127.0.0.1:0] [--metrics-listen 127.0.0.1:0 [--pprof]] [--hold N [--hold-pointers=false]]
//
// With --hold N it first builds N objects that stay live for the whole run,
// each of 128 bytes with four pointers to others drawn at random: a live
// heap shaped like retryd's state (its protobuf records, retries and
// chains, about 570 000 objects in 75 MB after a saturation phase), that
// the collector must mark in every cycle. With --hold-pointers=false it
// holds the same bytes as one block without pointers, which the collector
// marks at once and never scans. Together they measure what holding state
// costs a server of grpc-go by itself, whatever the state is for, and how
// much of that is the pointers (retryd-bench --echo-hold).
//
// When it serves it logs one JSON line {"msg":"serving","addr":"…"} to
// stderr, the same line retryd logs, so the harness reads both the same way.
// With --metrics-listen it also serves /metrics on that address (logged as
// "metrics_addr"): the Prometheus Go collector, whose runtime counters
// retryd's /metrics has as well, and with --pprof net/http/pprof, as
// retryd does. So the harness reads and profiles the baseline's runtime
// exactly as it does retryd's. Nothing is served there during a call.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ServiceName and FullMethod name the echo RPC for clients.
const (
	ServiceName = "retrydbench.Echo"
	FullMethod  = "/" + ServiceName + "/Echo"
)

var echoDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return in, nil
		},
	}},
}

// node is one held object: 32 bytes of pointers and 96 of data, 128 bytes
// in all, about the mean size of what retryd's state holds (131 bytes per
// object in the heap profile of a saturation phase).
type node struct {
	next [4]*node
	data [96]byte
}

// hold returns n nodes, each pointing to four drawn at random (from a
// fixed seed), so that marking them follows pointers across the whole
// heap, as marking retryd's sessions does.
func hold(n int) []*node {
	nodes := make([]*node, n)
	for i := range nodes {
		nodes[i] = new(node)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, x := range nodes {
		for i := range x.next {
			x.next[i] = nodes[r.IntN(n)]
		}
	}
	return nodes
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process at once
	}()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("echo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "gRPC listen address")
	metricsAddr := fs.String("metrics-listen", "", "serve /metrics (the Prometheus Go collector) on this address; empty: off")
	withPprof := fs.Bool("pprof", false, "also serve net/http/pprof on --metrics-listen")
	holdN := fs.Int("hold", 0, "hold this many linked 128-byte objects live for the whole run")
	holdPointers := fs.Bool("hold-pointers", true, "false: hold --hold's bytes as one block without pointers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *holdN < 0 {
		return fmt.Errorf("--hold must not be negative")
	}
	var held any
	if *holdPointers {
		held = hold(*holdN)
	} else {
		held = make([]byte, *holdN*int(unsafe.Sizeof(node{})))
	}
	defer runtime.KeepAlive(held)
	if *withPprof && *metricsAddr == "" {
		return fmt.Errorf("--pprof needs --metrics-listen")
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("net.Listen: %w", err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&echoDesc, struct{}{})
	serving := map[string]string{"msg": "serving", "addr": lis.Addr().String()}
	if *metricsAddr != "" {
		mlis, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			lis.Close()
			return fmt.Errorf("net.Listen --metrics-listen: %w", err)
		}
		defer mlis.Close()
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.Handler())
		if *withPprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		go func() { _ = http.Serve(mlis, mux) }()
		serving["metrics_addr"] = mlis.Addr().String()
	}
	line, err := json.Marshal(serving)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%s\n", line)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	return nil
}
