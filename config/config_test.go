package config_test

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/config"
	"github.com/retryd/retryd/fleet"
	"github.com/retryd/retryd/policy"
)

// Canonical keys the valid files resolve to.
const (
	keyBuiltin = "normal;max=2;codes=EMPTY_RESPONSE,RATE_LIMIT,SERVER,TIMEOUT,TRANSPORT;backoff=500..10000*2;jitter=symmetric:0.1;over_cap=delegate;min_attempt=100"
	keyRelay   = "schedule;max=inf;codes=ACCOUNT_QUOTA,ACCOUNT_TOKEN_INVALID,AUTH,EMPTY_RESPONSE,HTTP_*,INVALID_CREDENTIAL,MALFORMED_RESPONSE,PI_AI_ERROR,QUOTA,RATE_LIMIT,SERVER,TIMEOUT,TRANSPORT;schedule=2000,5000,5000,5000,10000;tail=20000;over_cap=local;min_attempt=100"
	keyAlways  = "always;max=inf;backoff=1000..30000*2;jitter=symmetric:0.2;over_cap=local;min_attempt=100"
	keyMax3    = "normal;max=3;codes=EMPTY_RESPONSE,RATE_LIMIT,SERVER,TIMEOUT,TRANSPORT;backoff=500..10000*2;jitter=symmetric:0.1;over_cap=delegate;min_attempt=100"
	keyPasted  = "normal;max=4;codes=HTTP_5*,RATE_LIMIT,SERVER;backoff=250..8000*1.5;jitter=full;over_cap=honor;min_attempt=0"
)

