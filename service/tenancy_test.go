package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"github.com/retryd/retryd/invariant"
	"github.com/retryd/retryd/tenant"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// testTenantKey is metadata the harness's server turns into the caller's
// tenant, standing in for the auth interceptors (tested with the binary in
// package auth) so that tenancy is tested on every store.
const testTenantKey = "x-test-tenant"

func testTenant(ctx context.Context) context.Context {
	if v := metadata.ValueFromIncomingContext(ctx, testTenantKey); len(v) == 1 {
		return tenant.NewContext(ctx, &tenant.Tenant{ID: v[0]})
	}
	return ctx
}

func testTenantUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(testTenant(ctx), req)
}

type tenantStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s tenantStream) Context() context.Context { return s.ctx }

func testTenantStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, tenantStream{ss, testTenant(ss.Context())})
}

func as(id string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), testTenantKey, id)
}

// noScope fails the test when msg shows a tenant-qualified id.
func noScope(t *testing.T, what string, msg proto.Message) {
	t.Helper()
	if text := prototext.Format(msg); strings.Contains(text, "\x1f") || strings.Contains(text, `\037`) {
		t.Errorf("%s shows a qualified id: %s", what, text)
	}
}

// TestTenantIsolation: the same session id in two tenants is two
// sessions, and one tenant cannot read, await, cancel or watch the other's
// retries; every refusal is the one an unknown id gets.
func TestTenantIsolation(t *testing.T) {
	eachBackend(t, harnessOpts{}, func(t *testing.T, h *harness) {
		c := h.client
		schedule := func(ctx context.Context, session string) *retrydv1.Schedule {
			t.Helper()
			resp, err := c.FailedStep(ctx, failure(session, 1, 1, "deepseek", "RATE_LIMIT", fast(9_000)))
			if err != nil {
				t.Fatalf("FailedStep: %v", err)
			}
			noScope(t, "FailedStep response", resp)
			if got := resp.GetEvent().GetSessionId(); got != session {
				t.Errorf("event session id %q, want %q", got, session)
			}
			return resp.GetDecision().GetSchedule()
		}
		a, b := as("team-a"), as("team-b")
		sa := schedule(a, "s1")
		sb := schedule(b, "s1")
		onlyA := schedule(a, "only-a")
		if sa.GetRetryNumber() != 1 || sb.GetRetryNumber() != 1 {
			t.Fatalf("retry numbers %d and %d: the tenants' s1 are not two sessions", sa.GetRetryNumber(), sb.GetRetryNumber())
		}
		if sa.GetRetryId() == sb.GetRetryId() {
			t.Fatal("two tenants got one retry id")
		}

		// Every refusal equals the unknown id's: existence is not revealed.
		unknownRetry := "AAAAAAAAAAAAAAAAAAAAAAAAAA"
		same := func(what string, got, unknown error, want codes.Code) {
			t.Helper()
			if status.Code(got) != want {
				t.Errorf("%s: got %v, want %v", what, got, want)
				return
			}
			gm := strings.ReplaceAll(status.Convert(got).Message(), onlyA.GetRetryId(), "ID")
			gm = strings.ReplaceAll(gm, "only-a", "ID")
			um := strings.ReplaceAll(status.Convert(unknown).Message(), unknownRetry, "ID")
			um = strings.ReplaceAll(um, "nobody", "ID")
			if gm != um {
				t.Errorf("%s: message %q differs from an unknown id's %q", what, gm, um)
			}
		}
		_, err := c.CancelRetries(b, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: onlyA.GetRetryId()}})
		_, unknown := c.CancelRetries(b, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_RetryId{RetryId: unknownRetry}})
		same("CancelRetries(other tenant's retry)", err, unknown, codes.NotFound)

		_, err = c.CancelRetries(b, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "only-a"}})
		_, unknown = c.CancelRetries(b, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "nobody"}})
		same("CancelRetries(other tenant's session)", err, unknown, codes.NotFound)

		_, err = c.GetChains(b, &retrydv1.GetChainsRequest{SessionId: "only-a"})
		_, unknown = c.GetChains(b, &retrydv1.GetChainsRequest{SessionId: "nobody"})
		same("GetChains(other tenant's session)", err, unknown, codes.NotFound)

		ctx, cancel := context.WithTimeout(b, 10*time.Second)
		defer cancel()
		await := func(id string) error {
			stream, err := c.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: id})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}
		same("AwaitRetry(other tenant's retry)", await(onlyA.GetRetryId()), await(unknownRetry), codes.NotFound)

		// The default tenant (no authentication) is a tenant like the others.
		_, err = c.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: "only-a"})
		if status.Code(err) != codes.NotFound {
			t.Errorf("default tenant GetChains(team-a's session): %v, want NotFound", err)
		}
		if _, err := c.StepSucceeded(b, &retrydv1.StepSucceededRequest{SessionId: "only-a", Turn: 2, Step: 1, Provider: "deepseek"}); err != nil {
			t.Fatalf("StepSucceeded: %v", err)
		}

		// Nothing of team-a changed: its retry is pending, its chains open.
		chains, err := c.GetChains(a, &retrydv1.GetChainsRequest{SessionId: "only-a"})
		if err != nil {
			t.Fatalf("GetChains: %v", err)
		}
		noScope(t, "GetChains response", chains)
		if len(chains.GetChains()) != 1 || !chains.GetChains()[0].GetOpen() ||
			chains.GetChains()[0].GetLatest().GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			t.Fatalf("team-a's chain changed under team-b's calls: %v", chains)
		}
		if got := chains.GetChains()[0].GetLatest().GetSessionId(); got != "only-a" {
			t.Errorf("chain's retry session id %q, want only-a", got)
		}

		// Each tenant's log holds its own events only, under its own ids;
		// the default tenant's holds none of theirs.
		for _, tc := range []struct {
			ctx      context.Context
			sessions []string
		}{{a, []string{"s1", "only-a"}}, {b, []string{"s1"}}, {context.Background(), nil}} {
			evs, err := retrydtest.Events(tc.ctx, h.conn, "")
			if err != nil {
				t.Fatalf("WatchEvents: %v", err)
			}
			seen := map[string]bool{}
			for _, ev := range evs {
				noScope(t, "event", ev)
				seen[ev.GetSessionId()] = true
			}
			if len(seen) != len(tc.sessions) {
				t.Errorf("log shows sessions %v, want %v", seen, tc.sessions)
			}
			for _, s := range tc.sessions {
				if !seen[s] {
					t.Errorf("log misses session %s: %v", s, seen)
				}
			}
			for _, v := range invariant.Check(evs) {
				t.Errorf("invariant violation: %s", v)
			}
		}
		evs, err := retrydtest.Events(b, h.conn, "only-a")
		if err != nil || len(evs) != 0 {
			t.Errorf("team-b watching team-a's session: %d events, %v", len(evs), err)
		}

		// Cancelling by session in one tenant leaves the other's s1 alone.
		resp, err := c.CancelRetries(b, &retrydv1.CancelRetriesRequest{Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: "s1"}})
		if err != nil || len(resp.GetRetries()) != 1 || resp.GetRetries()[0].GetRetryId() != sb.GetRetryId() {
			t.Fatalf("team-b cancelling its s1: %v %v", resp, err)
		}
		noScope(t, "CancelRetries response", resp)
		chains, err = c.GetChains(a, &retrydv1.GetChainsRequest{SessionId: "s1"})
		if err != nil || chains.GetChains()[0].GetLatest().GetStatus() != retrydv1.RetryStatus_RETRY_STATUS_PENDING {
			t.Fatalf("team-a's s1 after team-b cancelled its own: %v %v", chains, err)
		}
	})
}
