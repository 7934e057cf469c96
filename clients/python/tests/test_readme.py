"""The README's agent loop, run as written against a live retryd, and the
package's version against the binary's."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

import retryd
from retrydtest import RetrydServer

README = Path(__file__).resolve().parents[1] / "README.md"


def block(after_heading: str, lang: str) -> str:
    text = README.read_text()
    section = text[text.index(after_heading) :]
    m = re.search(r"```" + lang + r"\n(.*?)```", section, re.S)
    assert m is not None, f"no {lang} block after {after_heading!r}"
    return m.group(1)


def test_readme_agent_loop(server: RetrydServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code = block("## An agent loop", "python")
    want = block("It prints:", "text")
    monkeypatch.setenv("RETRYD_ADDR", server.addr)
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out == want


def test_version_is_the_binarys(retryd_bin: str) -> None:
    out = subprocess.run([retryd_bin, "version"], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "retryd"
    assert Version(retryd.__version__) == Version(out[1])
    assert str(Version(out[1])) == retryd.__version__


def test_wheel_builds_offline(tmp_path: Path) -> None:
    """The wheel builds with Debian's setuptools and no index, carries the
    typing marker and the stubs, and has the binary's version."""
    import zipfile

    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        ["/usr/bin/python3", "-m", "pip", "wheel", "--no-index", "--no-build-isolation", "--no-deps", "-w", str(tmp_path), str(root)],
        check=True, capture_output=True, env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    wheels = list(tmp_path.glob("retryd-*.whl"))
    assert [w.name for w in wheels] == [f"retryd-{retryd.__version__}-py3-none-any.whl"]
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for want in ("retryd/py.typed", "retryd/v1/retry_service_pb2.pyi", "retryd/v1/retry_service_pb2_grpc.py",
                 "retryd/_gen/google/rpc/error_details_pb2.py"):
        assert want in names
