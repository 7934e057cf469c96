package await_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store/await"
)

// fakeStore is a store's primitives as function fields; calls records
// which ran, in order.
type fakeStore struct {
	look, attached await.View
	startErr       error
	term           *retrydv1.AwaitRetryResponse
	calls          []string
}

func (f *fakeStore) Look(context.Context) (await.View, error) {
	f.calls = append(f.calls, "look")
	return f.look, nil
}

func (f *fakeStore) Attach(context.Context) (await.Awaiter, await.View, error) {
	f.calls = append(f.calls, "attach")
	return f, f.attached, nil
}

func (f *fakeStore) Start(context.Context) error {
	f.calls = append(f.calls, "start")
	return f.startErr
}

func (f *fakeStore) Wait(context.Context) (*retrydv1.AwaitRetryResponse, error) {
	f.calls = append(f.calls, "wait")
	return f.term, nil
}

func (f *fakeStore) Detach() { f.calls = append(f.calls, "detach") }

var (
	now     = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pending = &retrydv1.RetryState{RetryId: "r1", Status: retrydv1.RetryStatus_RETRY_STATUS_PENDING}
	started = &retrydv1.AwaitRetryResponse{Message: &retrydv1.AwaitRetryResponse_Started{Started: &retrydv1.RetryStarted{RetryId: "r1"}}}
)

// TestRetry: the protocol's order of calls and messages for a retry that
// ended already, one not yet due, one due, and one whose start cannot be
// recorded.
func TestRetry(t *testing.T) {
	t.Parallel()
	endedState := &retrydv1.RetryState{RetryId: "r1", Status: retrydv1.RetryStatus_RETRY_STATUS_STARTED}
	for _, tc := range []struct {
		name      string
		store     fakeStore
		wantCalls []string
		wantSent  []string
		wantErr   bool
	}{
		{"ended", fakeStore{look: await.View{State: endedState, Terminal: started}},
			[]string{"look"}, []string{"state", "started"}, false},
		{"not due", fakeStore{look: await.View{State: pending, Due: now.Add(time.Second)},
			attached: await.View{State: pending, Due: now.Add(time.Second)}, term: started},
			[]string{"look", "attach", "wait", "detach"}, []string{"state", "started"}, false},
		{"due", fakeStore{look: await.View{State: pending, Due: now},
			attached: await.View{State: pending, Due: now}, term: started},
			[]string{"look", "attach", "start", "wait", "detach"}, []string{"state", "started"}, false},
		{"start not recorded", fakeStore{look: await.View{State: pending, Due: now},
			attached: await.View{State: pending, Due: now}, startErr: errors.New("unavailable")},
			[]string{"look", "attach", "start", "detach"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := tc.store
			var sent []string
			err := await.Retry(context.Background(), &f, func() time.Time { return now },
				func(r *retrydv1.AwaitRetryResponse) error {
					switch {
					case r.GetState() != nil:
						sent = append(sent, "state")
					case r.GetStarted() != nil:
						sent = append(sent, "started")
					}
					return nil
				})
			if (err != nil) != tc.wantErr {
				t.Errorf("err %v, want an error: %v", err, tc.wantErr)
			}
			if !slices.Equal(f.calls, tc.wantCalls) {
				t.Errorf("calls %v, want %v", f.calls, tc.wantCalls)
			}
			if !slices.Equal(sent, tc.wantSent) {
				t.Errorf("sent %v, want %v", sent, tc.wantSent)
			}
		})
	}
}
