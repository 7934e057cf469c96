package redis

import (
	"github.com/retryd/retryd/engine"
	"github.com/retryd/retryd/store"
)

// decide is FailedStep's transition for a group commit's request; it
// leaves its outcome in out.
func decide(f engine.Failure, out *engine.FailOutcome) func(*txn) error {
	return func(t *txn) error {
		var err error
		*out, err = store.Fail(t, f)
		return err
	}
}
