// Package config loads retryd's policy file: named policies, per-provider
// policies and an optional replacement for the built-in default, written in
// YAML with the same camelCase keys as a harness's retryPolicy block, so a
// provider's existing block pastes in unchanged.
//
//	policies:
//	  relay:
//	    mode: schedule
//	    schedule: [2000, 5000, 5000, 5000, 10000]
//	    tailDelayMs: 20000
//	providers:
//	  deepseek:
//	    retryPolicy:
//	      mode: always
//	      backoff: {initialDelayMs: 1000, maxDelayMs: 30000, jitterRatio: 0.2}
//	defaultPolicy:
//	  maxRetries: 3
//
// A block with a schedule or a tail delay and no mode is a schedule-mode
// policy, as the dsh-retry plugin writes it.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/retryd/retryd/fleet"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/policy"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// Policies resolves which policy decides a failure that carries no inline
// policy. The zero value is not usable; use Default or Load.
type Policies struct {
	named     map[string]*policy.Policy
	providers map[string]*policy.Policy
	fallback  *policy.Policy

	// fleet is the file's fleet block over fleet.DefaultConfig, nil when
	// the file has none; providerFleet holds providers' own blocks, each
	// over fleet (or the defaults).
	fleet         *fleet.Config
	providerFleet map[string]fleet.Config
}

// Default returns the policies of a server with no policy file: the
// built-in default (normal mode) for every provider.
func Default() *Policies {
	p, err := policy.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("config: built-in default policy is invalid: %v", err))
	}
	return &Policies{fallback: p}
}

// Named returns the policy configured under name.
func (ps *Policies) Named(name string) (*policy.Policy, bool) {
	p, ok := ps.named[name]
	return p, ok
}

// ForProvider returns the provider's configured policy, else the default.
func (ps *Policies) ForProvider(provider string) *policy.Policy {
	if p, ok := ps.providers[provider]; ok {
		return p
	}
	return ps.fallback
}

