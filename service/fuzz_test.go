package service_test

import (
	"context"
	"testing"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/service"
	"github.com/retryd/retryd/store/memory"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// FuzzFailedStep feeds arbitrary wire bytes through the service layer as a
// FailedStepRequest (the path a hostile client takes) and checks that the
// service never panics, that every refusal is a documented status code, and
// that a refused request leaves no event behind.
func FuzzFailedStep(f *testing.F) {
	seeds := []*retrydv1.FailedStepRequest{
		failure("s", 1, 1, "p", "SERVER", nil),
		failure("s", 1, 1, "", "SERVER", nil),
		failure("s", 1, 1, "p", "rate limit", nil),
		failure("s", 1, 1, "p", "HTTP_404", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_SCHEDULE, Schedule: []uint64{1, 2}}),
		failure("s", 1, 1, "p", "AUTH", &retrydv1.RetryPolicy{Mode: retrydv1.Mode_MODE_ALWAYS}),
		failure("s", 1, 1, "p", "SERVER", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: proto.Uint64(0)}}),
		failure("", 0, 0, "p", "", nil),
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req retrydv1.FailedStepRequest
		if err := proto.Unmarshal(data, &req); err != nil {
			return // gRPC refuses undecodable messages before the service sees them
		}
		store := memory.New(memory.Config{})
		defer store.Close()
		svc, err := service.New(store)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := svc.FailedStep(context.Background(), &req)
		if err != nil {
			switch status.Code(err) {
			case codes.InvalidArgument, codes.FailedPrecondition:
			default:
				t.Fatalf("FailedStep(%v): unexpected status %v", &req, err)
			}
			if store.Len() != 0 {
				t.Fatalf("a refused request created a session: %v", err)
			}
			return
		}
		d := resp.GetDecision()
		if (d.GetSchedule() == nil) == (d.GetDelegate() == nil) {
			t.Fatalf("decision must be exactly one of schedule or delegate: %v", d)
		}
		if s := d.GetSchedule(); s != nil && (s.GetDelayMs() > 2147483647 || s.GetRetryNumber() != 1 || s.GetPolicyKey() == "") {
			t.Fatalf("bad schedule for a first failure: %v", s)
		}
		if resp.GetEvent().GetSequence() != 1 {
			t.Fatalf("the decision's event was not logged: %v", resp.GetEvent())
		}
	})
}
