"""Imports every third-party module that the retryd package and its tests
import, in the running interpreter's environment, and exits 1 naming each
one that does not resolve.

The modules are read from the source (every import statement under src/
and tests/), not from the requirements files, so that a package missing
from those files fails here: `scripts/test --check` runs it in each of the
suites' virtual environments on a machine that has nothing else.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def imported_modules(roots: list[Path]) -> dict[str, str]:
    """Top-level module names imported under roots, each with one file that
    imports it."""
    found: dict[str, str] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name, str(path.relative_to(HERE)))
    return found


def main() -> int:
    # As in tests/conftest.py: LiteLLM's import would fetch its price list.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    roots = [HERE / "src", HERE / "tests"]
    local = {p.stem for root in roots for p in root.iterdir()} | {"retryd", "__future__"}
    missing = []
    checked = 0
    for name, where in sorted(imported_modules(roots).items()):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in local:
            continue
        checked += 1
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing.append(f"{name} (imported by {where}): {err}")
    for line in missing:
        print("MISSING", line, file=sys.stderr)
    print(f"{sys.prefix}: {checked} third-party modules, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
