"""Honouring google.rpc.RetryInfo on RESOURCE_EXHAUSTED: retryd's
admission control records nothing when it refuses, so the same request may
be sent again after the delay it asks for (as the Go client does)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

import grpc

from ._log import log
from .errors import is_limit_reached, retry_delay, status_code


#: How often a call refused with RESOURCE_EXHAUSTED and a RetryInfo is
#: sent again after the delay the server asked for.
DEFAULT_EXHAUSTED_RETRIES = 2


def _delay(err: grpc.RpcError, attempt: int, retries: int, deadline: Optional[float]) -> Optional[float]:
    """The wait before sending again, or None to raise err."""
    if attempt >= retries or status_code(err) != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    delay = retry_delay(err)
    if delay is None:
        return None
    d = delay.total_seconds()
    if deadline is not None and deadline - time.monotonic() < d:
        return None
    log.info("retryd: admission control refused the call (%s): sending it again in %.3fs", is_limit_reached(err) or "RESOURCE_EXHAUSTED", d)
    return d


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def honor_retry_info(
    call: Callable[[Optional[float]], Any],
    timeout: Optional[float],
    retries: int,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """Runs call(timeout left) (a stub call, untyped: the callers cast
    what it returns), and again at most retries times after the
    delay of a RESOURCE_EXHAUSTED refusal's RetryInfo, while timeout allows."""
    deadline = None if timeout is None else time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            return call(_left(deadline))
        except grpc.RpcError as err:
            d = _delay(err, attempt, retries, deadline)
            if d is None:
                raise
        sleep(d)
        attempt += 1


async def honor_retry_info_async(call: Callable[[Optional[float]], Any], timeout: Optional[float], retries: int) -> Any:
    """honor_retry_info for coroutines."""
    deadline = None if timeout is None else time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            return await call(_left(deadline))
        except grpc.RpcError as err:
            d = _delay(err, attempt, retries, deadline)
            if d is None:
                raise
        await asyncio.sleep(d)
        attempt += 1