// keys lists every configured policy's key: "policy NAME", "provider NAME",
// and "default" (what a provider without its own policy gets).
func keys(t *testing.T, ps *config.Policies) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range ps.Names() {
		p, ok := ps.Named(n)
		if !ok {
			t.Fatalf("Names lists %q but Named does not find it", n)
		}
		out["policy "+n] = p.Key
	}
	unconfigured := "unconfigured-provider"
	for _, n := range ps.Providers() {
		out["provider "+n] = ps.ForProvider(n).Key
		unconfigured += "-" + n // a name that is surely not configured
	}
	out["default"] = ps.ForProvider(unconfigured).Key
	return out
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseValid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		want map[string]string
	}{
		{"empty file", "", map[string]string{"default": keyBuiltin}},
		{"only a comment", "# no policies yet\n", map[string]string{"default": keyBuiltin}},
		{"null default policy", "defaultPolicy: null\n", map[string]string{"default": keyBuiltin}},
		{"the package example", readFile(t, "example.yaml"), map[string]string{
			"policy relay": keyRelay, "provider deepseek": keyAlways, "default": keyMax3,
		}},
		{"lower-case enums", `
policies:
  a: {mode: always, backoff: {initialDelayMs: 1000, maxDelayMs: 30000, jitterRatio: 0.2}}
  b: {mode: schedule}
  c: {mode: normal, maxRetries: 4, retryableCodes: [SERVER, RATE_LIMIT, HTTP_5*], minAttemptMs: 0,
      backoff: {initialDelayMs: 250, maxDelayMs: 8000, multiplier: 1.5, jitterRatio: 0.25, jitter: full},
      retryAfterOverCap: honor}
`, map[string]string{"policy a": keyAlways, "policy b": keyRelay, "policy c": keyPasted, "default": keyBuiltin}},
		{"mixed-case and proto enum names", `
policies:
  a: {mode: MODE_ALWAYS, backoff: {initialDelayMs: 1000, maxDelayMs: 30000, jitterRatio: 0.2, jitter: JITTER_SYMMETRIC}}
  c: {mode: Normal, maxRetries: 4, retryableCodes: [HTTP_5*, SERVER, RATE_LIMIT], minAttemptMs: 0,
      backoff: {initialDelayMs: 250, maxDelayMs: 8000, multiplier: 1.5, jitterRatio: 0.9, jitter: Full},
      retryAfterOverCap: RETRY_AFTER_OVER_CAP_HONOR}
`, map[string]string{"policy a": keyAlways, "policy c": keyPasted, "default": keyBuiltin}},
		{"pasted harness block", `
providers:
  openai:
    # copied from the harness's provider config, unchanged
    retryPolicy:
      mode: normal
      maxRetries: 4
      retryableCodes:
        - RATE_LIMIT
        - SERVER
        - HTTP_5*
      backoff:
        initialDelayMs: 250
        maxDelayMs: 8000
        multiplier: 1.5
        jitterRatio: 0.25
        jitter: full
      retryAfterOverCap: honor
      minAttemptMs: 0
  deepseek:
    retryPolicy: {"mode": "always", "backoff": {"initialDelayMs": 1000, "maxDelayMs": 30000, "jitterRatio": 0.2}}
`, map[string]string{"provider openai": keyPasted, "provider deepseek": keyAlways, "default": keyBuiltin}},
		{"JSON file", `{"providers": {"deepseek": {"retryPolicy": {"mode": "always",
  "backoff": {"initialDelayMs": 1000, "maxDelayMs": 30000, "jitterRatio": 0.2}}}},
  "defaultPolicy": {"maxRetries": 3}}`, map[string]string{"provider deepseek": keyAlways, "default": keyMax3}},
		{"explicit defaults give the built-in key", `
defaultPolicy:
  mode: normal
  maxRetries: 2
  retryableCodes: [TRANSPORT, TIMEOUT, SERVER, RATE_LIMIT, EMPTY_RESPONSE]
  backoff: {initialDelayMs: 500, maxDelayMs: 10000, multiplier: 2, jitterRatio: 0.1, jitter: symmetric}
  retryAfterOverCap: delegate
  minAttemptMs: 100
`, map[string]string{"default": keyBuiltin}},
		{"the dsh-retry schedule written out", `
policies:
  relay:
    mode: schedule
    schedule: [2000, 5000, 5000, 5000, 10000]
    tailDelayMs: 20000
    retryAfterOverCap: local
`, map[string]string{"policy relay": keyRelay, "default": keyBuiltin}},
		// The plugin's own block has no mode: its schedule makes it schedule mode.
		{"the dsh-retry block pasted without a mode", `
providers:
  relay:
    retryPolicy:
      schedule: [2000, 5000, 5000, 5000, 10000]
      tailDelayMs: 20000
      retryAfterOverCap: local
`, map[string]string{"provider relay": keyRelay, "default": keyBuiltin}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ps, err := config.Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := keys(t, ps); !maps.Equal(got, tt.want) {
				t.Errorf("keys\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		// field is the exact path of the first *config.FieldError, when the
		// error names a field of a policy; empty when the file is refused as
		// a whole.
		field string
		// want are substrings of the error text.
		want []string
	}{
		{"unknown top-level key", "polices:\n  relay: {mode: schedule}\n", "", []string{`unknown field "polices"`}},
		{"unknown policy key", "policies:\n  x:\n    maxRetrys: 3\n", "policies.x", []string{"policies.x: ", `unknown field "maxRetrys"`}},
		{"unknown backoff key", "providers:\n  deepseek:\n    retryPolicy:\n      backoff: {initialDelay: 5}\n",
			"providers.deepseek.retryPolicy", []string{"providers.deepseek.retryPolicy: ", `unknown field "initialDelay"`}},
		{"snake-case key of another tool", "policies:\n  x:\n    retry_after: 5\n", "policies.x", []string{`unknown field "retry_after"`}},
		{"unknown mode", "policies:\n  x:\n    mode: sometimes\n", "policies.x", []string{"policies.x: ", "MODE_SOMETIMES"}},
		{"unknown jitter", "providers:\n  deepseek:\n    retryPolicy:\n      backoff: {jitter: gaussian}\n",
			"providers.deepseek.retryPolicy", []string{"providers.deepseek.retryPolicy: ", "JITTER_GAUSSIAN"}},
		{"unknown over-cap", "defaultPolicy:\n  retryAfterOverCap: never\n", "defaultPolicy", []string{"defaultPolicy: ", "RETRY_AFTER_OVER_CAP_NEVER"}},
		{"unknown mode number", "policies:\n  x:\n    mode: 7\n", "policies.x.mode", []string{"policies.x.mode: unknown mode 7"}},
		{"unknown over-cap number", "policies:\n  x:\n    retryAfterOverCap: 9\n", "policies.x.retryAfterOverCap", []string{"policies.x.retryAfterOverCap: "}},
		{"enum as a list", "policies:\n  x:\n    mode: [always]\n", "policies.x", []string{"policies.x: ", "enum field mode"}},
		{"missing retryPolicy", "providers:\n  deepseek: {}\n", "providers.deepseek.retryPolicy", []string{"providers.deepseek.retryPolicy: required"}},
		{"provider without a body", "providers:\n  deepseek:\n", "providers.deepseek.retryPolicy", []string{"providers.deepseek.retryPolicy: required"}},
		{"null retryPolicy", "providers:\n  deepseek:\n    retryPolicy: null\n", "providers.deepseek.retryPolicy", []string{"providers.deepseek.retryPolicy: "}},
		{"null named policy", "policies:\n  x: null\n", "policies.x", []string{"policies.x: "}},
		{"policy that is not a mapping", "defaultPolicy: 3\n", "defaultPolicy", []string{"defaultPolicy: ", "must be a mapping"}},
		{"file that is not a mapping", "- policies\n", "", []string{"config: "}},
		{"policies as a list", "policies: [relay]\n", "", []string{"config: ", "policies"}},
		{"tab indentation", "policies:\n\trelay: {mode: schedule}\n", "", []string{"config: not valid YAML", "line 2"}},
		{"unclosed flow mapping", "policies: {relay: {mode: schedule}\n", "", []string{"config: not valid YAML"}},
		{"self-referencing anchor", "policies: &a {x: *a}\n", "", []string{"config: not valid YAML"}},
		{"zero initial delay", "providers:\n  deepseek:\n    retryPolicy:\n      backoff: {initialDelayMs: 0}\n",
			"providers.deepseek.retryPolicy.backoff.initialDelayMs", []string{"providers.deepseek.retryPolicy.backoff.initialDelayMs: must be greater than 0"}},
		{"negative initial delay", "providers:\n  deepseek:\n    retryPolicy:\n      backoff: {initialDelayMs: -1}\n",
			"providers.deepseek.retryPolicy", []string{"providers.deepseek.retryPolicy: ", "initialDelayMs"}},
		{"delay beyond the timer", "policies:\n  x:\n    backoff: {maxDelayMs: 2147483648}\n", "policies.x.backoff.maxDelayMs", []string{"policies.x.backoff.maxDelayMs: "}},
		{"multiplier below 1", "policies:\n  x:\n    backoff: {multiplier: 0.5}\n", "policies.x.backoff.multiplier", []string{"policies.x.backoff.multiplier: "}},
		{"bare star", "policies:\n  x:\n    retryableCodes: ['*']\n", "policies.x.retryableCodes[0]", []string{"policies.x.retryableCodes[0]: "}},
		{"lower-case code", "policies:\n  x:\n    retryableCodes: [SERVER, timeout]\n", "policies.x.retryableCodes[1]", []string{"policies.x.retryableCodes[1]: "}},
		{"duplicate code", "policies:\n  x:\n    retryableCodes: [SERVER, SERVER]\n", "policies.x.retryableCodes[1]", []string{"policies.x.retryableCodes[1]: duplicate"}},
		{"max retries in always mode", "defaultPolicy:\n  mode: always\n  maxRetries: 3\n", "defaultPolicy.maxRetries", []string{"defaultPolicy.maxRetries: "}},
		{"backoff in schedule mode", "policies:\n  relay:\n    mode: schedule\n    backoff: {initialDelayMs: 5}\n", "policies.relay.backoff", []string{"policies.relay.backoff: "}},
		{"snake_case key named as written", "policies:\n  x:\n    backoff: {initial_delay_ms: 0}\n", "policies.x.backoff.initial_delay_ms", []string{"policies.x.backoff.initial_delay_ms: must be greater than 0"}},
		{"snake_case parent, camelCase child", "policies:\n  x:\n    retry_after_over_cap: 9\n", "policies.x.retry_after_over_cap", []string{"policies.x.retry_after_over_cap: "}},
		{"tail delay without a schedule's mode", "policies:\n  relay:\n    mode: normal\n    tailDelayMs: 20000\n", "policies.relay.tailDelayMs", []string{"policies.relay.tailDelayMs: only allowed in schedule mode"}},
		{"schedule entry 0", "policies:\n  relay:\n    mode: schedule\n    schedule: [1000, 0]\n", "policies.relay.schedule[1]", []string{"policies.relay.schedule[1]: "}},
		{"every bad policy is named", `
policies:
  a: {backoff: {multiplier: 0.5}}
providers:
  b: {retryPolicy: {mode: normal, schedule: [1]}}
defaultPolicy: {mode: always, retryableCodes: [SERVER]}
`, "policies.a.backoff.multiplier", []string{"policies.a.backoff.multiplier: ", "providers.b.retryPolicy.schedule: ", "defaultPolicy.retryableCodes: "}},
		// YAML's .nan reaches no field: the JSON conversion refuses it first.
		{"NaN multiplier", "policies:\n  x:\n    backoff: {multiplier: .nan}\n", "", []string{"config: ", "NaN"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ps, err := config.Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("Parse accepted it: %v", keys(t, ps))
			}
			if ps != nil {
				t.Errorf("Parse returned policies with its error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			var fe *config.FieldError
			switch {
			case tt.field == "" && errors.As(err, &fe):
				t.Errorf("error names field %q, want a whole-file error: %v", fe.Field, err)
			case tt.field != "" && !errors.As(err, &fe):
				t.Errorf("error %q is not a *config.FieldError", err)
			case tt.field != "" && fe.Field != tt.field:
				t.Errorf("error names field %q, want %q", fe.Field, tt.field)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	ps, err := config.Load(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := ps.ForProvider("deepseek").Key; got != keyAlways {
		t.Errorf("deepseek: %q", got)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("policies:\n  x: {mode: sometimes}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(bad); err == nil || !strings.HasPrefix(err.Error(), bad+": policies.x: ") {
		t.Errorf("Load(bad) = %v, want an error naming the file and the field", err)
	}
	if _, err := config.Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want os.ErrNotExist", err)
	}
}

// FuzzConfigParse: Parse never panics; when it accepts a file, every named
// and provider policy (and the default) has a non-empty canonical key that
// its own canonical form resolves to again, and parsing the same bytes again
// gives the same keys. A refusal is an error with text, and no policies.
func FuzzConfigParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := config.Parse(data)
		if err != nil {
			if ps != nil {
				t.Fatalf("Parse returned policies with its error %v", err)
			}
			if err.Error() == "" {
				t.Fatal("Parse failed with an empty error")
			}
			return
		}
		first := keys(t, ps)
		for name, key := range first {
			if key == "" {
				t.Fatalf("%s: empty key", name)
			}
		}
		check := func(name string, p *policy.Policy) {
			again, err := policy.Resolve(p.Proto())
			if err != nil || again.Key != p.Key {
				t.Fatalf("%s: canonical form of %q resolves to %v, %v", name, p.Key, again, err)
			}
		}
		for _, n := range ps.Names() {
			p, _ := ps.Named(n)
			check("policy "+n, p)
		}
		for _, n := range ps.Providers() {
			check("provider "+n, ps.ForProvider(n))
		}
		ps2, err := config.Parse(data)
		if err != nil {
			t.Fatalf("second Parse of accepted bytes failed: %v", err)
		}
		if second := keys(t, ps2); !maps.Equal(first, second) {
			t.Fatalf("keys differ between two parses:\n %v\n %v", first, second)
		}
	})
}

func TestDuplicateKeysAreRefused(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte("policies:\n  a: {maxRetries: 1}\n  a: {maxRetries: 2}\n"))
	if err == nil || !strings.Contains(err.Error(), `key "a" already set`) {
		t.Fatalf("a policy given twice: %v, want an error naming the key", err)
	}
}

func TestFleetBlocks(t *testing.T) {
	ps, err := config.Parse([]byte(`
fleet:
  capacity: 50
  refillPerSecond: 2
providers:
  deepseek:
    fleet: {openForMs: 10000, successCredit: 0.5}
  openai:
    retryPolicy: {maxRetries: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	ds, ok := ps.Fleet("deepseek")
	if !ok || ds.Capacity != 50 || ds.RefillPerSecond != 2 || ds.OpenFor != 10*time.Second || ds.SuccessCredit != 0.5 ||
		ds.MinSamples != fleet.DefaultMinSamples {
		t.Errorf("deepseek: %+v %v: want its block over the file's over the defaults", ds, ok)
	}
	if p := ps.ForProvider("deepseek"); p.Key != config.Default().ForProvider("x").Key {
		t.Errorf("deepseek without retryPolicy: policy %s, want the default", p.Key)
	}
	oa, ok := ps.Fleet("openai")
	if !ok || oa.Capacity != 50 || oa.OpenFor != fleet.DefaultOpenFor {
		t.Errorf("openai: %+v %v: want the file's block", oa, ok)
	}
	if _, ok := config.Default().Fleet("openai"); ok {
		t.Error("a server without a fleet block protects providers; fleet protection must be opt-in")
	}

	_, err = config.Parse([]byte(`
fleet: {capacity: 0.5, windowMs: 99999999999, bogus: 1}
providers:
  deepseek:
    fleet: {failureThreshold: 2}
`))
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		for _, x := range flatten(e) {
			var fe *config.FieldError
			if errors.As(x, &fe) {
				fields = append(fields, fe.Field)
			}
		}
	}
	want := []string{"fleet", "providers.deepseek.fleet.failureThreshold"}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields %v, want %v (err %v)", fields, want, err)
	}
	_, err = config.Parse([]byte("fleet: {capacity: 0.5, windowMs: 99999999999}"))
	if err == nil || !strings.Contains(err.Error(), "fleet.capacity") || !strings.Contains(err.Error(), "fleet.windowMs") {
		t.Errorf("bad values: %v, want both fields named", err)
	}
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// TestFleetChange names the fleet block a new file changes, and nothing
// when only policies changed.
func TestFleetChange(t *testing.T) {
	t.Parallel()
	parse := func(s string) *config.Policies {
		t.Helper()
		ps, err := config.Parse([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	start := parse("fleet: {capacity: 10}\nproviders:\n  openai:\n    fleet: {minSamples: 5}\n")
	for _, tc := range []struct{ file, want string }{
		{"fleet: {capacity: 10}\nproviders:\n  openai:\n    fleet: {minSamples: 5}\n    retryPolicy: {maxRetries: 2}\n", ""},
		{"fleet: {capacity: 11}\nproviders:\n  openai:\n    fleet: {minSamples: 5}\n", "fleet"},
		{"providers:\n  openai:\n    fleet: {minSamples: 5}\n", "fleet"},
		{"fleet: {capacity: 10}\nproviders:\n  openai:\n    fleet: {minSamples: 6}\n", "providers.openai.fleet"},
		{"fleet: {capacity: 10}\n", "providers.openai.fleet"},
		{"fleet: {capacity: 10}\nproviders:\n  openai:\n    fleet: {minSamples: 5}\n  relay:\n    fleet: {}\n", "providers.relay.fleet"},
	} {
		if got := start.FleetChange(parse(tc.file)); got != tc.want {
			t.Errorf("%q: FleetChange = %q, want %q", tc.file, got, tc.want)
		}
	}
}
