package policy

import (
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// A FailedStep report becomes an Attempt in one place, here: the server's
// engine, admission control and the Go client's degraded mode all read a
// report through AttemptOf, so that none of them can read an unset
// downstream phase, replay or deadline differently from the others.

// PhaseOf is the downstream phase a report means: unset is the first
// phase, NOT_ASKED.
func PhaseOf(d retrydv1.Downstream) retrydv1.Downstream {
	if d == retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED {
		return retrydv1.Downstream_DOWNSTREAM_NOT_ASKED
	}
	return d
}

// ReplayOf is the replay safety a report means: unset is SAFE.
func ReplayOf(r retrydv1.Replay) retrydv1.Replay {
	if r == retrydv1.Replay_REPLAY_UNSPECIFIED {
		return retrydv1.Replay_REPLAY_SAFE
	}
	return r
}

// DecidingPhase is a report's downstream phase as far as it decides
// anything under p: PhaseOf(d) in always mode, the only mode with a
// downstream handshake, and DOWNSTREAM_UNSPECIFIED in every other mode and
// when no policy decides (p nil). Two reports of one step that differ only
// in a phase that decides nothing mean the same report.
func (p *Policy) DecidingPhase(d retrydv1.Downstream) retrydv1.Downstream {
	if p == nil || p.Mode != retrydv1.Mode_MODE_ALWAYS {
		return retrydv1.Downstream_DOWNSTREAM_UNSPECIFIED
	}
	return PhaseOf(d)
}

// AttemptOf is the Attempt of a FailedStep report on a chain that has
// already scheduled retries retries; ra is the report's provider delay
// instruction, which the caller interprets once, when the report arrives
// (ProviderRetryAfter). The downstream phase and replay are resolved
// (PhaseOf, ReplayOf), and the deadline is set only when the report has
// one.
func AttemptOf(req *retrydv1.FailedStepRequest, retries uint32, ra RetryAfter) Attempt {
	a := Attempt{
		Retries:    retries,
		Code:       req.GetFailure().GetCode(),
		RetryAfter: ra,
		Downstream: PhaseOf(req.GetDownstream()),
		Replay:     ReplayOf(req.GetReplay()),
	}
	if dl := req.GetDeadline(); dl != nil {
		a.Deadline, a.HasDeadline = dl.AsTime(), true
	}
	return a
}
