package server

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

// configWith is the default config with one setting given by its flag
// (when flagValue is not empty) and its environment variable (when
// envValue is not empty), as serve reads them, and Validate's verdict.
func configWith(t *testing.T, flagName, envName, flagValue, envValue string) (*Config, error) {
	t.Helper()
	c := DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if err := ApplyEnv(fs, func(name string) string {
		if name == envName {
			return envValue
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	var args []string
	if flagValue != "" {
		args = []string{"--" + flagName, flagValue}
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &c, c.Validate()
}

func TestStoreSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flag, env, wantKind, wantDir string
		bad                          bool
	}{
		{wantKind: "memory"},
		{flag: "memory", wantKind: "memory"},
		{flag: "file:/var/lib/retryd", wantKind: "file", wantDir: "/var/lib/retryd"},
		{env: "file:data", wantKind: "file", wantDir: "data"},
		{flag: "memory", env: "file:data", wantKind: "memory"}, // the flag wins
		{flag: "redis://127.0.0.1:6379/0", wantKind: "redis", wantDir: "redis://127.0.0.1:6379/0"},
		{flag: "rediss://redis.example:6380/1", wantKind: "redis", wantDir: "rediss://redis.example:6380/1"},
		{env: "redis://s0:26379/0?master_name=m&addr=s1:26379", wantKind: "redis", wantDir: "redis://s0:26379/0?master_name=m&addr=s1:26379"},
		{flag: "redis://", bad: true},
		{flag: "redis://n0:7000?addr=n1:7001&partitions=8", wantKind: "redis", wantDir: "redis://n0:7000?addr=n1:7001&partitions=8"}, // a Cluster
		{flag: "redis://n0:7000/2?addr=n1:7001", bad: true},                                                                          // a Cluster has database 0 only
		{flag: "redis://:pw@s0:26379/0?master_name=m&colour=blue", bad: true},                                                        // an option the client does not know
		{flag: "file:", bad: true},
		{flag: "sqlite", bad: true},
		{env: "file", bad: true},
	} {
		c, err := configWith(t, "store", "RETRYD_STORE", tc.flag, tc.env)
		var fe *FieldError
		switch {
		case tc.bad:
			if !errors.As(err, &fe) || fe.Field != "store" {
				t.Errorf("flag %q env %q: %v, want a FieldError naming store", tc.flag, tc.env, err)
			} else if strings.Contains(err.Error(), ":pw@") {
				t.Errorf("flag %q env %q: %v shows the URL's password", tc.flag, tc.env, err)
			}
		case err != nil:
			t.Errorf("flag %q env %q: %v", tc.flag, tc.env, err)
		default:
			if kind, dir := c.StoreKind(); kind != tc.wantKind || dir != tc.wantDir {
				t.Errorf("flag %q env %q: store %s %q, want %s %q", tc.flag, tc.env, kind, dir, tc.wantKind, tc.wantDir)
			}
		}
	}
}

// TestConfigReloadInterval: the policy file's poll interval comes from its
// flag or variable, and one under the minimum is refused by name.
func TestConfigReloadInterval(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env, flag string
		bad       bool
	}{
		{env: "2s"},
		{flag: "100ms"},
		{env: "50ms", bad: true},
		{flag: "0s", bad: true},
	} {
		c, err := configWith(t, "config-reload-interval", "RETRYD_CONFIG_RELOAD_INTERVAL", tc.flag, tc.env)
		var fe *FieldError
		if got := errors.As(err, &fe) && fe.Field == "config-reload-interval"; got != tc.bad {
			t.Errorf("env %q flag %q: Validate() = %v, want refused by name: %v", tc.env, tc.flag, err, tc.bad)
		}
		if !tc.bad && c.ConfigReloadInterval.String() != tc.env+tc.flag {
			t.Errorf("env %q flag %q: interval %v", tc.env, tc.flag, c.ConfigReloadInterval)
		}
	}
}

// TestDefaultPoliciesResolvedOnce: without a policy file every failure is
// decided by one resolved default policy, not one resolved per call (which
// a chain would keep alive until it expires).
func TestDefaultPoliciesResolvedOnce(t *testing.T) {
	t.Parallel()
	p := &parts{c: DefaultConfig()}
	if err := p.loadPolicies(); err != nil {
		t.Fatal(err)
	}
	first, again := p.currentPolicies().ForProvider("p"), p.currentPolicies().ForProvider("p")
	if first != again {
		t.Errorf("two failures without a policy file got two default policies (%p, %p), want one", first, again)
	}
}
