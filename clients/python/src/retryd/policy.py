"""The retry rules of retryd's policy package (policy/*.go), ported so the
client can decide on its own while no retryd replica answers: resolving a
RetryPolicy to its canonical form and key, and deciding whether one failure
is retried and after which delay.

Like the Go package it is pure: the caller passes the current time (ms
since the epoch) and a jitter source, so a test can state every delay. Its
parity with the server is checked by running the shared conformance
vectors and policy/testdata/canonical_keys.json against it
(tests/test_policy.py), as the TypeScript port's is.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .retryafter import (
    MAX_DELAY_MS,
    NO_RETRY_AFTER,
    RetryAfter,
    failure_retry_after,
    parse_retry_after,
    provider_retry_after,
)
from .v1 import events_pb2, policy_pb2

__all__ = [
    "Attempt", "Decision", "FieldViolation", "MAX_DELAY_MS", "NO_RETRY_AFTER", "PolicyValidationError", "Rand",
    "ResolvedPolicy", "RetryAfter", "backoff_base", "backoff_bounds", "decide", "delay_cap_ms", "failure_retry_after",
    "go_float", "parse_retry_after", "provider_retry_after", "resolve_policy", "retryable", "validate_code",
]

DEFAULT_NORMAL_MAX_RETRIES = 2
DEFAULT_INITIAL_DELAY_MS = 500
DEFAULT_MAX_DELAY_MS = 10_000
DEFAULT_MULTIPLIER = 2.0
DEFAULT_JITTER_RATIO = 0.1
DEFAULT_TAIL_DELAY_MS = 20_000
DEFAULT_MIN_ATTEMPT_MS = 100
MAX_SCHEDULE_LEN = 64
MAX_CODES = 64
MAX_CODE_LEN = 64
#: Never retried in any mode: cancellation stays terminal.
CODE_ABORTED = "ABORTED"
_MAX_UINT32 = 2**32 - 1

#: The codes normal mode retries when the policy names none.
DEFAULT_NORMAL_CODES: Tuple[str, ...] = ("EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT")
#: The codes schedule mode retries when the policy names none (the dsh-retry plugin's list).
DEFAULT_SCHEDULE_CODES: Tuple[str, ...] = (
    "EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT",
    "PI_AI_ERROR", "AUTH", "QUOTA", "ACCOUNT_QUOTA", "ACCOUNT_TOKEN_INVALID",
    "INVALID_CREDENTIAL", "MALFORMED_RESPONSE", "HTTP_*",
)
#: Schedule mode's delay list when the policy names none.
DEFAULT_SCHEDULE: Tuple[int, ...] = (2000, 5000, 5000, 5000, 10000)

#: A jitter source: returns a number in [0, 1).
Rand = Callable[[], float]

Mode = policy_pb2.Mode
R = events_pb2


@dataclass(frozen=True)
class FieldViolation:
    """One invalid field of a policy, named by its path relative to the policy."""

    field: str
    description: str


class PolicyValidationError(ValueError):
    """Every invalid field of a policy, as the server's BadRequest lists them."""

    def __init__(self, violations: List[FieldViolation]) -> None:
        super().__init__("policy: invalid: " + "; ".join(f"{v.field}: {v.description}" for v in violations))
        self.violations = violations


@dataclass(frozen=True)
class ResolvedPolicy:
    """A resolved retry policy: every default filled in, validated, keyed."""

    mode: "policy_pb2.Mode"
    max_retries: int
    """The finite budget; meaningful only when bounded."""
    bounded: bool
    codes: Tuple[str, ...]
    """The sorted retryable codes (an entry ending in * is a prefix rule); empty in always mode."""
    initial_delay_ms: int
    max_delay_ms: int
    multiplier: float
    jitter_ratio: float
    jitter: "policy_pb2.Jitter"
    schedule: Tuple[int, ...]
    tail_delay_ms: int
    over_cap: "policy_pb2.RetryAfterOverCap"
    min_attempt_ms: int
    key: str
    """The canonical policy key, identical to the server's."""




