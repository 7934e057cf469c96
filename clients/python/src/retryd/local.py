"""The client's own decisions while no retryd replica answers (degraded
mode): the server's policy engine (retryd.policy) over retry chains kept in
this process, per (session, provider, policy key), bounded in number, with
a conservative cap on how many retries a chain may take locally.

What it produces has the server's shapes: a FailedStepResponse whose event
is a scheduled or delegated Event, RetryStarted confirmations and
ChainClosed records. A local record is marked so nobody mistakes it for the
server's, as the TypeScript client's: its sequence is 0 (the server numbers
its log from 1), a local retry id starts with "local-", and the detail of a
local schedule or delegation starts with "decided locally".
"""

from __future__ import annotations

import functools
import random
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, cast

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from . import policy as P
from google.rpc import error_details_pb2, status_pb2
from .v1 import events_pb2, policy_pb2, retry_service_pb2 as pb

#: The prefix of every retry id the client made up itself.
LOCAL_RETRY_ID_PREFIX = "local-"
#: The prefix of the detail of every local schedule and delegation.
LOCAL_DETAIL_PREFIX = "decided locally"
#: How many local chains the client keeps by default (least recently used go first).
DEFAULT_LOCAL_MAX_CHAINS = 10_000
#: How many retries one chain of an unlimited policy may take locally by default.
DEFAULT_LOCAL_RETRY_BUDGET = 5

R = events_pb2


def is_local(x: "events_pb2.Event | str") -> bool:
    """Whether an event (or a retry id) was made by the client in degraded
    mode rather than by retryd."""
    if isinstance(x, str):
        return x.startswith(LOCAL_RETRY_ID_PREFIX)
    kind = x.WhichOneof("kind")
    if x.sequence != 0:
        return False
    if kind in ("scheduled", "started", "cancelled"):
        return bool(getattr(x, kind).retry_id.startswith(LOCAL_RETRY_ID_PREFIX))
    if kind == "delegated":
        return bool(x.delegated.detail.startswith(LOCAL_DETAIL_PREFIX))
    return bool(kind == "closed")


