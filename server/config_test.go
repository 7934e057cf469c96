package server

import (
	"errors"
	"flag"
	"io"
	"testing"
)

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
		{flag: "file:", bad: true},
		{flag: "sqlite", bad: true},
		{env: "file", bad: true},
	} {
		c := DefaultConfig()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		if err := ApplyEnv(fs, func(name string) string {
			if name == "RETRYD_STORE" {
				return tc.env
			}
			return ""
		}); err != nil {
			t.Fatal(err)
		}
		var args []string
		if tc.flag != "" {
			args = []string{"--store", tc.flag}
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		var fe *FieldError
		switch {
		case tc.bad:
			if !errors.As(err, &fe) || fe.Field != "store" {
				t.Errorf("flag %q env %q: %v, want a FieldError naming store", tc.flag, tc.env, err)
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
