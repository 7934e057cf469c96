"""Parity of the client's policy port (retryd.policy) with the server's
policy package: the Go package's golden keys
(policy/testdata/canonical_keys.json), validation, exact delays for a given
jitter source, and Retry-After parsing (the same tables as the TypeScript
port's tests)."""

from __future__ import annotations

import calendar
import json
import math
from typing import Any, Dict, List, Tuple

import pytest
from google.protobuf import json_format

from retrydtest import ROOT
from retryd import policy as P
from retryd.v1 import events_pb2 as R, policy_pb2


def policy(doc: Dict[str, Any]) -> policy_pb2.RetryPolicy:
    out: policy_pb2.RetryPolicy = json_format.ParseDict(doc, policy_pb2.RetryPolicy())
    return out


GOLDEN = json.loads((ROOT / "policy" / "testdata" / "canonical_keys.json").read_text())


@pytest.mark.parametrize("g", GOLDEN, ids=[g["name"] for g in GOLDEN])
def test_canonical_keys_are_the_servers(g: Dict[str, Any]) -> None:
    assert P.resolve_policy(policy(g["policy"])).key == g["key"]


def test_the_default_policy() -> None:
    assert P.resolve_policy(None).key == P.resolve_policy(policy_pb2.RetryPolicy()).key == GOLDEN[0]["key"]


def test_validation_names_every_bad_field_as_the_server_does() -> None:
    bad = policy(
        {"mode": "MODE_ALWAYS", "maxRetries": 3, "retryableCodes": ["SERVER"],
         "backoff": {"initialDelayMs": 0, "multiplier": 0.5, "jitterRatio": 2}, "schedule": [10]}
    )
    with pytest.raises(P.PolicyValidationError) as err:
        P.resolve_policy(bad)
    assert [v.field for v in err.value.violations] == [
        "max_retries", "retryable_codes", "backoff.initial_delay_ms", "backoff.multiplier", "backoff.jitter_ratio", "schedule",
    ]
    codes = policy({"retryableCodes": ["*", "rate", "ABORTED", "SERVER", "SERVER", "HTTP_*"]})
    with pytest.raises(P.PolicyValidationError) as cerr:
        P.resolve_policy(codes)
    assert [v.field for v in cerr.value.violations] == [
        "retryable_codes[0]", "retryable_codes[1]", "retryable_codes[2]", "retryable_codes[4]",
    ]


def test_decide_states_exact_delays_for_a_given_jitter_source() -> None:
    p = P.resolve_policy(policy({"maxRetries": 4, "backoff": {"initialDelayMs": 100, "maxDelayMs": 1000, "jitterRatio": 0.5}}))
    now = 1_000_000
    for retries, u, delay in [(0, 0, 50), (0, 0.999999, 150), (1, 0.5, 200), (3, 0, 400), (3, 0.999999, 1000)]:
        d = P.decide(p, P.Attempt(retries=retries, code="SERVER"), now, lambda: u)
        assert d.schedule and d.delay_ms == delay and d.retry_number == retries + 1
        assert d.source == R.DELAY_SOURCE_BACKOFF
    assert P.backoff_bounds(p, 4) == (400, 1000)
    out = P.decide(p, P.Attempt(retries=4, code="SERVER"), now, lambda: 0)
    assert not out.schedule and out.reason == R.DELEGATE_REASON_BUDGET_EXHAUSTED
    nan = P.decide(p, P.Attempt(retries=0, code="SERVER"), now, lambda: math.nan)
    assert nan.schedule and nan.delay_ms == 50
    full = P.resolve_policy(policy({"backoff": {"initialDelayMs": 300, "jitter": "JITTER_FULL"}}))
    assert P.backoff_bounds(full, 1) == (0, 300)
    unsafe = P.decide(p, P.Attempt(retries=0, code="SERVER", replay=R.REPLAY_UNSAFE), now, lambda: 0)
    assert not unsafe.schedule and unsafe.reason == R.DELEGATE_REASON_REPLAY_UNSAFE
    late = P.decide(p, P.Attempt(retries=0, code="SERVER", deadline_ms=now + 149), now, lambda: 0)
    assert not late.schedule and late.reason == R.DELEGATE_REASON_DEADLINE
    assert P.decide(p, P.Attempt(retries=0, code="SERVER", deadline_ms=now + 150), now, lambda: 0).schedule
    # Go's math.Round rounds half away from zero: [50, 150] at u=0.5 is 100;
    # [0, 5] at 0.5 is 3 (2.5 away from zero), not Python's round() 2.
    five = P.resolve_policy(policy({"backoff": {"initialDelayMs": 5, "jitter": "JITTER_FULL"}}))
    assert P.decide(five, P.Attempt(retries=0, code="SERVER"), now, lambda: 0.5).delay_ms == 3


