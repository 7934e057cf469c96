"""retryd.Client against a live retryd: every RPC, recover's outcomes,
every delegate reason, re-attach through a loopback proxy whose
connections are cut, several awaiters of one retry, and giving up a
waiting recover()."""

from __future__ import annotations

import _thread
import signal
import threading
import time
from typing import Callable, Iterator, List, Optional

import grpc
import pytest

import retryd
from helpers import backoff_policy, failed_step, kinds, wait_awaiters, watch_session
from retrydtest import RetrydServer, TCPProxy
from retryd._transport import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from retryd.v1 import events_pb2, policy_pb2, retry_service_pb2 as pb


@pytest.fixture()
def client(server: RetrydServer) -> Iterator[retryd.Client]:
    with retryd.Client(server.addr, credentials=retryd.insecure()) as c:
        yield c


def test_every_rpc(client: retryd.Client) -> None:
    """FailedStep, AwaitRetry, GetChains, StepSucceeded, CancelRetries (by
    retry and by session), GetProviderState and WatchEvents, each answered
    as the API says."""
    session = "py-every-rpc"
    resp = client.failed_step(failed_step(session, 1, 1, backoff_policy(30)))
    assert resp.decision.WhichOneof("outcome") == "schedule"
    sc = resp.decision.schedule
    assert (sc.retry_number, sc.max_retries, sc.delay_ms) == (1, 2, 30)
    assert sc.delay_source == events_pb2.DELAY_SOURCE_BACKOFF
    assert resp.event.scheduled.retry_id == sc.retry_id

    chains = client.get_chains(session)
    assert (chains.turn, chains.step) == (1, 1)
    assert [(c.provider, c.retries, c.open) for c in chains.chains] == [("anthropic", 1, True)]
    assert chains.chains[0].latest.retry_id == sc.retry_id
    assert chains.chains[0].latest.status == pb.RETRY_STATUS_PENDING

    term = client.await_retry(sc.retry_id, timeout=10)
    assert term.WhichOneof("message") == "started"
    assert term.started.retry_id == sc.retry_id
    assert term.started.started_at.ToNanoseconds() >= sc.due_at.ToNanoseconds()

    closed = client.step_succeeded(pb.StepSucceededRequest(session_id=session, turn=2, step=2, provider="anthropic"))
    assert [(c.provider, c.reason, c.retries) for c in closed.closed] == [("anthropic", events_pb2.CLOSE_REASON_SUCCEEDED, 1)]

    # Cancel by retry id, then by session.
    r2 = client.failed_step(failed_step(session, 3, 3, backoff_policy(5_000))).decision.schedule
    by_id = client.cancel_retry(r2.retry_id)
    assert [(r.retry_id, r.status, r.cancelled.reason) for r in by_id.retries] == [
        (r2.retry_id, pb.RETRY_STATUS_CANCELLED, events_pb2.CANCEL_REASON_REQUESTED)
    ]
    r3 = client.failed_step(failed_step(session, 4, 4, backoff_policy(5_000))).decision.schedule
    by_session = client.cancel_session(session)
    assert [(r.retry_id, r.status) for r in by_session.retries] == [(r3.retry_id, pb.RETRY_STATUS_CANCELLED)]
    with pytest.raises(grpc.RpcError) as unknown:
        client.cancel_session("py-every-rpc-unknown")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

    # GetProviderState: protected by the fleet policy file, or not.
    state = client.get_provider_state("py-fleet-budget")
    assert state.protected and state.budget_capacity == 1
    assert not client.get_provider_state("anthropic").protected
    with pytest.raises(grpc.RpcError) as empty:
        client.get_provider_state("")
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # WatchEvents: the session's log, in order.
    events = watch_session(client, session)
    assert kinds(events) == [
        "scheduled", "started", "closed", "scheduled", "cancelled", "closed", "scheduled", "cancelled", "closed",
    ]
    assert [e.sequence for e in events] == sorted(e.sequence for e in events)
    assert events[0].scheduled.retry_id == sc.retry_id


