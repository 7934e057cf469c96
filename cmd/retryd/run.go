package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/retryd/retryd/config"
	"github.com/retryd/retryd/server"
)

func serve(ctx context.Context, e *env, args []string) error {
	cfg := server.DefaultConfig()
	fs := newFlags("serve")
	cfg.RegisterFlags(fs)
	envErr := server.ApplyEnv(fs, e.getenv) // flags parsed below win over the environment
	if err := e.parse(fs, args, false); err != nil {
		return err
	}
	if envErr != nil {
		return usage("serve", envErr)
	}
	if err := cfg.Validate(); err != nil {
		return usage("serve", err)
	}
	return server.Run(ctx, cfg, server.NewLogger(cfg, e.stderr), e.getenv)
}

func checkConfig(_ context.Context, e *env, args []string) error {
	fs := newFlags("check-config")
	path := fs.String("config", e.getenv("RETRYD_CONFIG"), "YAML policy `file` to validate (env RETRYD_CONFIG)")
	if err := e.parse(fs, args, false); err != nil {
		return err
	}
	if *path == "" {
		return usage("check-config", errors.New("--config is required"))
	}
	ps, err := config.Load(*path)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: ok\n", *path)
	for _, name := range ps.Names() {
		p, _ := ps.Named(name)
		fmt.Fprintf(e.stdout, "policy %s: %s\n", name, p.Key)
	}
	for _, name := range ps.Providers() {
		fmt.Fprintf(e.stdout, "provider %s: %s\n", name, ps.ForProvider(name).Key)
	}
	return nil
}
