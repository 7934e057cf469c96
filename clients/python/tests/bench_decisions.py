"""What a decision costs the Python client: a local one (degraded mode:
the policy port, the chain, the event record; without the wait) and one
decided by a retryd over loopback (FailedStep, sync client). Not a test:

    clients/python/.venv/current/bin/python clients/python/tests/bench_decisions.py [N]

It builds cmd/retryd, starts it on loopback, and prints microseconds per
decision, each the best of five runs of N decisions (default 2000).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Callable

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "src")]

import retryd  # noqa: E402
from retrydtest import RetrydServer, build_retryd, temp_dir  # noqa: E402
from retryd.local import LocalDecider  # noqa: E402
from retryd.v1 import events_pb2 as E, policy_pb2 as P, retry_service_pb2 as pb  # noqa: E402

POLICY = P.RetryPolicy(mode=P.MODE_ALWAYS, backoff=P.Backoff(initial_delay_ms=10, jitter_ratio=0))


def request(session: str, step: int) -> pb.FailedStepRequest:
    return pb.FailedStepRequest(
        session_id=session, turn=step, step=step, provider="p", failure=E.Failure(code="SERVER"),
        policy=POLICY, downstream=E.DOWNSTREAM_DECLINED,
    )


def best(n: int, run: Callable[[int, int], object]) -> float:
    """Microseconds per call, the best of five runs of n calls."""
    out = []
    for r in range(5):
        t = time.perf_counter()
        for i in range(n):
            run(r, i)
        out.append((time.perf_counter() - t) / n * 1e6)
    return min(out)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    d = LocalDecider(retry_budget=10**9)
    local = best(n, lambda r, i: d.failed_step(request(f"l{r}-{i % 1000}", i + 1)))
    print(f"local decision (LocalDecider.failed_step): {local:.0f} us")
    tmp = temp_dir()
    srv = RetrydServer(build_retryd(tmp))
    try:
        with retryd.Client(srv.addr, credentials=retryd.insecure()) as c:
            c.failed_step(request("warm-up", 1))
            server = best(n, lambda r, i: c.failed_step(request(f"s{r}-{i}", 1)))
        print(f"server decision (Client.failed_step over loopback): {server:.0f} us")
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
