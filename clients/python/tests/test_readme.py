"""The README's agent loop, run as written against a live retryd, and the
package's version against the binary's. (The built package: test_package.py.)"""

from __future__ import annotations

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

