package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/retryd/retryd/fleet"
)

// fleetBlock is the YAML form of fleet.Config: every field optional, so a
// block states only what it changes. Durations are milliseconds, like the
// policies' delays.
type fleetBlock struct {
	DisableBudget        *bool    `json:"disableBudget"`
	Capacity             *float64 `json:"capacity"`
	RefillPerSecond      *float64 `json:"refillPerSecond"`
	SuccessCredit        *float64 `json:"successCredit"`
	DisableCircuit       *bool    `json:"disableCircuit"`
	WindowMs             *uint64  `json:"windowMs"`
	WindowBuckets        *int     `json:"windowBuckets"`
	MinSamples           *int     `json:"minSamples"`
	FailureThreshold     *float64 `json:"failureThreshold"`
	OpenForMs            *uint64  `json:"openForMs"`
	HalfOpenProbes       *int     `json:"halfOpenProbes"`
	ProbeTimeoutMs       *uint64  `json:"probeTimeoutMs"`
	SpreadWindowMs       *uint64  `json:"spreadWindowMs"`
	MaxFleetRetryAfterMs *uint64  `json:"maxFleetRetryAfterMs"`
}

// maxFleetMs bounds every duration of a fleet block (one day): far beyond
// any sensible setting, and far from overflowing a time.Duration.
const maxFleetMs = 24 * 60 * 60 * 1000

// over returns base with the block's fields applied.
func (b *fleetBlock) over(base fleet.Config) (fleet.Config, error) {
	if b == nil {
		return base, nil
	}
	c := base
	set := func(dst *bool, src *bool) {
		if src != nil {
			*dst = *src
		}
	}
	setF := func(dst *float64, src *float64) {
		if src != nil {
			*dst = *src
		}
	}
	setI := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	var errs []error
	setD := func(field string, dst *time.Duration, src *uint64) {
		switch {
		case src == nil:
		case *src > maxFleetMs:
			errs = append(errs, &FieldError{Field: field, Message: fmt.Sprintf("must be at most %d ms", maxFleetMs)})
		default:
			*dst = time.Duration(*src) * time.Millisecond
		}
	}
	set(&c.DisableBudget, b.DisableBudget)
	setF(&c.Capacity, b.Capacity)
	setF(&c.RefillPerSecond, b.RefillPerSecond)
	setF(&c.SuccessCredit, b.SuccessCredit)
	set(&c.DisableCircuit, b.DisableCircuit)
	setD("windowMs", &c.Window, b.WindowMs)
	setI(&c.WindowBuckets, b.WindowBuckets)
	setI(&c.MinSamples, b.MinSamples)
	setF(&c.FailureThreshold, b.FailureThreshold)
	setD("openForMs", &c.OpenFor, b.OpenForMs)
	setI(&c.HalfOpenProbes, b.HalfOpenProbes)
	setD("probeTimeoutMs", &c.ProbeTimeout, b.ProbeTimeoutMs)
	setD("spreadWindowMs", &c.SpreadWindow, b.SpreadWindowMs)
	setD("maxFleetRetryAfterMs", &c.MaxFleetRetryAfter, b.MaxFleetRetryAfterMs)
	return c, errors.Join(errs...)
}

// yamlNames maps fleet.Config's field names (in its FieldErrors) to the
// file's keys.
var yamlNames = map[string]string{
	"DisableBudget": "disableBudget", "Capacity": "capacity", "RefillPerSecond": "refillPerSecond",
	"SuccessCredit": "successCredit", "DisableCircuit": "disableCircuit", "Window": "windowMs",
	"WindowBuckets": "windowBuckets", "MinSamples": "minSamples", "FailureThreshold": "failureThreshold",
	"OpenFor": "openForMs", "HalfOpenProbes": "halfOpenProbes", "ProbeTimeout": "probeTimeoutMs",
	"SpreadWindow": "spreadWindowMs", "MaxFleetRetryAfter": "maxFleetRetryAfterMs",
}

// parseFleet resolves one fleet block over base and validates the result,
// naming bad fields under path.
func parseFleet(path string, raw json.RawMessage, base fleet.Config) (fleet.Config, error) {
	var b fleetBlock
	if err := decodeStrict(raw, &b); err != nil {
		return fleet.Config{}, &FieldError{Field: path, Message: err.Error()}
	}
	c, err := b.over(base)
	if err := errors.Join(prefixFields(path, err), prefixFields(path, c.Validate())); err != nil {
		return fleet.Config{}, err
	}
	return c, nil
}

// prefixFields turns the field errors joined in err into FieldErrors
// under path, with the file's key names.
func prefixFields(path string, err error) error {
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		var fe *fleet.FieldError
		var ce *FieldError
		switch {
		case errors.As(e, &ce):
			out = append(out, &FieldError{Field: path + "." + ce.Field, Message: ce.Message})
		case errors.As(e, &fe):
			name := yamlNames[fe.Field]
			if name == "" {
				name = fe.Field
			}
			out = append(out, &FieldError{Field: path + "." + name, Message: fmt.Sprintf("%s (got %s)", fe.Reason, fe.Value)})
		default:
			out = append(out, &FieldError{Field: path, Message: e.Error()})
		}
	}
	return errors.Join(out...)
}

// decodeStrict decodes JSON into v, refusing unknown keys.
func decodeStrict(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// HasFleet reports whether the file protects any provider.
func (ps *Policies) HasFleet() bool { return ps.fleet != nil || len(ps.providerFleet) > 0 }

// Fleet returns the fleet protection of provider, and whether it has any:
// a provider's own block over the file's fleet block; none when the file
// has neither.
func (ps *Policies) Fleet(provider string) (fleet.Config, bool) {
	if c, ok := ps.providerFleet[provider]; ok {
		return c, true
	}
	if ps.fleet != nil {
		return *ps.fleet, true
	}
	return fleet.Config{}, false
}

// FleetChange names the first fleet block in which next differs from ps
// ("fleet" or "providers.NAME.fleet"), or returns "" when they protect the
// same providers alike. A server reloading its policy file keeps the fleet
// protection it started with (its budgets and circuits are built from it),
// so it refuses a file whose fleet blocks changed.
func (ps *Policies) FleetChange(next *Policies) string {
	if (ps.fleet == nil) != (next.fleet == nil) || ps.fleet != nil && *ps.fleet != *next.fleet {
		return "fleet"
	}
	for _, name := range sortedKeys(ps.providerFleet) {
		if c, ok := next.providerFleet[name]; !ok || c != ps.providerFleet[name] {
			return "providers." + name + ".fleet"
		}
	}
	for _, name := range sortedKeys(next.providerFleet) {
		if _, ok := ps.providerFleet[name]; !ok {
			return "providers." + name + ".fleet"
		}
	}
	return ""
}
