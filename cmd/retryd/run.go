package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/retryd/retryd/config"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// errViolations makes verify exit non-zero after printing what it found.
var errViolations = errors.New("invariant violations found")

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stderr)
	case "check-config":
		return checkConfig(args, getenv, stdout, stderr)
	case "check-credentials":
		return checkCredentials(args, getenv, stdout, stderr)
	case "hash-token":
		return hashToken(args, os.Stdin, stdout, stderr)
	case "verify":
		return verify(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "retryd", server.Version)
		return nil
	default:
		return fmt.Errorf("unknown command %q (want serve, check-config, check-credentials, hash-token, verify or version)", cmd)
	}
}

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("retryd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.RegisterFlags(fs)
	if err := server.ApplyEnv(fs, getenv); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	return server.Run(ctx, cfg, server.NewLogger(cfg, stderr), getenv)
}

func checkConfig(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("retryd check-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", getenv("RETRYD_CONFIG"), "YAML policy file to validate (env RETRYD_CONFIG)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("check-config: --config is required")
	}
	ps, err := config.Load(*path)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	for _, name := range ps.Names() {
		p, _ := ps.Named(name)
		fmt.Fprintf(stdout, "policy %s: %s\n", name, p.Key)
	}
	for _, name := range ps.Providers() {
		fmt.Fprintf(stdout, "provider %s: %s\n", name, ps.ForProvider(name).Key)
	}
	return nil
}

func verify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("retryd verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "event log as proto-JSON lines (- for stdin)")
	addr := fs.String("server", "", "read the event log of a live retryd at this address (WatchEvents)")
	session := fs.String("session", "", "with --server: only this session")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var (
		events []*retrydv1.Event
		err    error
	)
	switch {
	case (*file == "") == (*addr == ""):
		return errors.New("verify: give exactly one of --file or --server")
	case *file == "-":
		events, err = invariant.ReadJSONLines(os.Stdin)
	case *file != "":
		var f *os.File
		if f, err = os.Open(*file); err == nil {
			events, err = invariant.ReadJSONLines(f)
			f.Close()
		}
	default:
		events, err = watchAll(ctx, *addr, *session)
	}
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	vs := invariant.Check(events)
	for _, v := range vs {
		fmt.Fprintln(stdout, v)
	}
	fmt.Fprintf(stdout, "%d events, %d violations\n", len(events), len(vs))
	if len(vs) > 0 {
		return errViolations
	}
	return nil
}

// watchAll reads every retained event of a live server.
func watchAll(ctx context.Context, addr, session string) ([]*retrydv1.Event, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stream, err := retrydv1.NewRetryServiceClient(conn).WatchEvents(ctx, &retrydv1.WatchEventsRequest{
		SessionId: session, StopAtEnd: true,
	})
	if err != nil {
		return nil, err
	}
	var events []*retrydv1.Event
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return nil, err
		}
		events = append(events, resp.GetEvent())
	}
}