// Names lists the named policies, sorted.
func (ps *Policies) Names() []string {
	out := make([]string, 0, len(ps.named))
	for n := range ps.named {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Providers lists the providers with a configured policy, sorted.
func (ps *Policies) Providers() []string {
	out := make([]string, 0, len(ps.providers))
	for n := range ps.providers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Load reads and validates a policy file.
func Load(path string) (*Policies, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	ps, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}

// FieldError names the invalid field of a policy file by its path, spelled
// as the file spelled it, e.g.
// "providers.deepseek.retryPolicy.backoff.initialDelayMs".
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

type file struct {
	Policies      map[string]json.RawMessage `json:"policies"`
	Providers     map[string]provider        `json:"providers"`
	DefaultPolicy json.RawMessage            `json:"defaultPolicy"`
	Fleet         json.RawMessage            `json:"fleet"`
}

type provider struct {
	RetryPolicy json.RawMessage `json:"retryPolicy"`
	Fleet       json.RawMessage `json:"fleet"`
}

// Parse validates a policy file's YAML (or JSON) content. Unknown keys are
// errors, so a typo never silently falls back to a default.
func Parse(data []byte) (*Policies, error) {
	// Strict: a key given twice is an error, not a silent override.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("config: not valid YAML: %w", err)
	}
	var f file
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config: %w", err)
	}
	ps := Default()
	ps.named = make(map[string]*policy.Policy, len(f.Policies))
	ps.providers = make(map[string]*policy.Policy, len(f.Providers))
	var errs []error
	for _, name := range sortedKeys(f.Policies) {
		p, err := parsePolicy("policies."+name, f.Policies[name])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ps.named[name] = p
	}
	base := fleet.DefaultConfig()
	if len(f.Fleet) > 0 && string(f.Fleet) != "null" {
		c, err := parseFleet("fleet", f.Fleet, base)
		if err != nil {
			errs = append(errs, err)
		} else {
			ps.fleet, base = &c, c
		}
	}
	ps.providerFleet = map[string]fleet.Config{}
	for _, name := range sortedKeys(f.Providers) {
		if raw := f.Providers[name].Fleet; len(raw) > 0 && string(raw) != "null" {
			c, err := parseFleet("providers."+name+".fleet", raw, base)
			if err != nil {
				errs = append(errs, err)
			} else {
				ps.providerFleet[name] = c
			}
		}
		field := "providers." + name + ".retryPolicy"
		if len(f.Providers[name].RetryPolicy) == 0 {
			if len(f.Providers[name].Fleet) == 0 {
				errs = append(errs, &FieldError{Field: field, Message: "required (or a fleet block)"})
			}
			continue // the provider keeps the default policy
		}
		p, err := parsePolicy(field, f.Providers[name].RetryPolicy)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ps.providers[name] = p
	}
	if len(f.DefaultPolicy) > 0 && string(f.DefaultPolicy) != "null" {
		p, err := parsePolicy("defaultPolicy", f.DefaultPolicy)
		if err != nil {
			errs = append(errs, err)
		} else {
			ps.fallback = p
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ps, nil
}

// enumPrefixes maps the lower-case enum spellings of the harness's YAML
// ("mode: normal") to the proto enum names.
var enumPrefixes = map[string]string{
	"mode":              "MODE_",
	"jitter":            "JITTER_",
	"retryAfterOverCap": "RETRY_AFTER_OVER_CAP_",
}

// ParsePolicy decodes one policy block (YAML or JSON with camelCase keys).
func ParsePolicy(data []byte) (*retrydv1.RetryPolicy, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("config: not valid YAML: %w", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, fmt.Errorf("config: a policy must be a mapping: %w", err)
	}
	normaliseEnums(raw)
	inferScheduleMode(raw)
	norm, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var p retrydv1.RetryPolicy
	if err := protojson.Unmarshal(norm, &p); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &p, nil
}

// inferScheduleMode makes a block that gives a schedule or a tail delay and
// no mode a schedule-mode policy: the dsh-retry plugin's own block has no
// mode key, and only schedule mode accepts those fields.
func inferScheduleMode(m map[string]any) {
	if _, ok := m["mode"]; ok {
		return
	}
	for _, k := range []string{"schedule", "tailDelayMs", "tail_delay_ms"} {
		if _, ok := m[k]; ok {
			m["mode"] = enumPrefixes["mode"] + "SCHEDULE"
			return
		}
	}
}

func normaliseEnums(m map[string]any) {
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			normaliseEnums(v)
		case string:
			if prefix, ok := enumPrefixes[k]; ok && !strings.HasPrefix(v, prefix) {
				m[k] = prefix + strings.ToUpper(v)
			}
		}
	}
}

func parsePolicy(field string, raw json.RawMessage) (*policy.Policy, error) {
	pb, err := ParsePolicy(raw)
	if err != nil {
		return nil, &FieldError{Field: field, Message: strings.TrimPrefix(err.Error(), "config: ")}
	}
	p, err := policy.Resolve(pb)
	if err != nil {
		var ve *policy.ValidationError
		if errors.As(err, &ve) {
			var written map[string]any
			_ = yaml.Unmarshal(raw, &written) // ParsePolicy decoded it already
			errs := make([]error, len(ve.Violations))
			for i, v := range ve.Violations {
				errs[i] = &FieldError{Field: field + "." + asWritten(written, v.Field), Message: v.Description}
			}
			return nil, errors.Join(errs...)
		}
		return nil, &FieldError{Field: field, Message: err.Error()}
	}
	return p, nil
}

// asWritten spells a policy violation's field path (proto names, such as
// "backoff.initial_delay_ms" or "schedule[2]") the way the block spelled
// it: protojson accepts both snake_case and camelCase keys, so the message
// names the key the user actually typed, and camelCase, the file's own
// style, for a key the block left out.
func asWritten(block map[string]any, path string) string {
	segs := strings.Split(path, ".")
	for i, seg := range segs {
		name, index, _ := strings.Cut(seg, "[")
		camel := snakeToCamel(name)
		spelled := camel
		if _, ok := block[name]; ok {
			spelled = name
		}
		if index != "" {
			spelled += "[" + index
		}
		segs[i] = spelled
		next, _ := block[name].(map[string]any)
		if next == nil {
			next, _ = block[camel].(map[string]any)
		}
		block = next
	}
	return strings.Join(segs, ".")
}

func snakeToCamel(s string) string {
	parts := strings.Split(s, "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