@dataclass(frozen=True)
class Attempt:
    """Everything about one failure a decision depends on, besides the policy."""

    retries: int
    """How many retries the chain has already scheduled."""
    code: str
    retry_after: RetryAfter = NO_RETRY_AFTER
    downstream: "events_pb2.Downstream" = R.DOWNSTREAM_UNSPECIFIED
    replay: "events_pb2.Replay" = R.REPLAY_UNSPECIFIED
    deadline_ms: Optional[float] = None
    """The logical operation's deadline in ms since the epoch."""


@dataclass(frozen=True)
class Decision:
    """The outcome of decide(): schedule retry_number after delay_ms (from
    source), or delegate for reason."""

    schedule: bool
    retry_number: int = 0
    delay_ms: int = 0
    source: "events_pb2.DelaySource" = R.DELAY_SOURCE_UNSPECIFIED
    reason: "events_pb2.DelegateReason" = R.DELEGATE_REASON_UNSPECIFIED
    detail: str = ""


@dataclass
class _Violations:
    items: List[FieldViolation] = field(default_factory=list)

    def add(self, f: str, description: str) -> None:
        self.items.append(FieldViolation(f, description))


def resolve_policy(p: Optional[policy_pb2.RetryPolicy] = None) -> ResolvedPolicy:
    """Validates p and fills in every default; None is the built-in default
    policy (normal mode). Raises PolicyValidationError."""
    vs = _Violations()
    mode = p.mode if p is not None else Mode.MODE_UNSPECIFIED
    if mode == Mode.MODE_UNSPECIFIED:
        mode = Mode.MODE_NORMAL
    if mode not in Mode.values():
        vs.add("mode", f"unknown mode {mode}")
        raise PolicyValidationError(vs.items)
    over_cap = p.retry_after_over_cap if p is not None else policy_pb2.RETRY_AFTER_OVER_CAP_UNSPECIFIED
    if over_cap not in policy_pb2.RetryAfterOverCap.values():
        vs.add("retry_after_over_cap", f"unknown value {over_cap}")
    min_attempt_ms = DEFAULT_MIN_ATTEMPT_MS
    if p is not None and p.HasField("min_attempt_ms"):
        if p.min_attempt_ms > MAX_DELAY_MS:
            vs.add("min_attempt_ms", f"must be at most {MAX_DELAY_MS} ms, got {p.min_attempt_ms}")
        min_attempt_ms = p.min_attempt_ms
    def has(name: str) -> bool:
        return p is not None and bool(p.HasField(name))

    schedule: Sequence[int] = p.schedule if p is not None else ()
    codes: Sequence[str] = p.retryable_codes if p is not None else ()
    out: Dict[str, Any] = dict(
        mode=mode, max_retries=0, bounded=False, codes=(), initial_delay_ms=0, max_delay_ms=0, multiplier=0.0,
        jitter_ratio=0.0, jitter=policy_pb2.JITTER_UNSPECIFIED, schedule=(), tail_delay_ms=0, over_cap=over_cap,
        min_attempt_ms=min_attempt_ms,
    )
    if mode == Mode.MODE_NORMAL:
        out["bounded"] = True
        out["max_retries"] = p.max_retries if p is not None and has("max_retries") else DEFAULT_NORMAL_MAX_RETRIES
        out["codes"] = _resolve_codes(vs, codes, DEFAULT_NORMAL_CODES)
        _resolve_backoff(vs, p, out)
        if schedule:
            vs.add("schedule", "only allowed in schedule mode")
        if has("tail_delay_ms"):
            vs.add("tail_delay_ms", "only allowed in schedule mode")
        if out["over_cap"] == policy_pb2.RETRY_AFTER_OVER_CAP_UNSPECIFIED:
            out["over_cap"] = policy_pb2.RETRY_AFTER_OVER_CAP_DELEGATE
    elif mode == Mode.MODE_ALWAYS:
        if has("max_retries"):
            vs.add("max_retries", "always mode is unlimited; use normal or schedule mode for a finite budget")
        if codes:
            vs.add(
                "retryable_codes",
                "always mode retries every code except ABORTED; codes are only allowed in normal and schedule modes",
            )
        _resolve_backoff(vs, p, out)
        if schedule:
            vs.add("schedule", "only allowed in schedule mode")
        if has("tail_delay_ms"):
            vs.add("tail_delay_ms", "only allowed in schedule mode")
        if out["over_cap"] == policy_pb2.RETRY_AFTER_OVER_CAP_UNSPECIFIED:
            out["over_cap"] = policy_pb2.RETRY_AFTER_OVER_CAP_LOCAL
    else:
        if p is not None and has("max_retries"):
            out["bounded"] = True
            out["max_retries"] = p.max_retries
        out["codes"] = _resolve_codes(vs, codes, DEFAULT_SCHEDULE_CODES)
        if has("backoff"):
            vs.add("backoff", "not allowed in schedule mode; use schedule and tail_delay_ms")
        _resolve_schedule(vs, p, out)
        if out["over_cap"] == policy_pb2.RETRY_AFTER_OVER_CAP_UNSPECIFIED:
            out["over_cap"] = policy_pb2.RETRY_AFTER_OVER_CAP_LOCAL
    if vs.items:
        raise PolicyValidationError(vs.items)
    partial = ResolvedPolicy(key="", **out)
    return dataclasses.replace(partial, key=_canonical_key(partial))