def test_watch_events_follows_new_events(client: retryd.Client) -> None:
    """Without stop_at_end the stream follows the log; stopping the
    iteration closes it, and a Cancellation ends it from another thread."""
    session = "py-watch-follow"
    first = client.failed_step(failed_step(session, 1, 1, backoff_policy(5_000)))
    seen: List[events_pb2.Event] = []
    cancel = retryd.Cancellation()

    def watch() -> None:
        with pytest.raises(retryd.OperationCancelled):
            for ev in client.watch_events(pb.WatchEventsRequest(session_id=session), cancel=cancel):
                seen.append(ev)

    t = threading.Thread(target=watch)
    t.start()
    client.cancel_retry(first.decision.schedule.retry_id)
    deadline = time.monotonic() + 10
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    cancel.cancel()
    t.join(10)
    assert not t.is_alive()
    assert kinds(seen) == ["scheduled", "cancelled", "closed"]


def test_recover_retries_until_exhausted(client: retryd.Client) -> None:
    """Two retries that each start no earlier than their exact delay, then
    budget_exhausted; the status line of each."""
    session = "py-recover-exhaust"
    p = backoff_policy(50)
    lines = []
    for n, delay in ((1, 0.05), (2, 0.1)):
        begin = time.monotonic()
        out = client.recover(failed_step(session, n, n, p), timeout=10)
        waited = time.monotonic() - begin
        assert out.retry and out.kind == "retry"
        assert out.schedule is not None and out.started is not None
        assert out.schedule.retry_number == n and out.schedule.delay_ms == delay * 1000
        assert waited >= delay, f"recover returned after {waited:.3f}s, before the {delay}s delay"
        assert out.started.retry_id == out.schedule.retry_id and (out.started.turn, out.started.step) == (n, n)
        assert out.started.started_at.ToNanoseconds() >= out.schedule.due_at.ToNanoseconds()
        lines.append(retryd.render_retry(out.event))
    # 50 ms is 0.05000000000000000277 s as a float64: %.1f rounds it up.
    assert lines == ["Retrying model request (1/2). 0.1s", "Retrying model request (2/2). 0.1s"]

    out = client.recover(failed_step(session, 3, 3, p), timeout=10)
    assert out.kind == "delegate" and not out.retry
    assert out.delegate is not None and out.delegate.reason == events_pb2.DELEGATE_REASON_BUDGET_EXHAUSTED
    assert out.event.delegated.reason == events_pb2.DELEGATE_REASON_BUDGET_EXHAUSTED
    assert retryd.render_retry(out.event) is None


def _req(session: str, step: int, **kw: object) -> pb.FailedStepRequest:
    policy = kw.pop("policy", backoff_policy(20, max_delay_ms=1_000))
    provider = kw.pop("provider", "anthropic")
    code = kw.pop("code", "RATE_LIMIT")
    req = failed_step(session, step, step, policy, provider=str(provider), code=str(code))  # type: ignore[arg-type]
    for k, v in kw.items():
        if k == "retry_after_ms":
            req.failure.provider_retry_after_ms = int(v)  # type: ignore[call-overload]
        elif k == "deadline_ms":
            req.deadline.FromNanoseconds(time.time_ns() + int(v) * 1_000_000)  # type: ignore[call-overload]
        else:
            setattr(req, k, v)
    return req


ALWAYS = policy_pb2.RetryPolicy(mode=policy_pb2.MODE_ALWAYS, backoff=policy_pb2.Backoff(initial_delay_ms=20, jitter_ratio=0))
R = events_pb2


