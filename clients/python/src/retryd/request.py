"""Plain-value forms of what recover() reports: Failure, Policy and
Backoff as dataclasses (or dicts with the same keys), turned into the
generated messages of retryd.v1 by failed_step_request().

Bad input raises before anything is sent: TypeError for a value of the
wrong type, ValueError for one out of range or an unknown key. What only
the server can judge (an unknown failure code in a policy, a schedule
that is too long) comes back as retryd.InvalidArgumentError."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, Mapping, Optional, Sequence, Tuple, Union

from .classify import Classification, classify_exception
from .v1 import events_pb2, policy_pb2, retry_service_pb2

_UINT32 = 2**32 - 1
_UINT64 = 2**64 - 1

Mode = Literal["normal", "always", "schedule"]
JitterKind = Literal["symmetric", "full"]
OverCap = Literal["delegate", "local", "honor"]
ReplayLike = Union[bool, Literal["safe", "unsafe"], None]


def _int(name: str, v: object, hi: int, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"retryd: {name} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"retryd: {name} must be between {lo} and {hi}, not {v}")
    return v


def _float(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"retryd: {name} must be a number, not {type(v).__name__}")
    return float(v)


def _str(name: str, v: object, required: bool = False) -> str:
    if not isinstance(v, str):
        raise TypeError(f"retryd: {name} must be a str, not {type(v).__name__}")
    if required and v == "":
        raise ValueError(f"retryd: {name} must not be empty")
    return v


@dataclass(frozen=True)
class Failure:
    """What failed: FailedStepRequest.failure as plain values. code is the
    provider failure code (RATE_LIMIT, SERVER, TIMEOUT, ...: see
    retryd.classify); http_status the provider's HTTP status (0 for none);
    provider_retry_after_ms the provider's retry-after-ms, retry_after its
    Retry-After header as sent."""

    code: str
    http_status: int = 0
    message: str = ""
    provider_retry_after_ms: Optional[int] = None
    retry_after: Optional[str] = None

    def to_proto(self) -> events_pb2.Failure:
        f = events_pb2.Failure(
            code=_str("failure.code", self.code, required=True),
            http_status=_int("failure.http_status", self.http_status, 999),
            message=_str("failure.message", self.message),
        )
        if self.provider_retry_after_ms is not None:
            f.provider_retry_after_ms = _int("failure.provider_retry_after_ms", self.provider_retry_after_ms, 2**63 - 1)
        if self.retry_after is not None:
            f.retry_after = _str("failure.retry_after", self.retry_after)
        return f

    @classmethod
    def from_proto(cls, f: events_pb2.Failure) -> "Failure":
        return cls(
            code=f.code,
            http_status=f.http_status,
            message=f.message,
            provider_retry_after_ms=f.provider_retry_after_ms if f.HasField("provider_retry_after_ms") else None,
            retry_after=f.retry_after if f.HasField("retry_after") else None,
        )

    @classmethod
    def from_exception(cls, exc: BaseException, *, output_shown: bool = False) -> "Failure":
        """The Failure for an exception a model call raised (see
        retryd.classify_exception): an SDK's status error, a transport
        failure, or, for an exception no rule knows, code UNKNOWN. It never
        raises."""
        return cls.from_proto(classify_exception(exc, output_shown=output_shown).failure)


@dataclass(frozen=True)
class Backoff:
    """RetryPolicy.backoff: exponential delays from initial_delay_ms,
    times multiplier per retry, capped at max_delay_ms, with jitter_ratio
    of jitter ("symmetric" or "full"). None leaves the server's default."""

    initial_delay_ms: Optional[int] = None
    max_delay_ms: Optional[int] = None
    multiplier: Optional[float] = None
    jitter_ratio: Optional[float] = None
    jitter: Optional[JitterKind] = None

    def to_proto(self) -> policy_pb2.Backoff:
        b = policy_pb2.Backoff()
        if self.initial_delay_ms is not None:
            b.initial_delay_ms = _int("policy.backoff.initial_delay_ms", self.initial_delay_ms, _UINT64)
        if self.max_delay_ms is not None:
            b.max_delay_ms = _int("policy.backoff.max_delay_ms", self.max_delay_ms, _UINT64)
        if self.multiplier is not None:
            b.multiplier = _float("policy.backoff.multiplier", self.multiplier)
        if self.jitter_ratio is not None:
            b.jitter_ratio = _float("policy.backoff.jitter_ratio", self.jitter_ratio)
        if self.jitter is not None:
            b.jitter = _enum("policy.backoff.jitter", self.jitter, _JITTERS)
        return b


