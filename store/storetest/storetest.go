// Package storetest drives a store backend through the rules of package
// store by retry id alone, as the service does for a caller of the
// default tenant, for the backends' own tests.
package storetest

import (
	"context"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
)

// CancelRetry locates the retry's session, then cancels the retry.
func CancelRetry(ctx context.Context, b store.Backend, retryID string) (*retrydv1.CancelRetriesResponse, error) {
	st := store.New(b)
	sessionID, err := st.Locate(ctx, retryID)
	if err != nil {
		return nil, err
	}
	return st.CancelRetry(ctx, sessionID, retryID)
}

// AwaitRetry locates the retry's session, then awaits the retry.
func AwaitRetry(ctx context.Context, b store.Backend, retryID string, send func(*retrydv1.AwaitRetryResponse) error) error {
	st := store.New(b)
	sessionID, err := st.Locate(ctx, retryID)
	if err != nil {
		return err
	}
	return st.AwaitRetry(ctx, sessionID, retryID, send)
}
