"""Dependencies point one way.

* ``simulators/`` imports ``streamlearn``, never the reverse: checked on the source,
  every ``import`` and ``from ... import`` anywhere in a module (functions included) and
  every doctest line of ``streamlearn/``. ``bench`` and ``rank`` reach the CLI through the
  ``streamlearn.commands`` entry points, not through an import.
* Inside ``streamlearn/`` the packages (and top-level modules) form the layers of
  :data:`LAYERS` (docs/architecture.md): every import, lazy ones included (only those
  under ``if TYPE_CHECKING:`` are types, not imports), goes to the same layer or one
  below, and no group of packages imports itself in a circle.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
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


#: The layers of streamlearn/, bottom first (docs/architecture.md says what each holds).
LAYERS: list[set[str]] = [
    {"__init__", "errors", "actions", "features", "snapshot", "config_fields", "plotting"},
    {"learners", "rankers", "evaluation", "candidates"},
    {"events", "datasets"},
    {"join", "engine"},
    {"transport", "durability"},
    {"retrain", "replay", "sync"},
    {"service"},
    {"config"},
    {"commands"},
    {"cli", "__main__"},
]


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_imports(package: Path) -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) → the ``path:line module`` of each import between two units of
    ``package`` (a unit: a subpackage or a top-level module)."""
    name = package.name
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = rel.parts if rel.name != "__init__" else rel.parts[:-1]
        source = _unit(".".join(parts)) if len(parts) > 1 else "__init__"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module]
            for target in targets:
                if target == name or not target.startswith(name + "."):
                    continue
                dest = _unit(target)
                if dest != source:
                    edges[source, dest].append(f"{path}:{node.lineno} {target}")
    return dict(edges)


def cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def upward(edges: dict[tuple[str, str], list[str]], layers: list[set[str]]) -> list[str]:
    """Imports from a unit to one of a higher layer, or of a unit no layer names."""
    level = {unit: i for i, layer in enumerate(layers) for unit in layer}
    bad = []
    for (a, b), where in sorted(edges.items()):
        if a not in level or b not in level:
            bad.append(f"{a} -> {b}: not in LAYERS ({where[0]})")
        elif level[b] > level[a]:
            bad.append(f"{a} -> {b} runs up ({where[0]})")
    return bad


def test_no_package_imports_in_a_circle() -> None:
    assert cycles(package_imports(REPO / "streamlearn")) == []


def test_every_import_points_down_the_layers() -> None:
    assert upward(package_imports(REPO / "streamlearn"), LAYERS) == []


def test_a_planted_cycle_and_an_upward_import_are_caught(tmp_path: Path) -> None:
    pkg = tmp_path / "streamlearn"
    for sub in ("join", "engine", "service"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "join" / "a.py").write_text("def f():\n    from streamlearn.engine.b import g\n")
    (pkg / "engine" / "b.py").write_text("from streamlearn.join.a import f\n"
                                         "import streamlearn.service.c\n")
    (pkg / "service" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from streamlearn.join import a\n"
        "from streamlearn.errors import x\n")
    edges = package_imports(pkg)
    assert cycles(edges) == [["engine", "join"]]  # a lazy import counts
    assert upward(edges, LAYERS) == [f"engine -> service runs up ({pkg / 'engine' / 'b.py'}:2 "
                                     "streamlearn.service.c)"]
    assert ("service", "join") not in edges  # typing only