def _resolve_backoff(vs: _Violations, p: Optional[policy_pb2.RetryPolicy], out: Dict[str, Any]) -> None:
    out["initial_delay_ms"] = DEFAULT_INITIAL_DELAY_MS
    out["max_delay_ms"] = DEFAULT_MAX_DELAY_MS
    out["multiplier"] = DEFAULT_MULTIPLIER
    out["jitter_ratio"] = DEFAULT_JITTER_RATIO
    out["jitter"] = policy_pb2.JITTER_SYMMETRIC
    if p is None or not p.HasField("backoff"):
        return
    b = p.backoff
    if b.HasField("initial_delay_ms"):
        out["initial_delay_ms"] = b.initial_delay_ms
    if b.HasField("max_delay_ms"):
        out["max_delay_ms"] = b.max_delay_ms
    if out["initial_delay_ms"] == 0:
        vs.add("backoff.initial_delay_ms", "must be greater than 0")
    elif out["initial_delay_ms"] > MAX_DELAY_MS:
        vs.add("backoff.initial_delay_ms", f"must be at most {MAX_DELAY_MS} ms, got {b.initial_delay_ms}")
    if out["max_delay_ms"] > MAX_DELAY_MS:
        vs.add("backoff.max_delay_ms", f"must be at most {MAX_DELAY_MS} ms, got {b.max_delay_ms}")
    elif out["max_delay_ms"] < out["initial_delay_ms"]:
        vs.add(
            "backoff.max_delay_ms",
            f"must be at least initial_delay_ms ({out['initial_delay_ms']}), got {out['max_delay_ms']}",
        )
    if b.HasField("multiplier"):
        out["multiplier"] = b.multiplier
        if not math.isfinite(b.multiplier) or b.multiplier < 1:
            vs.add("backoff.multiplier", f"must be a finite number >= 1, got {go_float(b.multiplier, 21)}")
    if b.HasField("jitter_ratio"):
        r = b.jitter_ratio
        if math.isnan(r) or r < 0 or r > 1:
            vs.add("backoff.jitter_ratio", f"must be within [0, 1], got {go_float(r, 21)}")
        out["jitter_ratio"] = 0.0 if r == 0 else r  # -0 behaves as 0 and must give the same key
    if b.jitter in (policy_pb2.JITTER_UNSPECIFIED, policy_pb2.JITTER_SYMMETRIC):
        pass
    elif b.jitter == policy_pb2.JITTER_FULL:
        out["jitter"] = policy_pb2.JITTER_FULL
    else:
        vs.add("backoff.jitter", f"unknown jitter {b.jitter}")


