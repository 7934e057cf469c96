"""The runner of the shared conformance vectors (testdata/conformance/*.json,
schema in its README.md): it plays each step through a retryd client
against a live retryd and checks the expectations, as the Go
(clients/go/conformance_test.go) and TypeScript (clients/ts/test/vectors.ts)
runners do with the same files."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol

import grpc
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

import retryd
from retryd.v1 import events_pb2, policy_pb2, retry_service_pb2 as pb

STEP_KEYS = {"op", "comment", "request", "deadlineInMs", "save", "abortAfterMs", "retry", "retryId", "sessionId", "expect"}
EXPECT_KEYS = {
    "error", "decision", "outcome", "retryNumber", "maxRetries", "delayMs", "delayMsMin", "delayMsMax", "delaySource",
    "mode", "policyKey", "reason", "sameRetryAs", "line", "cancelReason", "terminal", "retries",
    "delegationsCancelled", "closed",
}
VECTOR_KEYS = {"name", "description", "session", "steps"}


def vector_dir(root: Path) -> Path:
    return root / "testdata" / "conformance"


def load_vectors(root: Path) -> List[Dict[str, Any]]:
    """Every vector, sorted by file name, with its shape checked."""
    out = []
    for f in sorted(vector_dir(root).glob("*.json")):
        v = json.loads(f.read_text())
        _known(f.name, v, VECTOR_KEYS)
        assert v["name"] + ".json" == f.name, f"{f.name}: name must match the file name"
        assert v.get("session"), f"{f.name}: session is required"
        assert isinstance(v.get("steps"), list) and v["steps"], f"{f.name}: steps are required"
        for i, s in enumerate(v["steps"]):
            _known(f"{f.name} step {i + 1}", s, STEP_KEYS)
            _known(f"{f.name} step {i + 1} expect", s["expect"], EXPECT_KEYS)
        out.append(v)
    return out


def _known(where: str, obj: Dict[str, Any], keys: set) -> None:  # type: ignore[type-arg]
    for k in obj:
        assert k in keys, f"{where}: unknown key {k!r}"


class VectorClient(Protocol):
    """The calls the runner makes, each with a timeout in seconds."""

    def failed_step(self, req: pb.FailedStepRequest, timeout: float) -> pb.FailedStepResponse: ...
    def recover(self, req: pb.FailedStepRequest, timeout: float) -> retryd.Outcome: ...
    def await_retry(self, retry_id: str, timeout: float) -> pb.AwaitRetryResponse: ...
    def cancel_retry(self, retry_id: str, timeout: float) -> pb.CancelRetriesResponse: ...
    def cancel_session(self, session_id: str, timeout: float) -> pb.CancelRetriesResponse: ...
    def step_succeeded(self, req: pb.StepSucceededRequest, timeout: float) -> pb.StepSucceededResponse: ...


class SyncVectorClient:
    """The runner's calls through retryd.Client."""

    def __init__(self, client: retryd.Client) -> None:
        self.c = client

    def failed_step(self, req: pb.FailedStepRequest, timeout: float) -> pb.FailedStepResponse:
        return self.c.failed_step(req, timeout=timeout)

    def recover(self, req: pb.FailedStepRequest, timeout: float) -> retryd.Outcome:
        return self.c.recover(req, timeout=timeout)

    def await_retry(self, retry_id: str, timeout: float) -> pb.AwaitRetryResponse:
        return self.c.await_retry(retry_id, timeout=timeout)

    def cancel_retry(self, retry_id: str, timeout: float) -> pb.CancelRetriesResponse:
        return self.c.cancel_retry(retry_id, timeout=timeout)

    def cancel_session(self, session_id: str, timeout: float) -> pb.CancelRetriesResponse:
        return self.c.cancel_session(session_id, timeout=timeout)

    def step_succeeded(self, req: pb.StepSucceededRequest, timeout: float) -> pb.StepSucceededResponse:
        return self.c.step_succeeded(req, timeout=timeout)


