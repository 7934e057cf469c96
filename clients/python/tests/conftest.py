"""The fixtures the suites share: the retryd binary, built once; the
servers (the session's shared one, each suite with its own session ids,
and the ones a module starts for itself: debug_server, limited); and the
SDK suites' client of debug_server."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

# LiteLLM fetches its model price list from the network when it is
# imported unless told to use the copy it ships; the suites reach nothing
# but loopback.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import retryd  # noqa: E402
from retrydtest import ROOT, RetrydServer, build_retryd, temp_dir  # noqa: E402


@pytest.fixture(scope="session")
def retryd_bin() -> Iterator[str]:
    d = temp_dir()
    try:
        yield build_retryd(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# The policy file of the general suites: one provider whose fleet budget
# runs out after one retry and one whose circuit opens after two failures,
# for the fleet delegate reasons.
FLEET_CONFIG = """\
providers:
  py-fleet-budget:
    fleet: {capacity: 1, refillPerSecond: 0.0001, successCredit: 0, disableCircuit: true, maxFleetRetryAfterMs: 0}
  py-fleet-circuit:
    fleet: {disableBudget: true, minSamples: 2, failureThreshold: 0.5, openForMs: 60000, spreadWindowMs: 0, maxFleetRetryAfterMs: 0}
"""


@pytest.fixture(scope="session")
def server(retryd_bin: str) -> Iterator[RetrydServer]:
    """A retryd with the fleet policy file above; its whole event log passes
    the invariant checker after the session."""
    d = temp_dir()
    config = Path(d) / "retryd.yaml"
    config.write_text(FLEET_CONFIG)
    srv = RetrydServer(retryd_bin, "--config", str(config))
    try:
        yield srv
        srv.verify()
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def debug_server(retryd_bin: str) -> Iterator[RetrydServer]:
    """A retryd of the module's own that logs every decision (the SDK
    suites read them: fakeprovider.logged_decisions); its event log passes
    verify after the module."""
    srv = RetrydServer(retryd_bin, "--log-level", "debug")
    try:
        yield srv
        srv.verify()
    finally:
        srv.stop()


@pytest.fixture()
def client(debug_server: RetrydServer) -> Iterator[retryd.Client]:
    """A Client of debug_server, the SDK suites' client. The suites on the
    shared server define their own client fixture over server."""
    with retryd.Client(debug_server.addr, credentials=retryd.insecure()) as c:
        yield c


@pytest.fixture(scope="module")
def limited(retryd_bin: str) -> Iterator[RetrydServer]:
    """A retryd of the module's own that holds one pending retry at most,
    for admission-control refusals (test_errors.py has its own, with one
    awaiter per retry as well)."""
    srv = RetrydServer(retryd_bin, "--max-pending-retries", "1")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def conformance_server(retryd_bin: str) -> Iterator[RetrydServer]:
    srv = RetrydServer(retryd_bin, "--config", str(ROOT / "testdata" / "conformance" / "retryd.yaml"))
    try:
        yield srv
    finally:
        srv.stop()
