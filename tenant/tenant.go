// Package tenant carries the authenticated caller of an RPC from the
// authentication interceptors to the service layer. It has no
// dependencies so that both sides, and the stores, can share it.
package tenant

import (
	"context"
	"slices"
	"strings"
)

// Default is the id of the one tenant everything runs as when
// authentication is disabled.
const Default = ""

// Separator joins a tenant's id and a session id into the session id the
// stores keep, "TENANT\x1fSESSION". It is a control character, which the
// service refuses in every id a caller sends, so a qualified id can never
// be forged and two tenants' ids can never collide. The default tenant's
// ids are stored as sent.
const Separator = "\x1f"

// Split splits a stored session id into its tenant (Default for the
// default tenant) and the id the tenant knows.
func Split(stored string) (tenantID, sessionID string) {
	if t, s, ok := strings.Cut(stored, Separator); ok {
		return t, s
	}
	return Default, stored
}

// Tenant is an authenticated caller: its id, and the providers and named
// policies it may use (nil means any).
type Tenant struct {
	// ID names the tenant; all of its state is namespaced by it.
	ID string
	// Providers, when not nil, lists the providers the caller may report
	// failures and successes for.
	Providers []string
	// Policies, when not nil, lists the server-configured policy names
	// the caller may select with policy_name.
	Policies []string
}

// AllowsProvider reports whether t may use provider.
func (t *Tenant) AllowsProvider(provider string) bool {
	return t == nil || t.Providers == nil || slices.Contains(t.Providers, provider)
}

// AllowsPolicy reports whether t may select the named policy.
func (t *Tenant) AllowsPolicy(name string) bool {
	return t == nil || t.Policies == nil || slices.Contains(t.Policies, name)
}

type contextKey struct{}

// NewContext returns a copy of ctx that carries t.
func NewContext(ctx context.Context, t *Tenant) context.Context {
	return context.WithValue(ctx, contextKey{}, t)
}

// FromContext returns the tenant ctx carries, or nil when the call was
// not authenticated (authentication disabled: the default tenant).
func FromContext(ctx context.Context) *Tenant {
	t, _ := ctx.Value(contextKey{}).(*Tenant)
	return t
}
