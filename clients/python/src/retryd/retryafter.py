"""Provider delay instructions, as retryd's policy package reads them
(policy/retryafter.go): provider_retry_after_ms, or a raw HTTP Retry-After
header (delta-seconds or an HTTP-date) resolved against the current time."""

from __future__ import annotations

import calendar
import math
import re
from dataclasses import dataclass
from typing import Optional

from .v1 import events_pb2

#: The largest delay any policy may name (a signed 32-bit ms timer).
MAX_DELAY_MS = 2**31 - 1


@dataclass(frozen=True)
class RetryAfter:
    """A provider's delay instruction after parsing."""

    valid: bool = False
    """False when there was no instruction or it was malformed."""
    ms: int = 0
    """The requested delay (meaningful when not over)."""
    over: bool = False
    """Too large to represent as a timer: over any cap."""


NO_RETRY_AFTER = RetryAfter()


def provider_retry_after(ms: Optional[int], header: Optional[str], now_ms: float) -> RetryAfter:
    """Interprets the two ways a failure can carry a provider delay: ms
    (takes precedence when present and not negative) and header (a raw HTTP
    Retry-After, resolved against now_ms). Negative or malformed values are
    ignored."""
    if ms is not None and ms >= 0:
        if ms > MAX_DELAY_MS:
            return RetryAfter(valid=True, over=True)
        return RetryAfter(valid=True, ms=ms)
    if header is not None:
        return parse_retry_after(header, now_ms)
    return NO_RETRY_AFTER


def failure_retry_after(failure: events_pb2.Failure, now_ms: float) -> RetryAfter:
    """provider_retry_after of a Failure's provider_retry_after_ms and retry_after."""
    return provider_retry_after(
        failure.provider_retry_after_ms if failure.HasField("provider_retry_after_ms") else None,
        failure.retry_after if failure.HasField("retry_after") else None,
        now_ms,
    )


_SPACE = " \t\n\v\f\r\u0085\u00a0"
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_LONG_DAYS = ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"]
# The three layouts of net/http.ParseTime, with Go's time.Parse rules: a
# space matches a run of spaces, names are case-insensitive, an hour may
# have one digit, a fraction may follow the seconds.
_IMF = re.compile(r"^([A-Za-z]{3}), +(\d\d) +([A-Za-z]{3}) +(\d{4}) +(\d\d?):(\d\d):(\d\d)((?:[.,]\d+)?) +GMT$", re.A)
_RFC850 = re.compile(
    r"^([A-Za-z]+), +(\d\d)-([A-Za-z]{3})-(\d\d) +(\d\d?):(\d\d):(\d\d)((?:[.,]\d+)?) +([A-Z]{3,5}|GMT[+-]\d{1,2})$", re.A
)
_ASCTIME = re.compile(r"^([A-Za-z]{3}) +([A-Za-z]{3}) +(\d\d?) +(\d\d?):(\d\d):(\d\d)((?:[.,]\d+)?) +(\d{4})$", re.A)


def parse_retry_after(value: str, now_ms: float) -> RetryAfter:
    """Parses an HTTP Retry-After value (RFC 9110 §10.2.3) as Go's
    policy.ParseRetryAfter does: delta-seconds, or an HTTP-date in one of
    the three forms net/http accepts. A date in the past means no wait."""
    v = value.strip(_SPACE)
    if v == "":
        return NO_RETRY_AFTER
    if re.fullmatch(r"[0-9]+", v, re.A):
        secs = int(v)
        if secs > MAX_DELAY_MS // 1000:
            return RetryAfter(valid=True, over=True)
        return RetryAfter(valid=True, ms=secs * 1000)
    t = _parse_http_date(v)
    if t is None:
        return NO_RETRY_AFTER
    d = t - now_ms
    if d <= 0:
        return RetryAfter(valid=True, ms=0)
    if d > MAX_DELAY_MS:
        return RetryAfter(valid=True, over=True)
    return RetryAfter(valid=True, ms=math.ceil(d))  # round up: a little longer is always safe


def _parse_http_date(v: str) -> Optional[float]:
    m = _IMF.match(v)
    if m:
        if m[1].lower() not in _DAYS:
            return None
        return _civil(int(m[2]), m[3], int(m[5]), int(m[6]), int(m[7]), m[8], int(m[4]))
    m = _RFC850.match(v)
    if m:
        if m[1].lower() not in _LONG_DAYS:
            return None
        zone = m[9]
        if not _zone_ok(zone):
            return None
        offset_h = int(zone[3:]) if zone.startswith("GMT") and len(zone) > 3 else 0
        yy = int(m[4])
        t = _civil(int(m[2]), m[3], int(m[5]), int(m[6]), int(m[7]), m[8], 1900 + yy if yy >= 69 else 2000 + yy)
        return None if t is None else t - offset_h * 3_600_000
    m = _ASCTIME.match(v)
    if m:
        if m[1].lower() not in _DAYS:
            return None
        return _civil(int(m[3]), m[2], int(m[4]), int(m[5]), int(m[6]), m[7], int(m[8]))
    return None


def _zone_ok(z: str) -> bool:
    """Go's parseTimeZone rule for an abbreviation."""
    if z.startswith("GMT") and len(z) > 3:
        return -23 <= int(z[3:]) <= 23
    if len(z) == 3:
        return True
    if len(z) == 4:
        return z[3] == "T" or z == "WITA"
    if len(z) == 5:
        return z[4] == "T"
    return False


def _civil(day: int, month: str, hour: int, minute: int, sec: int, frac: str, year: int) -> Optional[float]:
    if month.lower() not in _MONTHS or hour >= 24 or minute >= 60 or sec >= 60 or year < 1:
        return None
    mi = _MONTHS.index(month.lower()) + 1
    if not 1 <= day <= calendar.monthrange(year, mi)[1]:
        return None
    base = calendar.timegm((year, mi, day, hour, minute, sec, 0, 0, 0)) * 1000
    fraction = float("0." + frac[1:]) * 1000 if frac else 0.0
    return base + fraction
