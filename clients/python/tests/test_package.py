"""The package as a user gets it: `python -m build` makes the sdist and,
from it, the wheel; the wheel installs into a fresh virtual environment
with its dependencies from PyPI (pinned by requirements/current.txt, no
extras); and a script run from outside the repository (its own working
directory, no PYTHONPATH) uses it against a live retryd: a schedule whose
Started it awaits, then, with the server killed, a local decision."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import retryd
from retrydtest import RetrydServer

HERE = Path(__file__).resolve().parents[1]

SMOKE = textwrap.dedent(
    """
    import sys
    import retryd

    assert retryd.__file__.startswith(sys.prefix), retryd.__file__
    assert not retryd.tracing.AVAILABLE, "opentelemetry-api came without the otel extra"
    policy = retryd.Policy(max_retries=3, backoff=retryd.Backoff(initial_delay_ms=50, jitter_ratio=0))
    with retryd.Client(sys.argv[1], credentials=retryd.insecure(), decision_timeout=1) as client:
        out = client.recover(session_id="py-smoke", turn=1, step=1, provider="openai",
                             code="RATE_LIMIT", http_status=429, policy=policy, timeout=20)
        assert out.retry and not out.local and out.started is not None
        assert out.started.retry_id == out.schedule.retry_id
        print("started", out.started.retry_id, retryd.render_retry(out.event), flush=True)
        sys.stdin.readline()  # the test kills retryd meanwhile
        out = client.recover(session_id="py-smoke", turn=1, step=2, provider="openai",
                             code="SERVER", http_status=503, policy=policy, timeout=20)
        assert out.retry and out.local and retryd.is_local(out.event), out
        assert out.schedule.retry_number == 2 and out.schedule.delay_ms == 100
        print("local", out.schedule.retry_id, retryd.render_retry(out.event), flush=True)
    """
)


def test_built_wheel_installs_from_pypi_and_runs_outside_the_repository(tmp_path: Path, retryd_bin: str) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(HERE)],
                   check=True, capture_output=True, text=True)
    version = retryd.__version__
    sdist = dist / f"retryd-{version}.tar.gz"
    wheel = dist / f"retryd-{version}-py3-none-any.whl"
    assert sorted(p.name for p in dist.iterdir()) == sorted([sdist.name, wheel.name])

    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for want in ("LICENSE", "pyproject.toml", "README.md", "src/retryd/py.typed", "src/retryd/v1/retry_service_pb2.pyi"):
        assert want in names, f"{want} missing from the sdist"
    with zipfile.ZipFile(wheel) as zf:
        files = set(zf.namelist())
        meta = Parser().parsestr(zf.read(f"retryd-{version}.dist-info/METADATA").decode())
    for want in ("retryd/py.typed", "retryd/v1/retry_service_pb2.pyi", "retryd/v1/retry_service_pb2_grpc.py",
                 "retryd/tracing.py", f"retryd-{version}.dist-info/licenses/LICENSE"):
        assert want in files, f"{want} missing from the wheel"
    assert not any(f.startswith(("retryd/_gen/", "tests/")) for f in files)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.11"
    requires = meta.get_all("Requires-Dist") or []
    for dep in ("grpcio", "protobuf", "googleapis-common-protos"):
        assert any(r.startswith(dep) and "extra ==" not in r for r in requires), (dep, requires)
    assert set(meta.get_all("Provides-Extra") or []) >= {"otel", "httpx", "openai", "anthropic", "langgraph", "litellm"}
    assert "Homepage, https://github.com/retryd/retryd" in (meta.get_all("Project-URL") or [])

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
                    "-c", str(HERE / "requirements" / "current.txt"), str(wheel)],
                   check=True, capture_output=True, text=True, env=clean_env)
    subprocess.run([py, "-m", "pip", "check"], check=True, capture_output=True, env=clean_env)

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "smoke.py").write_text(SMOKE)
    srv = RetrydServer(retryd_bin)
    try:
        smoke = subprocess.Popen([py, "smoke.py", srv.addr], cwd=work, env=clean_env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert smoke.stdout is not None and smoke.stdin is not None
        first = smoke.stdout.readline()
        assert first.startswith("started "), first + smoke.communicate(timeout=30)[1]
        assert first.rstrip().endswith("Retrying model request (1/3). 0.1s")
        srv.kill()
        out, err = smoke.communicate("\n", timeout=60)
        assert smoke.returncode == 0, err
        assert out.startswith("local local-"), out + err
        assert out.rstrip().endswith("Retrying model request (2/3). 0.1s")
    finally:
        srv.stop()
