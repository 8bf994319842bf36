"""Dependencies point one way: ``simulators/`` imports ``streamlearn``, never the reverse.

The rule (DESIGN.md §2) is checked on the source: every ``import`` and
``from ... import`` statement anywhere in a module (functions included) and
every doctest line of ``streamlearn/``. ``bench`` and ``rank`` reach the CLI
through the ``streamlearn.commands`` entry points, not through an import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("simulators", "tests")
_DOCTEST_IMPORT = re.compile(r"^\s*(>>>|\.\.\.)\s+(from|import)\s+([\w.]+)")


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def forbidden_imports(package: Path, forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    """``path:line module`` of every import of a ``forbidden`` package under ``package``."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source, filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            found += [(str(path), node.lineno, n) for n in names if _top(n) in forbidden]
        for lineno, line in enumerate(source.splitlines(), 1):
            match = _DOCTEST_IMPORT.match(line)
            if match and _top(match.group(3)) in forbidden:
                found.append((str(path), lineno, f"{match.group(3)} (doctest)"))
    return [f"{path}:{line} {what}" for path, line, what in sorted(found)]


def test_the_library_never_imports_the_harness() -> None:
    assert forbidden_imports(REPO / "streamlearn") == []


def test_the_rule_catches_a_planted_violation(tmp_path: Path) -> None:
    package = tmp_path / "streamlearn" / "sub"
    package.mkdir(parents=True)
    (package / "ok.py").write_text("import numpy\nfrom streamlearn.features import Batch\n")
    (package / "bad.py").write_text(
        "def f():\n    from simulators.bench import run_bench\n"
        "import simulators\n"
        '"""\n>>> from simulators.replay import replay\n"""\n')
    found = forbidden_imports(tmp_path / "streamlearn")
    assert [f.split(" ", 1)[1] for f in found] == [
        "simulators.bench", "simulators", "simulators.replay (doctest)"]
    assert all("bad.py" in f for f in found)