@dataclass(frozen=True)
class Policy:
    """An inline RetryPolicy as plain values. mode is "normal" (a finite
    budget of retryable codes), "always" (unlimited, after downstream
    recovery declined) or "schedule" (fixed delays, then an unlimited
    tail); every field left None (or empty) takes the server's default."""

    mode: Optional[Mode] = None
    max_retries: Optional[int] = None
    retryable_codes: Sequence[str] = ()
    backoff: Union[Backoff, Mapping[str, Any], None] = None
    schedule: Sequence[int] = ()
    """Schedule mode's delays in milliseconds."""
    tail_delay_ms: Optional[int] = None
    retry_after_over_cap: Optional[OverCap] = None
    min_attempt_ms: Optional[int] = None

    def to_proto(self) -> policy_pb2.RetryPolicy:
        p = policy_pb2.RetryPolicy()
        if self.mode is not None:
            p.mode = _enum("policy.mode", self.mode, _MODES)
        if self.max_retries is not None:
            p.max_retries = _int("policy.max_retries", self.max_retries, _UINT32)
        if isinstance(self.retryable_codes, str):
            raise TypeError("retryd: policy.retryable_codes must be a sequence of str, not a str")
        p.retryable_codes.extend(_str(f"policy.retryable_codes[{i}]", c) for i, c in enumerate(self.retryable_codes))
        if self.backoff is not None:
            p.backoff.CopyFrom(_backoff(self.backoff))
        p.schedule.extend(_int(f"policy.schedule[{i}]", d, _UINT64) for i, d in enumerate(self.schedule))
        if self.tail_delay_ms is not None:
            p.tail_delay_ms = _int("policy.tail_delay_ms", self.tail_delay_ms, _UINT64)
        if self.retry_after_over_cap is not None:
            p.retry_after_over_cap = _enum("policy.retry_after_over_cap", self.retry_after_over_cap, _OVER_CAP)
        if self.min_attempt_ms is not None:
            p.min_attempt_ms = _int("policy.min_attempt_ms", self.min_attempt_ms, _UINT64)
        return p


_MODES = {"normal": policy_pb2.MODE_NORMAL, "always": policy_pb2.MODE_ALWAYS, "schedule": policy_pb2.MODE_SCHEDULE}
_JITTERS = {"symmetric": policy_pb2.JITTER_SYMMETRIC, "full": policy_pb2.JITTER_FULL}
_OVER_CAP = {
    "delegate": policy_pb2.RETRY_AFTER_OVER_CAP_DELEGATE,
    "local": policy_pb2.RETRY_AFTER_OVER_CAP_LOCAL,
    "honor": policy_pb2.RETRY_AFTER_OVER_CAP_HONOR,
}


def _enum(name: str, v: object, values: Mapping[str, int]) -> Any:
    if not isinstance(v, str):
        raise TypeError(f"retryd: {name} must be a str, not {type(v).__name__}")
    if v.lower() not in values:
        raise ValueError(f"retryd: {name} must be one of {', '.join(values)}, not {v!r}")
    return values[v.lower()]