class AsyncVectorClient:
    """The runner's calls through retryd.AsyncClient, each run to completion
    on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: retryd.AsyncClient) -> None:
        self.loop = loop
        self.c = client

    def failed_step(self, req: pb.FailedStepRequest, timeout: float) -> pb.FailedStepResponse:
        return self.loop.run_until_complete(self.c.failed_step(req, timeout=timeout))

    def recover(self, req: pb.FailedStepRequest, timeout: float) -> retryd.Outcome:
        return self.loop.run_until_complete(self.c.recover(req, timeout=timeout))

    def await_retry(self, retry_id: str, timeout: float) -> pb.AwaitRetryResponse:
        return self.loop.run_until_complete(self.c.await_retry(retry_id, timeout=timeout))

    def cancel_retry(self, retry_id: str, timeout: float) -> pb.CancelRetriesResponse:
        return self.loop.run_until_complete(self.c.cancel_retry(retry_id, timeout=timeout))

    def cancel_session(self, session_id: str, timeout: float) -> pb.CancelRetriesResponse:
        return self.loop.run_until_complete(self.c.cancel_session(session_id, timeout=timeout))

    def step_succeeded(self, req: pb.StepSucceededRequest, timeout: float) -> pb.StepSucceededResponse:
        return self.loop.run_until_complete(self.c.step_succeeded(req, timeout=timeout))


@dataclass
class Saved:
    schedule: pb.Schedule
    turn: int
    step: int


def _enum(desc: Any, n: int) -> str:
    try:
        return str(desc.Name(n))
    except ValueError:
        return f"{desc.DESCRIPTOR.full_name}({n})"


def _nanos(ts: Timestamp) -> int:
    return int(ts.seconds) * 1_000_000_000 + int(ts.nanos)


CALL_TIMEOUT = 30.0


def run_vector(client: VectorClient, v: Dict[str, Any]) -> None:
    """Plays one vector against a live server through client."""
    saved: Dict[str, Saved] = {}

    def lookup(where: str, name: str) -> Saved:
        assert name in saved, f"{where}: no retry saved as {name!r}"
        return saved[name]

    for i, step in enumerate(v["steps"]):
        op = step["op"]
        where = f"{v['name']} step {i + 1} ({op}{': ' + step['comment'] if step.get('comment') else ''})"
        exp = step["expect"]
        if op == "failedStep":
            req = _failed_step_request(v, step)
            try:
                resp = client.failed_step(req, CALL_TIMEOUT)
            except grpc.RpcError as err:
                _check_error(where, err, exp, lookup)
                continue
            assert "error" not in exp, f"{where}: want error {exp['error']}, got a decision"
            assert resp.HasField("event"), f"{where}: response without an event"
            kind = resp.decision.WhichOneof("outcome")
            if kind == "schedule":
                assert exp.get("decision", "schedule") == "schedule", f"{where}: decision"
                _check_schedule(where, req, resp.decision.schedule, resp.event, exp, lookup)
                if step.get("save"):
                    saved[step["save"]] = Saved(resp.decision.schedule, req.turn, req.step)
            elif kind == "delegate":
                assert exp.get("decision", "delegate") == "delegate", f"{where}: decision ({resp.decision.delegate.detail})"
                _check_delegate(where, req, resp.decision.delegate.reason, resp.event, exp)
            else:
                raise AssertionError(f"{where}: neither schedule nor delegate")
        elif op == "recover":
            req = _failed_step_request(v, step)
            timeout = step["abortAfterMs"] / 1000 if "abortAfterMs" in step else CALL_TIMEOUT
            try:
                out = client.recover(req, timeout)
            except retryd.RecoverAbortedError as err:
                assert exp.get("outcome") == "aborted", f"{where}: recover aborted ({err})"
                _check_schedule(where, req, err.schedule, err.event, exp, lookup)
                assert err.cancel_error is None, f"{where}: the cancel call failed: {err.cancel_error}"
                assert err.cancelled is not None, f"{where}: no cancelled state after the abort"
                assert err.cancelled.retry_id == err.schedule.retry_id, f"{where}: cancelled retry id"
                if "cancelReason" in exp:
                    assert _enum(events_pb2.CancelReason, err.cancelled.reason) == exp["cancelReason"], f"{where}: cancel reason"
                if step.get("save"):
                    saved[step["save"]] = Saved(err.schedule, req.turn, req.step)
                continue
            except grpc.RpcError as err:
                _check_error(where, err, exp, lookup)
                continue
            assert "error" not in exp, f"{where}: want error {exp['error']}, got outcome {out.kind}"
            assert out.kind == exp.get("outcome", out.kind), f"{where}: outcome {out.kind}"
            if out.kind == "retry":
                assert out.schedule is not None and out.started is not None
                _check_schedule(where, req, out.schedule, out.event, exp, lookup)
                _check_started(where, out.started, Saved(out.schedule, req.turn, req.step))
            elif out.kind == "cancelled":
                assert out.schedule is not None and out.cancelled is not None
                _check_schedule(where, req, out.schedule, out.event, exp, lookup)
                assert out.cancelled.retry_id == out.schedule.retry_id, f"{where}: cancelled retry id"
                if "cancelReason" in exp:
                    assert _enum(events_pb2.CancelReason, out.cancelled.reason) == exp["cancelReason"], f"{where}: cancel reason"
            else:
                assert out.delegate is not None
                _check_delegate(where, req, out.delegate.reason, out.event, exp)
            if step.get("save") and out.kind != "delegate":
                assert out.schedule is not None
                saved[step["save"]] = Saved(out.schedule, req.turn, req.step)
        elif op == "awaitRetry":
            target = lookup(where, step["retry"]) if "retry" in step else None
            rid = target.schedule.retry_id if target is not None else step.get("retryId", "")
            try:
                term = client.await_retry(rid, CALL_TIMEOUT)
            except grpc.RpcError as err:
                _check_error(where, err, exp, lookup)
                continue
            kind = term.WhichOneof("message")
            assert "error" not in exp, f"{where}: want error {exp['error']}, got {kind}"
            assert kind == exp.get("terminal", kind), f"{where}: terminal message {kind}"
            if kind == "started":
                assert target is not None, f"{where}: started for a retry the vector did not save"
                _check_started(where, term.started, target)
                if "retryNumber" in exp:
                    assert term.started.retry_number == exp["retryNumber"], f"{where}: retry number"
            elif kind == "cancelled":
                c = term.cancelled
                assert c.retry_id == rid, f"{where}: cancelled retry id"
                if "cancelReason" in exp:
                    assert _enum(events_pb2.CancelReason, c.reason) == exp["cancelReason"], f"{where}: cancel reason"
                if "retryNumber" in exp:
                    assert c.retry_number == exp["retryNumber"], f"{where}: retry number"
        elif op == "cancelRetries":
            try:
                if "retry" in step:
                    cresp = client.cancel_retry(lookup(where, step["retry"]).schedule.retry_id, CALL_TIMEOUT)
                else:
                    cresp = client.cancel_session(step.get("sessionId", v["session"]), CALL_TIMEOUT)
            except grpc.RpcError as err:
                _check_error(where, err, exp, lookup)
                continue
            assert "error" not in exp, f"{where}: want error {exp['error']}"
            if "retries" in exp:
                got = [
                    (
                        r.retry_id,
                        _enum(pb.RetryStatus, r.status),
                        _enum(events_pb2.CancelReason, r.cancelled.reason) if r.HasField("cancelled") else None,
                    )
                    for r in cresp.retries
                ]
                want = [
                    (lookup(where, r["retry"]).schedule.retry_id, r["status"], r.get("cancelReason"))
                    for r in exp["retries"]
                ]
                assert got == want, f"{where}: retries"
            if "delegationsCancelled" in exp:
                assert cresp.delegations_cancelled == exp["delegationsCancelled"], f"{where}: delegations cancelled"
        elif op == "stepSucceeded":
            sreq = json_format.ParseDict(step.get("request", {}), pb.StepSucceededRequest())
            if not sreq.session_id:
                sreq.session_id = v["session"]
            try:
                sresp = client.step_succeeded(sreq, CALL_TIMEOUT)
            except grpc.RpcError as err:
                _check_error(where, err, exp, lookup)
                continue
            assert "error" not in exp, f"{where}: want error {exp['error']}"
            if "closed" in exp:
                got_closed = [
                    {
                        "provider": c.provider,
                        "policyKey": c.policy_key if j < len(exp["closed"]) and "policyKey" in exp["closed"][j] else None,
                        "reason": _enum(events_pb2.CloseReason, c.reason),
                        "retries": c.retries,
                    }
                    for j, c in enumerate(sresp.closed)
                ]
                want_closed = [
                    {"provider": c["provider"], "policyKey": c.get("policyKey"), "reason": c["reason"], "retries": c["retries"]}
                    for c in exp["closed"]
                ]
                assert got_closed == want_closed, f"{where}: closed chains"
        else:
            raise AssertionError(f"{where}: unknown op")


def _failed_step_request(v: Dict[str, Any], step: Dict[str, Any]) -> pb.FailedStepRequest:
    req: pb.FailedStepRequest = json_format.ParseDict(step.get("request", {}), pb.FailedStepRequest())
    if not req.session_id:
        req.session_id = v["session"]
    if "deadlineInMs" in step:
        req.deadline.FromNanoseconds(time.time_ns() + step["deadlineInMs"] * 1_000_000)
    return req


def _check_schedule(
    where: str,
    req: pb.FailedStepRequest,
    s: pb.Schedule,
    event: events_pb2.Event,
    exp: Dict[str, Any],
    lookup: Callable[[str, str], Saved],
) -> None:
    assert "reason" not in exp, f"{where}: want delegate {exp.get('reason')}, got schedule retry {s.retry_number} after {s.delay_ms} ms"
    assert s.retry_id, f"{where}: schedule without a retry id"
    if "retryNumber" in exp:
        assert s.retry_number == exp["retryNumber"], f"{where}: retry number {s.retry_number}"
    if "maxRetries" in exp:
        got_max: Optional[int] = s.max_retries if s.HasField("max_retries") else None
        assert got_max == exp["maxRetries"], f"{where}: max retries {got_max}"
    if "delayMs" in exp:
        assert s.delay_ms == exp["delayMs"], f"{where}: delay {s.delay_ms}"
    if "delayMsMin" in exp:
        assert s.delay_ms >= exp["delayMsMin"], f"{where}: delay {s.delay_ms} < {exp['delayMsMin']}"
    if "delayMsMax" in exp:
        assert s.delay_ms <= exp["delayMsMax"], f"{where}: delay {s.delay_ms} > {exp['delayMsMax']}"
    if "delaySource" in exp:
        assert _enum(events_pb2.DelaySource, s.delay_source) == exp["delaySource"], f"{where}: delay source"
    if "mode" in exp:
        assert _enum(policy_pb2.Mode, s.mode) == exp["mode"], f"{where}: mode"
    if "policyKey" in exp:
        assert s.policy_key == exp["policyKey"], f"{where}: policy key {s.policy_key}"
    if "sameRetryAs" in exp:
        assert s.retry_id == lookup(where, exp["sameRetryAs"]).schedule.retry_id, f"{where}: retry id"

    # The event is the scheduled record of this very decision.
    assert event.session_id == req.session_id, f"{where}: event session"
    assert event.WhichOneof("kind") == "scheduled", f"{where}: event kind"
    sc = event.scheduled
    assert sc.retry_id == s.retry_id, f"{where}: event retry id"
    assert sc.retry_number == s.retry_number, f"{where}: event retry number"
    assert sc.HasField("max_retries") == s.HasField("max_retries") and sc.max_retries == s.max_retries, f"{where}: event max retries"
    assert sc.delay_ms == s.delay_ms, f"{where}: event delay"
    assert sc.delay_source == s.delay_source, f"{where}: event delay source"
    assert sc.policy_key == s.policy_key, f"{where}: event policy key"
    assert sc.turn == req.turn, f"{where}: event turn"
    assert sc.step == req.step, f"{where}: event step"
    assert sc.provider == req.provider, f"{where}: event provider"
    assert _nanos(sc.due_at) == _nanos(s.due_at), f"{where}: event due time"
    if "line" in exp:
        assert retryd.render_retry(event) == exp["line"], f"{where}: UI line"


def _check_delegate(where: str, req: pb.FailedStepRequest, reason: int, event: events_pb2.Event, exp: Dict[str, Any]) -> None:
    name = _enum(events_pb2.DelegateReason, reason)
    assert "retryNumber" not in exp, f"{where}: want schedule retry {exp.get('retryNumber')}, got delegate {name}"
    if "reason" in exp:
        assert name == exp["reason"], f"{where}: delegate reason {name}"
    assert event.session_id == req.session_id, f"{where}: event session"
    assert event.WhichOneof("kind") == "delegated", f"{where}: event kind"
    assert event.delegated.reason == reason, f"{where}: event reason"
    assert event.delegated.turn == req.turn, f"{where}: event turn"
    assert event.delegated.step == req.step, f"{where}: event step"
    assert retryd.render_retry(event) is None, f"{where}: a delegation has no UI line"


def _check_started(where: str, st: events_pb2.RetryStarted, target: Saved) -> None:
    assert st.retry_id == target.schedule.retry_id, f"{where}: started retry id"
    assert st.retry_number == target.schedule.retry_number, f"{where}: started retry number"
    assert st.turn == target.turn, f"{where}: started turn"
    assert st.step == target.step, f"{where}: started step"
    assert _nanos(st.started_at) >= _nanos(target.schedule.due_at), f"{where}: started before the due time"


def _check_error(where: str, err: grpc.RpcError, exp: Dict[str, Any], lookup: Callable[[str, str], Saved]) -> None:
    if "error" not in exp:
        raise err
    want = exp["error"]
    assert err.code().name == want["code"], f"{where}: code {err.code().name} ({err.details()})"
    if "reason" in want:
        assert retryd.error_reason(err) == want["reason"], f"{where}: error reason ({err.details()})"
    if "retry" in want:
        assert retryd.is_retry_pending(err) == lookup(where, want["retry"]).schedule.retry_id, f"{where}: pending retry id"
    if "fieldViolations" in want:
        got = sorted((retryd.field_violations(err) or {}).keys())
        assert got == sorted(want["fieldViolations"]), f"{where}: field violations ({err.details()})"
