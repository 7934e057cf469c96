package service

import (
	"sync"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Interning bounds: how many distinct values are shared, and the longest
// message worth hashing.
const (
	maxInterned        = 4096
	maxInternedMessage = 256
)

// interner shares the parts of a FailedStep request that stores keep for
// as long as a session lives (in its events, step records and retries) and
// that repeat across sessions: the provider name and the failure. During a
// provider incident thousands of sessions report the same failure; each
// then holds one shared message instead of its own decoded copy. Values
// are compared by content, messages are never modified once stored, and
// only messages without unknown fields are shared (sharing must not add
// or drop anything a caller sent). Both tables stop growing when full:
// later values are kept as decoded. Safe for concurrent use.
type interner struct {
	mu        sync.RWMutex
	providers map[string]string
	failures  map[failureKey]*retrydv1.Failure
}

// failureKey is a Failure's content.
type failureKey struct {
	code, message string
	httpStatus    uint32
	hasRetryAfter bool
	retryAfter    string
	hasProviderMs bool
	providerMs    int64
}

func newInterner() *interner {
	return &interner{providers: make(map[string]string), failures: make(map[failureKey]*retrydv1.Failure)}
}

// intern replaces req's provider and failure with shared equal values.
func (in *interner) intern(req *retrydv1.FailedStepRequest) {
	f := req.GetFailure()
	var key failureKey
	shareFailure := f != nil && len(f.GetMessage()) <= maxInternedMessage && len(f.ProtoReflect().GetUnknown()) == 0
	if shareFailure {
		key = failureKey{code: f.GetCode(), message: f.GetMessage(), httpStatus: f.GetHttpStatus()}
		if f.RetryAfter != nil {
			key.hasRetryAfter, key.retryAfter = true, f.GetRetryAfter()
		}
		if f.ProviderRetryAfterMs != nil {
			key.hasProviderMs, key.providerMs = true, f.GetProviderRetryAfterMs()
		}
	}
	in.mu.RLock()
	provider, knownProvider := in.providers[req.GetProvider()]
	var failure *retrydv1.Failure
	if shareFailure {
		failure = in.failures[key]
	}
	in.mu.RUnlock()
	if !knownProvider || shareFailure && failure == nil {
		in.mu.Lock()
		if !knownProvider {
			if provider, knownProvider = in.providers[req.GetProvider()]; !knownProvider && len(in.providers) < maxInterned {
				provider, knownProvider = req.GetProvider(), true
				in.providers[provider] = provider
			}
		}
		if shareFailure && failure == nil {
			if failure = in.failures[key]; failure == nil && len(in.failures) < maxInterned {
				failure = f
				in.failures[key] = f
			}
		}
		in.mu.Unlock()
	}
	if knownProvider {
		req.Provider = provider
	}
	if failure != nil {
		req.Failure = failure
	}
}