class LocalRpcError(grpc.RpcError):
    """A refusal the local decider makes as the server would (an invalid
    policy, an unknown policy name): a grpc.RpcError with the code and the
    google.rpc details the server would send, so the error helpers
    (field_violations, ...) read it alike."""

    def __init__(self, code: grpc.StatusCode, message: str, details: Sequence[object] = ()) -> None:
        super().__init__(message)
        self._code = code
        self._message = message
        st = status_pb2.Status(code=code.value[0], message=message)
        for d in details:
            a = any_pb2.Any()
            a.Pack(cast(Message, d))
            st.details.append(a)
        self._trailers = (("grpc-status-details-bin", st.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> Any:
        return self._trailers

    def __str__(self) -> str:
        return f"retryd (local): {self._code.name}: {self._message}"


def _invalid_argument(violations: List[Tuple[str, str]]) -> LocalRpcError:
    br = error_details_pb2.BadRequest()
    for f, d in violations:
        br.field_violations.add(field=f, description=d)
    return LocalRpcError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid request: " + "; ".join(f"{f}: {d}" for f, d in violations),
        [br],
    )


@dataclass
class _Chain:
    session: str
    provider: str
    policy_key: str
    mode: "policy_pb2.Mode"
    retries: int
    open: bool
    # The last step decided locally and its answer: the same step reported
    # again gets the same decision, as from the server.
    last_step: Optional[Tuple[int, int, int]] = None
    last: Optional[pb.FailedStepResponse] = None


@dataclass
class _Retry:
    id: str
    session: str
    turn: int
    step: int
    retry_number: int
    due_ms: float
    chain: str
    status: Literal["pending", "started", "cancelled"]
    started: Optional[events_pb2.RetryStarted] = None
    cancelled: Optional[events_pb2.RetryCancelled] = None


def _ts(ms: float) -> Timestamp:
    t = Timestamp()
    t.FromNanoseconds(int(ms * 1_000_000))
    return t


@functools.lru_cache(maxsize=1024)
def policy_proto(p: P.ResolvedPolicy) -> policy_pb2.RetryPolicy:
    """The resolved policy with every field explicit, as the server records
    it in scheduled events. Cached: copy it, never change it."""
    out = policy_pb2.RetryPolicy(
        mode=p.mode, retryable_codes=list(p.codes), retry_after_over_cap=p.over_cap, min_attempt_ms=p.min_attempt_ms
    )
    if p.bounded:
        out.max_retries = p.max_retries
    if p.mode == policy_pb2.MODE_SCHEDULE:
        out.schedule.extend(p.schedule)
        out.tail_delay_ms = p.tail_delay_ms
    else:
        out.backoff.CopyFrom(
            policy_pb2.Backoff(
                initial_delay_ms=p.initial_delay_ms,
                max_delay_ms=p.max_delay_ms,
                multiplier=p.multiplier,
                jitter_ratio=p.jitter_ratio,
                jitter=p.jitter,
            )
        )
    return out


class LocalDecider:
    """Decides failed steps as retryd would, from chains it keeps in this
    process. Thread-safe; pure apart from its clock, jitter source and id
    generator, which the arguments can replace.

    policies: the server's named policies (its policy file's policies), so
    a report by policy_name can be decided locally; a name missing here is
    refused with INVALID_ARGUMENT (policy_name). provider_policies: the
    server's per-provider defaults, for reports without a policy (else the
    built-in default). max_retries: the most retries one chain may take
    locally under a bounded policy, min(this, the policy's budget); default
    the policy's own. retry_budget: the most retries one chain may take
    locally under an unlimited policy (always mode, schedule mode without
    max_retries), whose delays stay the policy's. max_chains: how many
    chains to keep (least recently used go first)."""

    def __init__(
        self,
        *,
        policies: Optional[Mapping[str, policy_pb2.RetryPolicy]] = None,
        provider_policies: Optional[Mapping[str, policy_pb2.RetryPolicy]] = None,
        max_retries: Optional[int] = None,
        retry_budget: float = DEFAULT_LOCAL_RETRY_BUDGET,
        max_chains: int = DEFAULT_LOCAL_MAX_CHAINS,
        rand: P.Rand = random.random,
        now_ms: Callable[[], float] = lambda: time.time() * 1000,
    ) -> None:
        self._policies = dict(policies or {})
        self._provider_policies = dict(provider_policies or {})
        self._max_retries = max_retries
        self._retry_budget = retry_budget
        self._max_chains = max(1, max_chains)
        self._rand = rand
        self.now_ms = now_ms
        self._lock = threading.Lock()
        self._chains: "OrderedDict[str, _Chain]" = OrderedDict()
        self._retries: "OrderedDict[str, _Retry]" = OrderedDict()
        self._resolved: Dict[bytes, P.ResolvedPolicy] = {}

    @property
    def chain_count(self) -> int:
        """How many chains it holds (at most max_chains)."""
        with self._lock:
            return len(self._chains)

    def failed_step(self, req: pb.FailedStepRequest) -> pb.FailedStepResponse:
        """Decides one failed step. Raises LocalRpcError INVALID_ARGUMENT
        with the server's field paths for an invalid inline policy or an
        unknown policy name."""
        with self._lock:
            return self._failed_step(req)

    def _failed_step(self, req: pb.FailedStepRequest) -> pb.FailedStepResponse:
        now = self.now_ms()
        policy = self._policy_of(req)
        phase = R.DOWNSTREAM_NOT_ASKED if req.downstream == R.DOWNSTREAM_UNSPECIFIED else req.downstream
        if policy is None:
            return _delegated(req, now, phase, R.DELEGATE_REASON_NO_PROVIDER,
                              "the failure happened before any provider adapter was selected")
        key = "\x00".join((req.session_id, req.provider, policy.key))
        chain = self._chains.get(key)
        if chain is not None:
            self._chains.move_to_end(key)
        step_key = (req.turn, req.step, int(phase))
        if chain is not None and chain.last is not None and chain.last_step == step_key:
            return chain.last
        resp = self._decide(req, now, phase, policy, key, chain)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._add_chain(key, _Chain(req.session_id, req.provider, policy.key, policy.mode, 0, False))
        chain.last_step, chain.last = step_key, resp
        return resp

    def _add_chain(self, key: str, chain: _Chain) -> _Chain:
        self._chains[key] = chain
        while len(self._chains) > self._max_chains:
            self._chains.popitem(last=False)
        return chain

    def _decide(
        self,
        req: pb.FailedStepRequest,
        now: float,
        phase: "events_pb2.Downstream",
        policy: P.ResolvedPolicy,
        key: str,
        chain: Optional[_Chain],
    ) -> pb.FailedStepResponse:
        used = chain.retries if chain is not None and chain.open else 0
        d = P.decide(
            policy,
            P.Attempt(
                retries=used,
                code=req.failure.code,
                retry_after=P.failure_retry_after(req.failure, now),
                downstream=phase,
                replay=req.replay,
                deadline_ms=req.deadline.ToNanoseconds() / 1e6 if req.HasField("deadline") else None,
            ),
            now,
            self._rand,
        )
        if not d.schedule:
            if d.reason == R.DELEGATE_REASON_BUDGET_EXHAUSTED and chain is not None and chain.open:
                chain.open = False
            return _delegated(req, now, phase, d.reason, d.detail, policy)
        cap = self._cap(policy)
        if used >= cap:
            if chain is not None and chain.open:
                chain.open = False
            return _delegated(
                req, now, phase, R.DELEGATE_REASON_BUDGET_EXHAUSTED,
                f"{used} of {_num(cap)} retries used: the local cap while no retryd replica answers", policy,
            )
        if chain is None:
            chain = self._add_chain(key, _Chain(req.session_id, req.provider, policy.key, policy.mode, 0, False))
        if not chain.open:
            chain.open, chain.retries = True, 0
        chain.retries = d.retry_number
        retry = _Retry(
            id=LOCAL_RETRY_ID_PREFIX + uuid.uuid4().hex, session=req.session_id, turn=req.turn, step=req.step,
            retry_number=d.retry_number, due_ms=now + d.delay_ms, chain=key, status="pending",
        )
        self._retries[retry.id] = retry
        while len(self._retries) > 4 * self._max_chains:
            self._retries.popitem(last=False)
        detail = f"{LOCAL_DETAIL_PREFIX}: no retryd replica answered"
        sc = pb.Schedule(
            retry_id=retry.id, retry_number=d.retry_number, delay_ms=d.delay_ms, delay_source=d.source,
            due_at=_ts(retry.due_ms), policy_key=policy.key, mode=policy.mode, detail=detail,
        )
        ev = events_pb2.Event(session_id=req.session_id, time=_ts(now))
        s = ev.scheduled
        s.retry_id, s.turn, s.step, s.logical_turn_id, s.provider = retry.id, req.turn, req.step, req.logical_turn_id, req.provider
        s.mode, s.policy_key, s.retry_number, s.delay_ms, s.delay_source = policy.mode, policy.key, d.retry_number, d.delay_ms, d.source
        s.failure.CopyFrom(req.failure)
        s.due_at.CopyFrom(sc.due_at)
        s.policy.CopyFrom(policy_proto(policy))
        s.detail = detail
        if policy.bounded:
            sc.max_retries = policy.max_retries
            s.max_retries = policy.max_retries
        return pb.FailedStepResponse(decision=pb.Decision(schedule=sc), event=ev)

    def observe(self, req: pb.FailedStepRequest, resp: pb.FailedStepResponse) -> None:
        """Follows a decision of the server's, so that local decisions
        continue from it: a schedule sets its chain's count to the server's
        retry number; a budget_exhausted delegation closed the chain."""
        with self._lock:
            kind = resp.decision.WhichOneof("outcome")
            if kind == "schedule":
                sc = resp.decision.schedule
                key = "\x00".join((req.session_id, req.provider, sc.policy_key))
                chain = self._chains.get(key)
                if chain is None:
                    chain = self._add_chain(key, _Chain(req.session_id, req.provider, sc.policy_key, sc.mode, 0, False))
                else:
                    self._chains.move_to_end(key)
                chain.open, chain.retries, chain.last_step, chain.last = True, sc.retry_number, None, None
            elif kind == "delegate" and resp.decision.delegate.reason == R.DELEGATE_REASON_BUDGET_EXHAUSTED:
                key = "\x00".join((req.session_id, req.provider, resp.event.delegated.policy_key))
                self._chains.pop(key, None)

    def start(self, retry_id: str) -> Optional[events_pb2.RetryStarted]:
        """Starts a local retry once its due time has passed: its
        RetryStarted (again the same for a started retry), or None for an
        unknown or cancelled retry, or one not yet due."""
        with self._lock:
            r = self._retries.get(retry_id)
            now = self.now_ms()
            if r is None or r.status == "cancelled" or now < r.due_ms:
                return None
            if r.started is None:
                r.status = "started"
                r.started = events_pb2.RetryStarted(
                    retry_id=r.id, turn=r.turn, step=r.step, retry_number=r.retry_number, started_at=_ts(max(now, r.due_ms))
                )
            return r.started

    def state(self, retry_id: str) -> Optional[pb.RetryState]:
        """A local retry's state in the server's shape, or None when unknown."""
        with self._lock:
            r = self._retries.get(retry_id)
            if r is None:
                return None
            st = pb.RetryState(retry_id=r.id, session_id=r.session)
            if r.started is not None:
                st.status = pb.RETRY_STATUS_STARTED
                st.started.CopyFrom(r.started)
            elif r.cancelled is not None:
                st.status = pb.RETRY_STATUS_CANCELLED
                st.cancelled.CopyFrom(r.cancelled)
            else:
                st.status = pb.RETRY_STATUS_PENDING
            return st

    def due_ms(self, retry_id: str) -> Optional[float]:
        """The due time of a local retry in ms since the epoch, or None."""
        with self._lock:
            r = self._retries.get(retry_id)
            return None if r is None else r.due_ms

    def cancel(self, retry_id: str) -> Optional[events_pb2.RetryCancelled]:
        """Cancels a pending local retry and closes its chain (as the server
        does); returns its RetryCancelled, or None when it was not pending."""
        with self._lock:
            return self._cancel(retry_id)

    def _cancel(self, retry_id: str) -> Optional[events_pb2.RetryCancelled]:
        r = self._retries.get(retry_id)
        if r is None or r.status != "pending":
            return None
        r.status = "cancelled"
        c = self._chains.get(r.chain)
        if c is not None and c.open and c.retries == r.retry_number:
            c.open = False
        r.cancelled = events_pb2.RetryCancelled(
            retry_id=r.id, reason=R.CANCEL_REASON_REQUESTED, turn=r.turn, step=r.step, retry_number=r.retry_number
        )
        return r.cancelled

    def cancel_session(self, session: str) -> List[str]:
        """Cancels the session's pending local retries and closes its open
        chains; returns the ids of the retries it cancelled."""
        with self._lock:
            ids = [r.id for r in list(self._retries.values()) if r.session == session and self._cancel(r.id) is not None]
            self._close_session(session, R.CLOSE_REASON_CANCELLED)
            return ids

    def step_succeeded(self, session: str) -> List[events_pb2.ChainClosed]:
        """Records a successful step: the session's open local chains close,
        so its next failure starts at retry 1. Returns the closed chains."""
        with self._lock:
            return self._close_session(session, R.CLOSE_REASON_SUCCEEDED)

    def forget(self, session: str) -> None:
        """Forgets the session's local chains and retries (once the server
        answers for it again)."""
        with self._lock:
            for k in [k for k, c in self._chains.items() if c.session == session]:
                del self._chains[k]
            for k in [k for k, r in self._retries.items() if r.session == session]:
                del self._retries[k]

    def knows(self, session: str) -> bool:
        """Whether it holds local state of the session."""
        with self._lock:
            return any(c.session == session for c in self._chains.values()) or any(
                r.session == session for r in self._retries.values()
            )

    def _close_session(self, session: str, reason: "events_pb2.CloseReason") -> List[events_pb2.ChainClosed]:
        chains = sorted(
            (c for c in self._chains.values() if c.session == session and c.open),
            key=lambda c: (c.provider.encode(), c.policy_key.encode()),
        )
        out = []
        for c in chains:
            c.open = False
            out.append(events_pb2.ChainClosed(provider=c.provider, policy_key=c.policy_key, reason=reason, retries=c.retries))
        return out

    def _cap(self, p: P.ResolvedPolicy) -> float:
        if p.bounded:
            return p.max_retries if self._max_retries is None else min(p.max_retries, self._max_retries)
        return self._retry_budget

    def _policy_of(self, req: pb.FailedStepRequest) -> Optional[P.ResolvedPolicy]:
        source = req.WhichOneof("policy_source")
        p: Optional[policy_pb2.RetryPolicy]
        if source == "policy":
            p = req.policy
        elif source == "policy_name":
            named = self._policies.get(req.policy_name)
            if named is None:
                raise _invalid_argument(
                    [("policy_name", f'no policy named "{req.policy_name}" is known to the client in degraded mode')]
                )
            p = named
        else:
            p = self._provider_policies.get(req.provider)
        try:
            out = self._resolve(p)
        except P.PolicyValidationError as err:
            raise _invalid_argument([(f"policy.{v.field}", v.description) for v in err.violations]) from None
        return None if req.provider == "" else out

    def _resolve(self, p: Optional[policy_pb2.RetryPolicy]) -> P.ResolvedPolicy:
        if p is None:
            return P.resolve_policy(None)
        key = p.SerializeToString(deterministic=True)
        hit = self._resolved.get(key)
        if hit is not None:
            return hit
        out = P.resolve_policy(p)
        if len(self._resolved) < 1024:
            self._resolved[key] = out
        return out


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else str(x)


def _delegated(
    req: pb.FailedStepRequest,
    now: float,
    phase: "events_pb2.Downstream",
    reason: "events_pb2.DelegateReason",
    detail: str,
    policy: Optional[P.ResolvedPolicy] = None,
) -> pb.FailedStepResponse:
    local_detail = f"{LOCAL_DETAIL_PREFIX}: {detail}"
    ev = events_pb2.Event(session_id=req.session_id, time=_ts(now))
    d = ev.delegated
    d.turn, d.step, d.provider = req.turn, req.step, req.provider
    d.policy_key = policy.key if policy is not None else ""
    d.mode = policy.mode if policy is not None else policy_pb2.MODE_UNSPECIFIED
    if req.HasField("failure"):
        d.failure.CopyFrom(req.failure)
    d.reason, d.detail, d.downstream = reason, local_detail, phase
    return pb.FailedStepResponse(decision=pb.Decision(delegate=pb.Delegate(reason=reason, detail=local_detail)), event=ev)