def _resolve_schedule(vs: _Violations, p: Optional[policy_pb2.RetryPolicy], out: Dict[str, Any]) -> None:
    out["schedule"] = DEFAULT_SCHEDULE
    s = list(p.schedule) if p is not None else []
    if s:
        if len(s) > MAX_SCHEDULE_LEN:
            vs.add("schedule", f"at most {MAX_SCHEDULE_LEN} entries, got {len(s)}")
            return
        for i, d in enumerate(s):
            if d == 0 or d > MAX_DELAY_MS:
                vs.add(f"schedule[{i}]", f"must be within [1, {MAX_DELAY_MS}] ms, got {d}")
        out["schedule"] = tuple(s)
    out["tail_delay_ms"] = DEFAULT_TAIL_DELAY_MS
    if p is not None and p.HasField("tail_delay_ms"):
        out["tail_delay_ms"] = p.tail_delay_ms
        if p.tail_delay_ms == 0 or p.tail_delay_ms > MAX_DELAY_MS:
            vs.add("tail_delay_ms", f"must be within [1, {MAX_DELAY_MS}] ms, got {p.tail_delay_ms}")


_CODE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def validate_code(code: str) -> str:
    """Why code is not a valid failure code, or "" when it is: an
    upper-snake identifier, A-Z first, then A-Z, 0-9 or _, at most 64 bytes."""
    if code == "":
        return "must not be empty"
    if len(code.encode("utf-8", "replace")) > MAX_CODE_LEN:
        return f"must be at most {MAX_CODE_LEN} bytes"
    if not _CODE.match(code) or code.endswith("\n"):
        return f"must be an upper-snake identifier such as RATE_LIMIT, got {_go_quote(code)}"
    return ""


def _go_quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _byte_order(s: str) -> bytes:
    """Go's sort order of strings: by UTF-8 bytes."""
    return s.encode("utf-8", "surrogatepass")


def _resolve_codes(vs: _Violations, codes: Sequence[str], defaults: Sequence[str]) -> Tuple[str, ...]:
    if not codes:
        return tuple(sorted(defaults, key=_byte_order))
    if len(codes) > MAX_CODES:
        vs.add("retryable_codes", f"at most {MAX_CODES} codes, got {len(codes)}")
        return ()
    seen = set()
    for i, c in enumerate(codes):
        f = f"retryable_codes[{i}]"
        if c == "*":
            vs.add(f, "a bare * would retry every failure; name the codes or use a prefix rule such as HTTP_*")
            continue
        msg = validate_code(c[:-1] if c.endswith("*") else c)
        if msg:
            vs.add(f, msg)
            continue
        if c == CODE_ABORTED:
            vs.add(f, "ABORTED is never retried: cancellation stays terminal")
            continue
        if c in seen:
            vs.add(f, f"duplicate code {c}")
            continue
        seen.add(c)
    return tuple(sorted(codes, key=_byte_order))


def retryable(p: ResolvedPolicy, code: str) -> bool:
    """Whether the policy may retry a failure with this code."""
    if code == CODE_ABORTED:
        return False
    if p.mode == Mode.MODE_ALWAYS:
        return True
    return any(code.startswith(c[:-1]) if c.endswith("*") else c == code for c in p.codes)


def delay_cap_ms(p: ResolvedPolicy) -> int:
    """The largest local delay: the backoff cap, or the largest schedule or tail delay."""
    if p.mode != Mode.MODE_SCHEDULE:
        return p.max_delay_ms
    return max(*p.schedule, p.tail_delay_ms)


def backoff_base(p: ResolvedPolicy, n: int) -> float:
    """The unjittered delay of retry n (1-based): min(initial * multiplier^(n-1), max)."""
    try:
        grown = float(p.initial_delay_ms) * math.pow(p.multiplier, float(n) - 1)
    except OverflowError:
        grown = math.inf
    return min(grown, float(p.max_delay_ms))


