"""logging.getLogger("retryd") against a live retryd behind a loopback
proxy: the degraded-mode transitions (WARNING in, INFO out, once each
way), an AwaitRetry re-attach, and a retry the client starts itself."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest

import retryd
from helpers import backoff_policy, failed_step, wait_awaiters
from retrydtest import RetrydServer, TCPProxy
from retryd.v1 import retry_service_pb2 as pb


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "retryd"]


def wait_reachable(client: retryd.Client) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.get_chains("py-log-probe", timeout=1)
            return
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return
        assert time.monotonic() < deadline, "retryd still unreachable through the proxy"
        time.sleep(0.05)


def test_degraded_mode_transitions_are_logged(server: RetrydServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="retryd")
    proxy = TCPProxy(server.addr)
    session = "py-log-degraded"
    try:
        with retryd.Client(proxy.addr, credentials=retryd.insecure(), decision_timeout=0.5) as c:
            c.step_succeeded(pb.StepSucceededRequest(session_id=session, turn=1, step=0))
            proxy.refuse = True
            proxy.cut()
            for step in (1, 2):
                assert c.recover(failed_step(session, 1, step, backoff_policy(10, max_retries=5)), timeout=10).local
            got = records(caplog)
            entered = [m for l, m in got if l == "WARNING" and "deciding locally (degraded mode)" in m]
            assert len(entered) == 1, got  # once, not per decision
            proxy.refuse = False
            wait_reachable(c)
            c.step_succeeded(pb.StepSucceededRequest(session_id=session, turn=1, step=3))
            out = c.recover(failed_step(session, 2, 4, backoff_policy(10)), timeout=10)
            assert not out.local
            c.recover(failed_step(session, 2, 5, backoff_policy(10)), timeout=10)
            got = records(caplog)
            left = [m for l, m in got if l == "INFO" and "degraded mode over" in m]
            assert len(left) == 1, got
    finally:
        proxy.close()


def test_a_reattach_is_logged(server: RetrydServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="retryd")
    proxy = TCPProxy(server.addr)
    session = "py-log-reattach"
    try:
        with retryd.Client(proxy.addr, credentials=retryd.insecure(), reattach_initial=0.02) as c, \
                retryd.Client(server.addr, credentials=retryd.insecure()) as direct:
            result: list[retryd.Outcome] = []
            t = threading.Thread(target=lambda: result.append(c.recover(failed_step(session, 1, 1, backoff_policy(1500)), timeout=20)))
            t.start()
            wait_awaiters(direct, session, 1)
            proxy.cut()
            t.join(20)
            assert result and result[0].retry and not result[0].local
        got = records(caplog)
        assert any(l == "INFO" and "AwaitRetry" in m and "re-attaching" in m for l, m in got), got
    finally:
        proxy.close()


def test_a_local_start_is_logged(server: RetrydServer, caplog: pytest.LogCaptureFixture) -> None:
    """A scheduled retry whose await cannot re-attach until the decision
    timeout after its due time is started by the client, with a warning."""
    caplog.set_level(logging.INFO, logger="retryd")
    proxy = TCPProxy(server.addr)
    session = "py-log-localstart"
    try:
        with retryd.Client(proxy.addr, credentials=retryd.insecure(), decision_timeout=0.3, reattach_initial=0.02,
                           reattach_max=0.05) as c, retryd.Client(server.addr, credentials=retryd.insecure()) as direct:
            result: list[retryd.Outcome] = []
            t = threading.Thread(target=lambda: result.append(c.recover(failed_step(session, 1, 1, backoff_policy(300)), timeout=20)))
            t.start()
            wait_awaiters(direct, session, 1)
            proxy.refuse = True
            proxy.cut()
            t.join(20)
            assert result and result[0].local and result[0].local_start
            direct.cancel_session(session)
        got = records(caplog)
        assert any(l == "WARNING" and "starting the retry locally" in m for l, m in got), got
    finally:
        proxy.close()
