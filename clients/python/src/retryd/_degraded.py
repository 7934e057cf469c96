"""What both clients keep for degraded mode: the local decider, the retries
they started without retryd, the sessions decided locally since retryd's
last answer, and the decision counter."""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from typing import Dict, Mapping, Optional

import grpc

from ._log import log
from .local import DEFAULT_LOCAL_MAX_CHAINS, DEFAULT_LOCAL_RETRY_BUDGET, LocalDecider
from .v1 import events_pb2, policy_pb2, retry_service_pb2 as pb

#: How long recover() waits for retryd's answer to a FailedStep (gRPC's own
#: retries on UNAVAILABLE included) before it decides locally, in seconds;
#: also how long after a retry's due time it keeps re-attaching before it
#: starts the retry itself.
DEFAULT_DECISION_TIMEOUT = 3.0


def unreachable_code(err: BaseException) -> bool:
    """Whether a FailedStep error (bounded by the decision timeout, while
    the caller's own time has not run out) means that no replica answered."""
    return isinstance(err, grpc.RpcError) and hasattr(err, "code") and err.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


class DegradedState:
    """The process-local side of degraded mode, shared by the threads (or
    tasks) of one client."""

    def __init__(
        self,
        *,
        decision_timeout: float,
        local_policies: Mapping[str, policy_pb2.RetryPolicy],
        local_retry_budget: Optional[int],
        local_chains: int,
    ) -> None:
        self.decision_timeout = decision_timeout
        # Policies by policy_name and by provider, as Go's WithLocalPolicies.
        self.decider = LocalDecider(
            policies=local_policies,
            provider_policies=local_policies,
            max_retries=local_retry_budget,
            retry_budget=DEFAULT_LOCAL_RETRY_BUDGET if local_retry_budget is None else local_retry_budget,
            max_chains=local_chains or DEFAULT_LOCAL_MAX_CHAINS,
        )
        self._max = max(1, local_chains or DEFAULT_LOCAL_MAX_CHAINS)
        self._lock = threading.Lock()
        # Retry ids of the server's that the client started by itself.
        self._started: "OrderedDict[str, str]" = OrderedDict()
        # Sessions with a local decision since retryd's last answer.
        self._degraded: "OrderedDict[str, None]" = OrderedDict()
        self._counts: "Counter[str]" = Counter()
        # Whether the last decision was local: the degraded-mode
        # transitions are logged once each way, not per call.
        self._local = False

    def count(self, decision: str, local: bool) -> None:
        with self._lock:
            self._counts[decision + ("/local" if local else "")] += 1

    def counts(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def decide(self, req: pb.FailedStepRequest, cause: Optional[BaseException] = None) -> pb.FailedStepResponse:
        """A local decision (LocalDecider.failed_step), counted; the session
        is then degraded until retryd answers for it."""
        resp = self.decider.failed_step(req)
        with self._lock:
            entered, self._local = not self._local, True
        if entered:
            log.warning(
                "retryd: no replica answered within %.3gs (%s): deciding locally (degraded mode)",
                self.decision_timeout,
                _code(cause),
            )
        with self._lock:
            self._degraded[req.session_id] = None
            while len(self._degraded) > self._max:
                self._degraded.popitem(last=False)
            self._counts[str(resp.decision.WhichOneof("outcome")) + "/local"] += 1
        return resp

    def observe(self, req: pb.FailedStepRequest, resp: pb.FailedStepResponse) -> None:
        """Follows a server decision (see LocalDecider.observe)."""
        self.decider.observe(req, resp)
        with self._lock:
            left, self._local = self._local, False
        if left:
            log.info("retryd: retryd answers again: decisions are the server's (degraded mode over)")
        with self._lock:
            self._degraded.pop(req.session_id, None)
            self._counts[str(resp.decision.WhichOneof("outcome"))] += 1

    def started_locally(self, session: str, retry_id: str, cause: Optional[BaseException] = None) -> None:
        log.warning(
            "retryd: AwaitRetry %s could not re-attach until %.3gs past its due time (%s): starting the retry locally",
            retry_id,
            self.decision_timeout,
            _code(cause),
        )
        with self._lock:
            self._started[retry_id] = session
            while len(self._started) > self._max:
                self._started.popitem(last=False)
            self._counts["start/local"] += 1

    def resolved(self, retry_id: str) -> None:
        with self._lock:
            self._started.pop(retry_id, None)

    def owns_pending(self, session: str, retry_id: str) -> bool:
        """Whether a RETRY_PENDING for retry_id is the server's side of
        something the client already did without it: a retry of the
        server's it started by itself, or a report the server scheduled
        while the client, without its answer, decided locally."""
        with self._lock:
            return retry_id in self._started or session in self._degraded

    def close_session(self, session: str) -> None:
        """StepSucceeded or CancelSession: the session's local chains close."""
        self.decider.forget(session)
        with self._lock:
            self._degraded.pop(session, None)
            for rid in [r for r, s in self._started.items() if s == session]:
                del self._started[rid]


def local_started(schedule: pb.Schedule, scheduled: events_pb2.RetryScheduled) -> events_pb2.RetryStarted:
    """The start the client records for a retry of the server's it starts
    by itself (its AwaitRetry could not re-attach after the due time)."""
    st = events_pb2.RetryStarted(
        retry_id=schedule.retry_id, turn=scheduled.turn, step=scheduled.step, retry_number=schedule.retry_number
    )
    st.started_at.FromNanoseconds(time.time_ns())
    return st


def _code(err: Optional[BaseException]) -> str:
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        return str(err.code().name)
    return type(err).__name__ if err is not None else "no answer"
