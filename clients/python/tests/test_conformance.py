"""Every shared conformance vector (testdata/conformance/*.json) through the
Python client against a live retryd, once through Client and once through
AsyncClient (each against a server of its own, since a vector's session
can be played once per server), then the invariant checker over each
server's log. clients/go and clients/ts run the same files."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, Iterator, Set

import pytest

import retryd
from retrydtest import ROOT, RetrydServer
from retryd.v1 import events_pb2, policy_pb2
from vectors import AsyncVectorClient, SyncVectorClient, VectorClient, load_vectors, run_vector

VECTORS = load_vectors(ROOT)
CONFIG = str(ROOT / "testdata" / "conformance" / "retryd.yaml")


@pytest.fixture(scope="module", params=["sync", "async"])
def vector_client(request: Any, retryd_bin: str) -> Iterator[VectorClient]:
    srv = RetrydServer(retryd_bin, "--config", CONFIG)
    try:
        if request.param == "sync":
            with retryd.Client(srv.addr, credentials=retryd.insecure()) as c:
                yield SyncVectorClient(c)
        else:
            loop = asyncio.new_event_loop()

            async def make() -> retryd.AsyncClient:
                return retryd.AsyncClient(srv.addr, credentials=retryd.insecure())

            ac = loop.run_until_complete(make())
            try:
                yield AsyncVectorClient(loop, ac)
            finally:
                loop.run_until_complete(ac.close())
                loop.close()
        # After every vector of this client: the whole log is consistent.
        print(srv.verify())
    finally:
        srv.stop()


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector(vector_client: VectorClient, vector: Dict[str, Any]) -> None:
    run_vector(vector_client, vector)


def test_vectors_cover_every_mode_reason_and_op() -> None:
    """The vectors keep covering what every client suite checks: every mode,
    delegate reason, delay source and FAILED_PRECONDITION reason, both
    Retry-After forms, each op and recover outcome."""
    assert len(VECTORS) >= 12, f"only {len(VECTORS)} vectors"
    assert len({v["session"] for v in VECTORS}) == len(VECTORS), "every vector needs its own session id"
    seen: Set[str] = set()
    for v in VECTORS:
        for s in v["steps"]:
            seen.add("op:" + s["op"])
            e = s["expect"]
            for key in ("mode", "reason", "delaySource"):
                if key in e:
                    seen.add(e[key])
            if "reason" in e.get("error", {}):
                seen.add("error:" + e["error"]["reason"])
            if "outcome" in e:
                seen.add("outcome:" + e["outcome"])
            if "terminal" in e:
                seen.add("terminal:" + e["terminal"])
            if "delayMsMin" in e or "delayMsMax" in e:
                seen.add("jitter-bounds")
            if "sameRetryAs" in e:
                seen.add("same-retry")
            failure = s.get("request", {}).get("failure", {})
            if "providerRetryAfterMs" in failure:
                seen.add("retry-after:ms")
            if "retryAfter" in failure:
                seen.add("retry-after:header")
    want = (
        [n for n in policy_pb2.Mode.keys() if policy_pb2.Mode.Value(n) != 0]
        + [n for n in events_pb2.DelegateReason.keys() if events_pb2.DelegateReason.Value(n) != 0]
        + [n for n in events_pb2.DelaySource.keys() if events_pb2.DelaySource.Value(n) != 0]
        + ["error:" + r for r in retryd.errors.PRECONDITION_REASONS]
        + ["op:" + op for op in ("failedStep", "recover", "awaitRetry", "cancelRetries", "stepSucceeded")]
        + ["outcome:retry", "outcome:delegate", "outcome:aborted", "terminal:started", "terminal:cancelled"]
        + ["jitter-bounds", "same-retry", "retry-after:ms", "retry-after:header"]
    )
    missing = [w for w in want if w not in seen]
    assert missing == [], "not covered by any vector"


def test_the_runner_reads_the_shared_files() -> None:
    """No Python-only copies: the vectors are the repository's files."""
    assert all((Path(ROOT) / "testdata" / "conformance" / (v["name"] + ".json")).is_file() for v in VECTORS)
