"""Session fixtures: the retryd binary, built once, and the servers the
suites share (each suite uses its own session ids)."""

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


@pytest.fixture(scope="session")
def conformance_server(retryd_bin: str) -> Iterator[RetrydServer]:
    srv = RetrydServer(retryd_bin, "--config", str(ROOT / "testdata" / "conformance" / "retryd.yaml"))
    try:
        yield srv
    finally:
        srv.stop()