def _from_mapping(cls: Any, name: str, m: Mapping[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(m) - known)
    if unknown:
        raise ValueError(f"retryd: {name} has unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(known))})")
    return cls(**m)


def _backoff(b: object) -> policy_pb2.Backoff:
    if isinstance(b, policy_pb2.Backoff):
        return b
    if isinstance(b, Mapping):
        b = _from_mapping(Backoff, "policy.backoff", b)
    if not isinstance(b, Backoff):
        raise TypeError(f"retryd: policy.backoff must be a retryd.Backoff or a dict, not {type(b).__name__}")
    return b.to_proto()


PolicyLike = Union[Policy, Mapping[str, Any], policy_pb2.RetryPolicy]
FailureLike = Union[Failure, Mapping[str, Any], events_pb2.Failure]


def policy_proto(p: object) -> policy_pb2.RetryPolicy:
    """A Policy, a dict of its fields or a RetryPolicy message, as the message."""
    if isinstance(p, policy_pb2.RetryPolicy):
        return p
    if isinstance(p, Mapping):
        p = _from_mapping(Policy, "policy", p)
    if not isinstance(p, Policy):
        raise TypeError(f"retryd: policy must be a retryd.Policy, a dict or a RetryPolicy, not {type(p).__name__}")
    return p.to_proto()


def failure_proto(f: object) -> events_pb2.Failure:
    """A Failure, a dict of its fields or a Failure message, as the message."""
    if isinstance(f, events_pb2.Failure):
        return f
    if isinstance(f, Mapping):
        f = _from_mapping(Failure, "failure", f)
    if not isinstance(f, Failure):
        raise TypeError(f"retryd: failure must be a retryd.Failure, a dict or a Failure message, not {type(f).__name__}")
    return f.to_proto()


def _replay(v: ReplayLike) -> Any:
    if v is None:
        return events_pb2.REPLAY_UNSPECIFIED
    if v is True or v == "safe":
        return events_pb2.REPLAY_SAFE
    if v is False or v == "unsafe":
        return events_pb2.REPLAY_UNSAFE
    raise ValueError(f"retryd: replay_safe must be True, False, 'safe' or 'unsafe', not {v!r}")


def failed_step_request(
    *,
    session_id: str,
    turn: int,
    step: int,
    provider: str,
    failure: Optional[FailureLike] = None,
    code: Optional[str] = None,
    http_status: Optional[int] = None,
    message: Optional[str] = None,
    error: Optional[BaseException] = None,
    output_shown: bool = False,
    replay_safe: ReplayLike = None,
    policy: Optional[PolicyLike] = None,
    policy_name: Optional[str] = None,
    logical_turn_id: Optional[str] = None,
    deadline: Union[datetime, float, None] = None,
    downstream_declined: bool = False,
) -> retry_service_pb2.FailedStepRequest:
    """The FailedStepRequest of recover()'s keyword form (documented there)."""
    req = retry_service_pb2.FailedStepRequest(
        session_id=_str("session_id", session_id, required=True),
        turn=_int("turn", turn, _UINT64),
        step=_int("step", step, _UINT64),
        provider=_str("provider", provider, required=True),
    )
    given = [n for n, v in (("failure", failure), ("code", code), ("error", error)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"retryd: give exactly one of failure, code and error, not {given or 'none'}")
    if (http_status is not None or message is not None) and code is None:
        raise ValueError("retryd: http_status and message go with code=; put them in failure= otherwise")
    if error is not None:
        if not isinstance(error, BaseException):
            raise TypeError(f"retryd: error must be an exception, not {type(error).__name__}")
        c: Classification = classify_exception(error, output_shown=output_shown)
        c.apply(req)
    elif failure is not None:
        req.failure.CopyFrom(failure_proto(failure))
    else:
        req.failure.CopyFrom(Failure(code=_str("code", code), http_status=0 if http_status is None else http_status).to_proto())
    if message is not None:
        req.failure.message = _str("message", message)
    if replay_safe is not None:
        req.replay = _replay(replay_safe)
    elif output_shown and error is None:
        req.replay = events_pb2.REPLAY_UNSAFE
    if policy is not None and policy_name is not None:
        raise ValueError("retryd: give policy or policy_name, not both")
    if policy is not None:
        req.policy.CopyFrom(policy_proto(policy))
    elif policy_name is not None:
        req.policy_name = _str("policy_name", policy_name, required=True)
    if logical_turn_id is not None:
        req.logical_turn_id = _str("logical_turn_id", logical_turn_id)
    if deadline is not None:
        if isinstance(deadline, datetime):
            if deadline.tzinfo is None:
                raise ValueError("retryd: deadline must be an aware datetime (with tzinfo)")
            req.deadline.FromDatetime(deadline.astimezone(timezone.utc).replace(tzinfo=None))
        else:
            req.deadline.FromNanoseconds(int(_float("deadline", deadline) * 1e9))
    if downstream_declined:
        req.downstream = events_pb2.DOWNSTREAM_DECLINED
    return req


__all__: Tuple[str, ...] = ("Backoff", "Failure", "Policy", "failed_step_request", "failure_proto", "policy_proto")
