"""OpenTelemetry through opentelemetry-api, recorded by the SDK's
InMemorySpanExporter, against a live retryd that exports traces: one
logical turn is one trace, each attempt a child of the turn, each retry
attempt linked (retryd.link=backoff) to the retryd backoff span its
Started carries, recover()'s spans under the attempts with the outcome's
attributes, and a local decision's span in degraded mode."""

from __future__ import annotations

import socket
import uuid
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import retryd
from retryd import tracing
from retrydtest import RetrydServer
from retryd.v1 import events_pb2, retry_service_pb2 as pb


@pytest.fixture(scope="module")
def traced(retryd_bin: str) -> Iterator[RetrydServer]:
    """A retryd that exports its spans (to its stdout, which the test
    discards): its backoff spans get a traceparent."""
    srv = RetrydServer(retryd_bin, env={"OTEL_TRACES_EXPORTER": "console"})
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture()
def spans() -> Iterator[Tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    yield tp, exporter
    tp.shutdown()


def parse(traceparent: str) -> Tuple[int, int]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


def named(finished: Sequence[ReadableSpan], name: str) -> List[ReadableSpan]:
    return [s for s in finished if s.name == name]


def test_attempts_of_a_turn_are_one_trace_linked_to_retryds_backoff(
    traced: RetrydServer, spans: Tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tp, exporter = spans
    session = "py-trace-" + uuid.uuid4().hex[:8]
    policy = retryd.Policy(max_retries=2, backoff=retryd.Backoff(initial_delay_ms=20, jitter_ratio=0))
    starts: List[events_pb2.RetryStarted] = []
    with retryd.Client(traced.addr, credentials=retryd.insecure(), tracer_provider=tp) as client:
        with tracing.start_turn("lt-py-trace", tracer_provider=tp):
            started: Optional[events_pb2.RetryStarted] = None
            for attempt in (1, 2, 3):
                with tracing.start_attempt(session_id=session, turn=1, step=attempt, provider="openai",
                                           attempt=attempt, started=started, tracer_provider=tp):
                    if attempt == 3:
                        break  # the third attempt succeeds
                    out = client.recover(session_id=session, turn=1, step=attempt, provider="openai",
                                         code="RATE_LIMIT", http_status=429, policy=policy,
                                         logical_turn_id="lt-py-trace", timeout=10)
                    assert out.retry and out.started is not None
                    started = out.started
                    starts.append(out.started)
        client.step_succeeded(pb.StepSucceededRequest(session_id=session, turn=1, step=3))

    finished = exporter.get_finished_spans()
    [turn] = named(finished, "logical turn")
    assert turn.attributes is not None and turn.attributes["retryd.logical_turn.id"] == "lt-py-trace"
    trace_id = turn.context.trace_id
    attempts = sorted(named(finished, "llm.attempt"), key=lambda s: s.start_time or 0)
    assert len(attempts) == 3
    for n, a in enumerate(attempts, 1):
        assert a.context.trace_id == trace_id, "an attempt outside the turn's trace"
        assert a.parent is not None and a.parent.span_id == turn.context.span_id, "an attempt not a child of its turn"
        assert a.attributes is not None and a.attributes["retryd.attempt"] == n
        assert a.attributes["gen_ai.provider.name"] == "openai" and a.attributes["retryd.session.id"] == session
    assert list(attempts[0].links) == []
    for a, st in zip(attempts[1:], starts):
        # retryd exported its backoff span in the caller's trace (the
        # traceparent each call carries), and the retry's attempt links it.
        assert st.traceparent, "retryd's Started carries no traceparent: is it exporting traces?"
        tid, sid = parse(st.traceparent)
        assert tid == trace_id, "retryd's backoff span is not in the turn's trace"
        [link] = list(a.links)
        assert (link.context.trace_id, link.context.span_id) == (tid, sid)
        assert link.context.is_remote
        assert link.attributes is not None and dict(link.attributes) == {"retryd.link": "backoff"}
        assert a.attributes is not None and a.attributes["retryd.retry.id"] == st.retry_id
        assert a.attributes["retryd.retry.number"] == st.retry_number

    recovers = sorted(named(finished, "retryd.recover"), key=lambda s: s.start_time or 0)
    assert len(recovers) == 2
    for n, (r, a) in enumerate(zip(recovers, attempts), 1):
        assert r.parent is not None and r.parent.span_id == a.context.span_id, "recover() not under its attempt"
        attrs: Dict[str, object] = dict(r.attributes or {})
        assert attrs["retryd.decision"] == "schedule" and attrs["retryd.decision.local"] is False
        assert attrs["retryd.retry.number"] == n and attrs["retryd.delay_ms"] == 20 * 2 ** (n - 1)
        assert attrs["retryd.retry.local_start"] is False
        assert attrs["retryd.session.id"] == session and attrs["retryd.turn"] == 1 and attrs["retryd.step"] == n
        assert attrs["gen_ai.provider.name"] == "openai" and attrs["retryd.failure.code"] == "RATE_LIMIT"
        assert attrs["retryd.logical_turn.id"] == "lt-py-trace"


def test_a_delegation_and_a_refusal_on_the_recover_span(
    traced: RetrydServer, spans: Tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tp, exporter = spans
    with retryd.Client(traced.addr, credentials=retryd.insecure(), tracer_provider=tp) as client:
        out = client.recover(session_id="py-trace-delegate", turn=1, step=1, provider="openai", code="AUTH")
        assert out.kind == "delegate"
        with pytest.raises(retryd.InvalidArgumentError):
            client.recover(session_id="py-trace-bad", turn=1, step=1, provider="openai", code="SERVER",
                           policy=retryd.Policy(mode="schedule", retryable_codes=["*"]))
    delegated, bad = sorted(named(exporter.get_finished_spans(), "retryd.recover"), key=lambda s: s.start_time or 0)
    assert delegated.attributes is not None
    assert delegated.attributes["retryd.decision"] == "delegate"
    assert delegated.attributes["retryd.delegate.reason"] == "DELEGATE_REASON_CODE_NOT_RETRYABLE"
    assert bad.status.status_code.name == "ERROR"
    assert [e.name for e in bad.events] == ["exception"]


def test_a_local_decision_has_its_span(spans: Tuple[TracerProvider, InMemorySpanExporter]) -> None:
    """No replica answers (a port nothing listens on): recover() decides
    locally, with a retryd.local_decision span under its retryd.recover
    span, which records why."""
    tp, exporter = spans
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = "127.0.0.1:%d" % s.getsockname()[1]
    with retryd.Client(addr, credentials=retryd.insecure(), tracer_provider=tp, decision_timeout=0.5) as client:
        out = client.recover(session_id="py-trace-local", turn=1, step=1, provider="openai", code="SERVER",
                             policy=retryd.Policy(max_retries=1, backoff=retryd.Backoff(initial_delay_ms=10, jitter_ratio=0)),
                             timeout=10)
    assert out.retry and out.local
    finished = exporter.get_finished_spans()
    [rec] = named(finished, "retryd.recover")
    [local] = named(finished, "retryd.local_decision")
    assert local.parent is not None and local.parent.span_id == rec.context.span_id
    assert local.attributes is not None and dict(local.attributes) == {
        "retryd.decision": "schedule",
        "retryd.decision.local": True,
        "retryd.retry.id": out.schedule.retry_id if out.schedule else "",
        "retryd.retry.number": 1,
        "retryd.delay_ms": 10,
    }
    assert [e.name for e in local.events] == ["exception"]
    assert rec.attributes is not None and rec.attributes["retryd.decision.local"] is True
    assert "retryd unreachable: deciding locally" in [e.name for e in rec.events]


def test_without_a_span_no_traceparent_is_sent() -> None:
    """Outside any span the client sends no trace context of its own."""
    assert tracing.current_traceparent() is None
    assert tracing.attempt_links(None) == []
    assert tracing.attempt_links(events_pb2.RetryStarted()) == []
    assert tracing.attempt_links(events_pb2.RetryStarted(traceparent="00-" + "0" * 32 + "-b7ad6b7169203331-01")) == []


def test_the_openai_middleware_records_the_same_spans(
    traced: RetrydServer, spans: Tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Model calls through retryd.openai (503, 503, then the answer; then a
    stream cut before any token, then the answer) record the spans of
    recover() and retryd.tracing: each call one trace under a ``logical
    turn`` span, an ``llm.attempt`` per attempt linked to the backoff span
    of retryd's Started record for it, and recover()'s ``retryd.recover``
    span under the attempt whose failure it reported."""
    import openai

    import retryd.openai as ro
    from fakeprovider import UNAVAILABLE, FakeProvider, complete, stream_cut
    from helpers import backoff_policy, watch_session

    tp, exporter = spans
    s = "py-trace-openai-" + uuid.uuid4().hex[:8]
    with retryd.Client(traced.addr, credentials=retryd.insecure(), tracer_provider=tp) as client:
        r = ro.Retrier(client, policy=backoff_policy(20))
        with FakeProvider(UNAVAILABLE, UNAVAILABLE, complete("hello"), stream_cut(()), complete("again")) as p:
            sdk = openai.OpenAI(base_url=p.base_url + "/v1", api_key="test", **r.client_options())
            with ro.session(s):
                out = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                assert out.choices[0].message.content == "hello"
                stream = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
                assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "again"
                stream.close()
        started = [e.started for e in watch_session(client, s) if e.HasField("started")]

    finished = exporter.get_finished_spans()
    turns = sorted(named(finished, "logical turn"), key=lambda x: x.start_time or 0)
    assert [dict(t.attributes or {}) for t in turns] == [
        {"retryd.logical_turn.id": f"{s}/1"}, {"retryd.logical_turn.id": f"{s}/2"}]
    assert turns[0].context.trace_id != turns[1].context.trace_id
    recovers = named(finished, "retryd.recover")
    assert len(recovers) == 3
    for turn, n_attempts in zip(turns, (3, 2)):
        trace_id = turn.context.trace_id
        attempts = sorted((a for a in named(finished, "llm.attempt") if a.context.trace_id == trace_id),
                          key=lambda x: x.start_time or 0)
        assert len(attempts) == n_attempts
        for n, a in enumerate(attempts, 1):
            assert a.parent is not None and a.parent.span_id == turn.context.span_id, "an attempt not a child of its turn"
            assert a.attributes is not None and a.attributes["retryd.attempt"] == n and a.attributes["retryd.step"] == n
            assert a.attributes["gen_ai.provider.name"] == "openai" and a.attributes["retryd.session.id"] == s
        assert list(attempts[0].links) == []
        for n, a in enumerate(attempts[1:], 1):
            # retryd's Started record of the retry carries its backoff span,
            # in the call's trace; the retry's attempt links it.
            assert a.attributes is not None and a.attributes["retryd.retry.number"] == n
            st = [x for x in started if x.retry_id == a.attributes["retryd.retry.id"]]
            assert len(st) == 1 and st[0].traceparent, "no Started with a traceparent for the attempt's retry"
            assert parse(st[0].traceparent)[0] == trace_id, "retryd's backoff span is not in the call's trace"
            [link] = list(a.links)
            assert (link.context.trace_id, link.context.span_id) == parse(st[0].traceparent)
            assert link.attributes is not None and dict(link.attributes) == {"retryd.link": "backoff"}
        for a in attempts[:-1]:
            [rec] = [x for x in recovers if x.parent is not None and x.parent.span_id == a.context.span_id]
            attrs: Dict[str, object] = dict(rec.attributes or {})
            assert attrs["retryd.decision"] == "schedule" and attrs["retryd.session.id"] == s
        assert attempts[-1].end_time is not None and turn.end_time is not None
        assert attempts[-1].end_time <= turn.end_time
