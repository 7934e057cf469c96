package main

import (
	"testing"
	"time"

	"github.com/retryd/retryd/bench"
)

// TestEveryPart: --all turns every part on with the documented sizes, and
// a flag given beside it keeps its value.
func TestEveryPart(t *testing.T) {
	t.Parallel()
	cfg, sc, chains := bench.DefaultConfig(), bench.ScaleConfig{}, ""
	everyPart(&cfg, &sc, &chains, map[string]bool{}, "/opt/ratelimit")
	if !cfg.Gubernator || !cfg.RedisPeer || cfg.RatelimitBin != "/opt/ratelimit" || chains != allChains ||
		sc.Awaiters != 100_000 || sc.AwaitLead != 75*time.Second || sc.AwaitSpread != time.Minute {
		t.Errorf("--all alone: %+v, %+v, chains %q", cfg, sc, chains)
	}

	cfg, chains = bench.DefaultConfig(), "10000"
	cfg.RatelimitBin = "/given"
	sc = bench.ScaleConfig{Awaiters: 500, AwaitLead: time.Second, AwaitSpread: 2 * time.Second}
	everyPart(&cfg, &sc, &chains, map[string]bool{"ratelimit-bin": true, "chains": true,
		"awaiters": true, "awaiters-lead": true, "awaiters-spread": true}, "/opt/ratelimit")
	if cfg.RatelimitBin != "/given" || chains != "10000" || sc.Awaiters != 500 ||
		sc.AwaitLead != time.Second || sc.AwaitSpread != 2*time.Second {
		t.Errorf("--all with flags: %+v, %+v, chains %q", cfg, sc, chains)
	}

	cfg = bench.DefaultConfig()
	everyPart(&cfg, &bench.ScaleConfig{}, new(string), map[string]bool{}, "")
	if cfg.RatelimitBin != "" {
		t.Errorf("--all without a ratelimit binary: RatelimitBin %q", cfg.RatelimitBin)
	}
}