NOW = calendar.timegm((2026, 3, 1, 12, 0, 0, 0, 0, 0)) * 1000


def wait(ms: int) -> P.RetryAfter:
    return P.RetryAfter(valid=True, ms=ms)


OVER = P.RetryAfter(valid=True, over=True)
INVALID = P.RetryAfter()
RETRY_AFTER_CASES: List[Tuple[str, int, P.RetryAfter]] = [
    ("120", NOW, wait(120000)), ("0", NOW, wait(0)), ("007", NOW, wait(7000)), ("  120\t\n", NOW, wait(120000)),
    ("2147483", NOW, wait(2147483000)), ("2147484", NOW, OVER), ("99999999999999999999", NOW, OVER),
    ("", NOW, INVALID), ("-1", NOW, INVALID), ("+5", NOW, INVALID), ("1.5", NOW, INVALID), ("1e3", NOW, INVALID),
    ("120s", NOW, INVALID), ("１２０", NOW, INVALID), ("0x10", NOW, INVALID),
    ("Sun, 01 Mar 2026 12:02:00 GMT", NOW, wait(120000)),
    ("Sun, 01 Mar 2026 12:02:00 GMT", NOW + 250, wait(119750)),
    ("Sun, 01 Mar 2026 12:00:00 GMT", NOW, wait(0)),
    ("Sun, 01 Mar 2026 11:59:00 GMT", NOW, wait(0)),
    ("Wed, 25 Mar 2026 12:00:00 GMT", NOW, wait(24 * 86400 * 1000)),
    ("Thu, 26 Mar 2026 12:00:00 GMT", NOW, OVER),
    (" Sun, 01 Mar 2026 12:00:30 GMT ", NOW, wait(30000)),
    ("Sunday, 01-Mar-26 12:00:30 GMT", NOW, wait(30000)),
    ("Sunday, 06-Nov-94 08:49:37 GMT", NOW, wait(0)),
    ("Sun Mar  1 12:01:00 2026", NOW, wait(60000)),
    ("Sun, 32 Mar 2026 12:00:00 GMT", NOW, INVALID),
    ("Sun, 01 Mar 2026 12:02:00 PST", NOW, INVALID),
    ("2026-03-01T12:02:00Z", NOW, INVALID),
    ("Sun, 01 Mar 2026", NOW, INVALID),
]


@pytest.mark.parametrize("value, at, want", RETRY_AFTER_CASES)
def test_retry_after_parses_as_go(value: str, at: int, want: P.RetryAfter) -> None:
    assert P.parse_retry_after(value, at) == want


def test_provider_retry_after() -> None:
    assert P.provider_retry_after(1500, "9", NOW) == wait(1500)
    assert P.provider_retry_after(-1, "9", NOW) == wait(9000)
    assert P.provider_retry_after(2**40, None, NOW) == OVER
    assert P.provider_retry_after(None, None, NOW) == INVALID


@pytest.mark.parametrize(
    "f, want",
    [(2, "2"), (1.5, "1.5"), (0.1, "0.1"), (0, "0"), (1, "1"), (0.0001, "0.0001"), (0.00001, "1e-05"),
     (123456, "123456"), (1e6, "1e+06"), (1234567, "1.234567e+06"), (1e21, "1e+21"), (1e100, "1e+100"),
     (0.30000000000000004, "0.30000000000000004")],
)
def test_go_float(f: float, want: str) -> None:
    assert P.go_float(float(f)) == want