def _fleet_reasons(client: retryd.Client) -> List[int]:
    """The fleet reasons need the fleet's state first: one retry spends the
    budget of py-fleet-budget; two failures open py-fleet-circuit."""
    out: List[int] = []
    c1 = client.failed_step(_req("py-deleg-fleet-budget", 1, provider="py-fleet-budget"))
    client.cancel_retry(c1.decision.schedule.retry_id)
    o = client.recover(_req("py-deleg-fleet-budget", 2, provider="py-fleet-budget"), timeout=10)
    assert o.delegate is not None
    out.append(o.delegate.reason)
    c2 = client.failed_step(_req("py-deleg-fleet-circuit", 1, provider="py-fleet-circuit", code="SERVER"))
    client.cancel_retry(c2.decision.schedule.retry_id)
    o = client.recover(_req("py-deleg-fleet-circuit", 2, provider="py-fleet-circuit", code="SERVER"), timeout=10)
    assert o.delegate is not None
    out.append(o.delegate.reason)
    return out


def test_every_delegate_reason(client: retryd.Client) -> None:
    """recover() returns each delegate reason of the API with its event."""
    cases = [
        (R.DELEGATE_REASON_NO_PROVIDER, _req("py-deleg-1", 1, provider="")),
        (R.DELEGATE_REASON_BUDGET_EXHAUSTED, _req("py-deleg-2", 1, policy=backoff_policy(20, max_retries=0))),
        (R.DELEGATE_REASON_CODE_NOT_RETRYABLE, _req("py-deleg-3", 1, code="INVALID_REQUEST")),
        (R.DELEGATE_REASON_DOWNSTREAM_FIRST, _req("py-deleg-4", 1, policy=ALWAYS)),
        (R.DELEGATE_REASON_DOWNSTREAM_HANDLED, _req("py-deleg-5", 1, policy=ALWAYS, downstream=R.DOWNSTREAM_HANDLED)),
        (R.DELEGATE_REASON_RETRY_AFTER_OVER_CAP, _req("py-deleg-6", 1, retry_after_ms=5_000)),
        (R.DELEGATE_REASON_DEADLINE, _req("py-deleg-7", 1, deadline_ms=50)),
        (R.DELEGATE_REASON_REPLAY_UNSAFE, _req("py-deleg-8", 1, replay=R.REPLAY_UNSAFE)),
    ]
    got: List[int] = []
    for want, req in cases:
        out = client.recover(req, timeout=10)
        assert out.kind == "delegate", f"{R.DelegateReason.Name(want)}: got {out.kind}"
        assert out.delegate is not None
        got.append(out.delegate.reason)
        assert out.event.WhichOneof("kind") == "delegated"
        assert out.event.delegated.reason == out.delegate.reason
        assert (out.event.delegated.turn, out.event.delegated.step) == (req.turn, req.step)
    got += _fleet_reasons(client)
    want_all = [v for v in R.DelegateReason.values() if v != 0]
    assert sorted(got) == sorted(want_all), "every delegate reason of the API, each once"


def test_recover_reattaches_through_a_cut_connection(server: RetrydServer) -> None:
    """The connection under a waiting recover() is reset twice, and is down
    when the retry becomes due: recover re-attaches through new connections
    and returns the one start; the log has exactly one started record."""
    proxy = TCPProxy(server.addr)
    try:
        # A decision timeout longer than the outage: this test is about
        # re-attaching, not about degraded mode's own start.
        with retryd.Client(
            proxy.addr, credentials=retryd.insecure(), reattach_initial=0.02, reattach_max=0.1, decision_timeout=30
        ) as c:
            session = "py-reattach"
            result: List[retryd.Outcome] = []
            errors: List[BaseException] = []

            def run() -> None:
                try:
                    result.append(c.recover(failed_step(session, 1, 1, backoff_policy(1_200)), timeout=30))
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            t = threading.Thread(target=run)
            t.start()

            def connected(n: int) -> None:
                deadline = time.monotonic() + 10
                while proxy.accepted < n and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert proxy.accepted >= n, f"recover did not connect again ({proxy.accepted} connections)"

            connected(1)
            time.sleep(0.1)
            assert proxy.cut() >= 1
            # gRPC reconnects after its own backoff (about a second);
            # recover keeps re-attaching until it does.
            connected(2)
            time.sleep(0.1)
            assert proxy.cut() >= 1
            # Down across the due time (1.2 s after the report).
            proxy.refuse = True
            time.sleep(1.5)
            proxy.refuse = False
            t.join(30)
            assert not t.is_alive() and errors == []
            out = result[0]
            assert out.kind == "retry" and out.started is not None and out.schedule is not None
            assert out.started.started_at.ToNanoseconds() >= out.schedule.due_at.ToNanoseconds()
            assert proxy.accepted >= 3, f"only {proxy.accepted} connections: recover did not re-attach"
    finally:
        proxy.close()
    with retryd.Client(server.addr, credentials=retryd.insecure()) as direct:
        assert kinds(watch_session(direct, "py-reattach")) == ["scheduled", "started"]


