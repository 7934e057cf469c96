package service

import (
	"context"
	"strings"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/tenant"
	"google.golang.org/protobuf/proto"
)

// Tenancy namespaces state by qualifying session ids at the edge: the
// stores, the engine and the event log see "TENANT\x1fSESSION", callers see
// only their own SESSION. The separator is a control character, which the
// validator refuses in every id a caller sends, so a qualified id can
// never be forged and two tenants' ids can never collide. The default
// tenant (authentication disabled) has the empty scope: its ids are stored
// as sent, exactly as before tenancy existed, and it cannot see any
// tenant's sessions either.
const scopeSeparator = tenant.Separator

// scopeOf returns the prefix of the calling tenant's session ids.
func scopeOf(ctx context.Context) string {
	t := tenant.FromContext(ctx)
	if t == nil || t.ID == tenant.Default {
		return ""
	}
	return t.ID + scopeSeparator
}

// InScope reports whether the stored (qualified) session id belongs to the
// tenant whose scope this is. Stores call it before they act on a retry id,
// the one kind of id that does not carry its tenant.
func InScope(scope, sessionID string) bool {
	if scope == "" {
		return !strings.Contains(sessionID, scopeSeparator)
	}
	return strings.HasPrefix(sessionID, scope)
}

// SplitSessionID splits a stored session id into its tenant (empty for the
// default tenant) and the id the tenant knows.
func SplitSessionID(stored string) (tenantID, sessionID string) { return tenant.Split(stored) }

// unscoped returns msg as the caller must see it: session ids without the
// scope. With the default scope that is msg itself; otherwise a copy, since
// the stores' messages are shared (event log, retry records) and must not
// change.
func unscoped[M proto.Message](scope string, msg M) M {
	if scope == "" {
		return msg
	}
	c := proto.CloneOf(msg)
	stripSessionIDs(scope, c)
	return c
}

// stripSessionIDs removes scope from every session id in msg, in place.
func stripSessionIDs(scope string, msg proto.Message) {
	switch m := msg.(type) {
	case *retrydv1.Event:
		m.SessionId = strings.TrimPrefix(m.SessionId, scope)
	case *retrydv1.RetryState:
		if m != nil {
			m.SessionId = strings.TrimPrefix(m.SessionId, scope)
		}
	case *retrydv1.FailedStepResponse:
		if m.Event != nil {
			stripSessionIDs(scope, m.Event)
		}
	case *retrydv1.AwaitRetryResponse:
		if st := m.GetState(); st != nil {
			stripSessionIDs(scope, st)
		}
	case *retrydv1.CancelRetriesResponse:
		for _, st := range m.Retries {
			stripSessionIDs(scope, st)
		}
	case *retrydv1.GetChainsResponse:
		for _, c := range m.Chains {
			if c.Latest != nil {
				stripSessionIDs(scope, c.Latest)
			}
		}
	}
}