def backoff_bounds(p: ResolvedPolicy, n: int) -> Tuple[int, int]:
    """The closed range of jittered delays for retry n in whole ms:
    [base*(1-r), min(base*(1+r), max)] symmetric, [0, base] full."""
    base = backoff_base(p, n)
    if p.jitter == policy_pb2.JITTER_FULL:
        return 0, math.floor(base)
    lo = math.ceil(base * (1 - p.jitter_ratio))
    hi = math.floor(min(base * (1 + p.jitter_ratio), float(p.max_delay_ms)))
    return lo, max(hi, lo)


def _go_round(x: float) -> int:
    """Go's math.Round: half away from zero."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def _local_delay(p: ResolvedPolicy, n: int, rand: Rand) -> "Tuple[int, events_pb2.DelaySource]":
    if p.mode == Mode.MODE_SCHEDULE:
        if n <= len(p.schedule):
            return p.schedule[n - 1], R.DELAY_SOURCE_SCHEDULE
        return p.tail_delay_ms, R.DELAY_SOURCE_TAIL
    lo, hi = backoff_bounds(p, n)
    u = rand()
    if not 0 <= u < 1:
        u = 0.0
    return lo + _go_round(u * float(hi - lo)), R.DELAY_SOURCE_BACKOFF


def _delegate(reason: "events_pb2.DelegateReason", detail: str) -> Decision:
    return Decision(schedule=False, reason=reason, detail=detail)


def _retry_after_string(r: RetryAfter) -> str:
    if not r.valid:
        return "no retry-after"
    if r.over:
        return "an unbounded delay"
    return f"{r.ms} ms"


def decide(p: ResolvedPolicy, a: Attempt, now_ms: float, rand: Rand) -> Decision:
    """Applies the policy to one failure, in the server's order: ABORTED,
    unsafe replay, always mode's downstream handshake, code eligibility, the
    finite budget, the local or provider delay, and the deadline."""
    if a.code == CODE_ABORTED:
        return _delegate(R.DELEGATE_REASON_CODE_NOT_RETRYABLE, "ABORTED is never retried: cancellation stays terminal")
    if a.replay == R.REPLAY_UNSAFE:
        return _delegate(
            R.DELEGATE_REASON_REPLAY_UNSAFE,
            "the caller marked the request unsafe to replay; reconcile its outcome before trying again",
        )
    if p.mode == Mode.MODE_ALWAYS:
        if a.downstream == R.DOWNSTREAM_HANDLED:
            return _delegate(
                R.DELEGATE_REASON_DOWNSTREAM_HANDLED, "a downstream recovery policy handled the failure; no retry scheduled"
            )
        if a.downstream != R.DOWNSTREAM_DECLINED:
            return _delegate(
                R.DELEGATE_REASON_DOWNSTREAM_FIRST,
                "always mode asks downstream recovery first; report the step again with downstream DECLINED or HANDLED",
            )
    if not retryable(p, a.code):
        return _delegate(R.DELEGATE_REASON_CODE_NOT_RETRYABLE, f"code {a.code} is not retryable under policy {p.key}")
    if a.retries >= _MAX_UINT32:
        return _delegate(R.DELEGATE_REASON_BUDGET_EXHAUSTED, f"the chain's retry counter is exhausted ({a.retries} retries)")
    if p.bounded and a.retries >= p.max_retries:
        return _delegate(R.DELEGATE_REASON_BUDGET_EXHAUSTED, f"{a.retries} of {p.max_retries} retries used")
    n = a.retries + 1
    delay, source = _local_delay(p, n, rand)
    ra = a.retry_after
    if ra.valid:
        cap = delay_cap_ms(p)
        over_cap = ra.over or ra.ms > cap
        honorable = not ra.over and ra.ms <= MAX_DELAY_MS
        if not over_cap or (p.over_cap == policy_pb2.RETRY_AFTER_OVER_CAP_HONOR and honorable):
            delay, source = ra.ms, R.DELAY_SOURCE_PROVIDER_RETRY_AFTER
        elif p.over_cap == policy_pb2.RETRY_AFTER_OVER_CAP_LOCAL or (
            p.over_cap == policy_pb2.RETRY_AFTER_OVER_CAP_HONOR and p.mode != Mode.MODE_NORMAL
        ):
            pass  # unlimited modes keep the local delay: they must not end on a provider instruction
        else:
            return _delegate(
                R.DELEGATE_REASON_RETRY_AFTER_OVER_CAP,
                f"provider asked for {_retry_after_string(ra)}, over the policy's cap of {cap} ms",
            )
    if a.deadline_ms is not None:
        need = delay + p.min_attempt_ms
        left = a.deadline_ms - now_ms
        if left < need:
            return _delegate(
                R.DELEGATE_REASON_DEADLINE,
                f"a {delay} ms delay plus a {p.min_attempt_ms} ms attempt does not fit the "
                f"{max(int(left), 0)} ms left before the deadline",
            )
    return Decision(schedule=True, retry_number=n, delay_ms=delay, source=source)


def go_float(f: float, exp_at: int = 6) -> str:
    """Formats f as Go's strconv.FormatFloat(f, 'g', -1, 64), which the
    canonical key uses: the shortest digits that round-trip, in exponent
    form (two exponent digits at least) when the decimal exponent is below
    -4 or at least exp_at. exp_at=21 is Go's %v, which the server's
    validation messages use."""
    if math.isnan(f):
        return "NaN"
    if f == math.inf:
        return "+Inf"
    if f == -math.inf:
        return "-Inf"
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    sign, digits, exponent = Decimal(repr(f)).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    exp10 = len(digits) - 1 + exponent
    neg = "-" if sign else ""
    if exp10 < -4 or exp10 >= exp_at:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if exp10 < 0:
        return f"{neg}0.{'0' * (-exp10 - 1)}{ds}"
    if len(ds) <= exp10 + 1:
        return f"{neg}{ds}{'0' * (exp10 + 1 - len(ds))}"
    return f"{neg}{ds[:exp10 + 1]}.{ds[exp10 + 1:]}"


def _mode_name(m: "policy_pb2.Mode") -> str:
    return str(Mode.Name(m)).removeprefix("MODE_").lower()


def _canonical_key(p: ResolvedPolicy) -> str:
    """The policy as the server renders it (policy.canonicalKey):

    normal;max=2;codes=A,B;backoff=500..10000*2;jitter=symmetric:0.1;over_cap=delegate;min_attempt=100
    always;max=inf;backoff=1000..30000*2;jitter=symmetric:0.2;over_cap=local;min_attempt=100
    schedule;max=inf;codes=A,HTTP_*;schedule=2000,5000;tail=20000;over_cap=local;min_attempt=100
    """
    b = _mode_name(p.mode) + ";max=" + (str(p.max_retries) if p.bounded else "inf")
    if p.mode != Mode.MODE_ALWAYS:
        b += ";codes=" + ",".join(p.codes)
    if p.mode == Mode.MODE_SCHEDULE:
        b += ";schedule=" + ",".join(map(str, p.schedule)) + ";tail=" + str(p.tail_delay_ms)
    else:
        jitter = str(policy_pb2.Jitter.Name(p.jitter)).removeprefix("JITTER_").lower()
        b += f";backoff={p.initial_delay_ms}..{p.max_delay_ms}*{go_float(p.multiplier)};jitter={jitter}"
        if p.jitter == policy_pb2.JITTER_SYMMETRIC:
            b += ":" + go_float(p.jitter_ratio)
    over = str(policy_pb2.RetryAfterOverCap.Name(p.over_cap)).removeprefix("RETRY_AFTER_OVER_CAP_").lower()
    return b + ";over_cap=" + over + ";min_attempt=" + str(p.min_attempt_ms)