def test_several_awaiters_of_one_retry(client: retryd.Client) -> None:
    """Five threads await one retry: each gets the same single start."""
    session = "py-many-awaiters"
    sc = client.failed_step(failed_step(session, 1, 1, backoff_policy(1_000))).decision.schedule
    terms: List[pb.AwaitRetryResponse] = []
    lock = threading.Lock()

    def wait() -> None:
        term = client.await_retry(sc.retry_id, timeout=10)
        with lock:
            terms.append(term)

    threads = [threading.Thread(target=wait) for _ in range(5)]
    for t in threads:
        t.start()
    wait_awaiters(client, session, 5)
    state = client.get_chains(session).chains[0].latest
    assert state.status == pb.RETRY_STATUS_PENDING and state.awaiters == 5
    for t in threads:
        t.join(10)
    assert len(terms) == 5
    assert {t.WhichOneof("message") for t in terms} == {"started"}
    assert len({t.started.started_at.ToNanoseconds() for t in terms}) == 1
    assert kinds(watch_session(client, session)) == ["scheduled", "started"]


class _AfterWaiting:
    """Runs act in a thread once recover() waits on the session's pending
    retry; check() raises what kept it from acting (a thread's failure is
    otherwise lost, and the test would fail only with recover's timeout)."""

    def __init__(self, client: retryd.Client, session: str, act: Callable[[], None]) -> None:
        self._error: Optional[BaseException] = None
        self.acted_at = 0.0

        def run() -> None:
            try:
                wait_awaiters(client, session, 1, timeout=WAIT_BOUND)
            except BaseException as e:
                self._error = e
                return
            self.acted_at = time.monotonic()
            act()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def check(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


# WAIT_BOUND bounds how long a test waits for recover() to attach; recover's
# own timeout is longer, so on a loaded machine the test fails for what did
# not happen rather than for the timeout.
WAIT_BOUND = 30


def _assert_cancelled_on_server(client: retryd.Client, session: str, retry_id: str) -> None:
    latest = client.get_chains(session).chains[0].latest
    assert latest.retry_id == retry_id
    assert latest.status == pb.RETRY_STATUS_CANCELLED
    assert latest.cancelled.reason == events_pb2.CANCEL_REASON_REQUESTED


def test_recover_cancellation_cancels_the_retry(client: retryd.Client) -> None:
    """A Cancellation cancelled from another thread ends a waiting recover()
    with RecoverAbortedError, and the retry is cancelled on the server."""
    session = "py-recover-cancel"
    cancel = retryd.Cancellation()
    waiting = _AfterWaiting(client, session, cancel.cancel)
    with pytest.raises(retryd.RecoverAbortedError) as aborted:
        try:
            client.recover(failed_step(session, 1, 1, backoff_policy(60_000, max_delay_ms=60_000)), cancel=cancel)
        finally:
            waiting.check()
    assert time.monotonic() - waiting.acted_at < 5, "recover() went on waiting after the cancellation"
    err = aborted.value
    assert err.reason == "cancelled" and err.cancel_error is None and err.started is None
    assert err.cancelled is not None and err.cancelled.reason == events_pb2.CANCEL_REASON_REQUESTED
    assert err.cancelled.retry_id == err.schedule.retry_id
    _assert_cancelled_on_server(client, session, err.schedule.retry_id)


def test_recover_timeout_cancels_the_retry(client: retryd.Client) -> None:
    session = "py-recover-timeout"
    with pytest.raises(retryd.RecoverAbortedError) as aborted:
        client.recover(failed_step(session, 1, 1, backoff_policy(10_000)), timeout=1.5)
    assert aborted.value.reason == "timeout"
    assert aborted.value.cancelled is not None
    _assert_cancelled_on_server(client, session, aborted.value.schedule.retry_id)


def test_keyboard_interrupt_cancels_the_retry(client: retryd.Client) -> None:
    """Ctrl-C while recover() waits: the retry is cancelled on the server
    and the KeyboardInterrupt goes on."""
    session = "py-recover-interrupt"
    # Ctrl-C reaches a process whose SIGINT is handled: a shell starts a
    # background job with SIGINT ignored, and interrupt_main() then does
    # nothing, so the test sets Python's own handler for its duration.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_while_waiting(client, session)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_while_waiting(client: retryd.Client, session: str) -> None:
    waiting = _AfterWaiting(client, session, _thread.interrupt_main)
    with pytest.raises(KeyboardInterrupt):
        try:
            client.recover(failed_step(session, 1, 1, backoff_policy(60_000, max_delay_ms=60_000)), timeout=2 * WAIT_BOUND)
        finally:
            waiting.check()
    chain = client.get_chains(session).chains[0]
    _assert_cancelled_on_server(client, session, chain.latest.retry_id)


def test_await_retry_timeout_leaves_the_retry(client: retryd.Client) -> None:
    """await_retry alone does not cancel: TimeoutError, retry still pending."""
    session = "py-await-timeout"
    sc = client.failed_step(failed_step(session, 1, 1, backoff_policy(10_000))).decision.schedule
    with pytest.raises(TimeoutError):
        client.await_retry(sc.retry_id, timeout=0.2)
    assert client.get_chains(session).chains[0].latest.status == pb.RETRY_STATUS_PENDING
    client.cancel_retry(sc.retry_id)


def test_recover_returns_a_cancelled_retry(client: retryd.Client) -> None:
    """A retry cancelled by someone else while recover() waits is the
    "cancelled" outcome, not an error."""
    session = "py-recover-cancelled"
    result: List[retryd.Outcome] = []
    t = threading.Thread(target=lambda: result.append(client.recover(failed_step(session, 1, 1, backoff_policy(10_000)), timeout=10)))
    t.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            client.cancel_session(session)
            break
        except grpc.RpcError:
            time.sleep(0.02)
    t.join(10)
    out = result[0]
    assert out.kind == "cancelled" and not out.retry
    assert out.cancelled is not None and out.cancelled.reason == events_pb2.CANCEL_REASON_REQUESTED


def test_await_unknown_retry_is_not_found(client: retryd.Client) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.await_retry("no-such-retry", timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_default_keepalive_finds_a_silent_connection(server: RetrydServer) -> None:
    """The client's default keepalive (a ping after KEEPALIVE_TIME_MS
    without traffic, the connection closed when none is answered within
    KEEPALIVE_TIMEOUT_MS) finds a connection that went silent: a call made
    with a minute's timeout on a connection that drops everything (the
    proxy's silence) ends within keepalive time + timeout, answered over a
    new connection (gRPC's retry of GetChains on UNAVAILABLE), where
    without keepalive it would wait for its timeout."""
    proxy = TCPProxy(server.addr)
    try:
        with retryd.Client(proxy.addr, credentials=retryd.insecure()) as c:
            c.failed_step(failed_step("py-keepalive", 1, 1, backoff_policy(5_000)), timeout=10)
            assert proxy.silence() == 1
            began = time.monotonic()
            c.get_chains("py-keepalive", timeout=60)
            took = time.monotonic() - began
        detect = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000
        # No sooner than an unanswered ping can time out, no later than
        # the first ping's timeout (plus slack for a loaded machine).
        assert KEEPALIVE_TIMEOUT_MS / 1000 - 1 <= took <= detect + 5, f"the call took {took:.1f} s"
        assert proxy.accepted >= 2, f"{proxy.accepted} connections: the call was not answered over a new one"
    finally:
        proxy.close()
