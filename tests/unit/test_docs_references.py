"""The docs stand alone: every repository file they name is in the repository.

Scanned: ``README.md`` and ``docs/**/*.md`` (their whole text, code blocks included), the
text files under ``deploy/``, the comments and string literals (docstrings included) of
every module under ``streamlearn/`` and ``simulators/``, and the docstrings and comments
of ``tests/``. A reference is

* a markdown link ``[text](target)``: relative to the document's folder; an ``#anchor``
  must be a heading of the target (GitHub's slugs);
* a path under a top-level folder (``streamlearn/``, ``simulators/``, ``deploy/``,
  ``tests/``, ``docs/``), backticked or bare: relative to the repository's root;
* a relative path ending in ``.py`` or ``.md`` (``service/rollout.py``): relative to the
  document's folder, the root or ``streamlearn/``;
* a bare ``<name>.md``: in the document's folder, ``docs/`` or the root; a bare
  ``<name>.py``: some module of the repository has that name;
* a dotted ``streamlearn.<module>.<name>`` or ``simulators.<module>``: the module exists
  and its source holds the name (or the code spells it out: a logger, a topic);
* a section of a document, ``docs/daemon.md §3`` or ``docs/performance.md, "Decoding in
  chunks"``: a heading that starts with that number, or a heading (after its number) or
  bold paragraph lead of that document that starts with the quoted words.

Addresses (``http…``), paths of a machine (``/tmp/…``), placeholders and globs
(``<checkpoint.dir>/rankers``, ``test_*.py``) and what the scripts create (the anchored
entries of ``.gitignore``, such as the broker's jars) are not references. Every text also
fails on naming the team's private briefing files (:data:`PRIVATE`) and on an issue
number: a reader of the repository has neither.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("streamlearn", "simulators", "deploy", "tests", "docs")
#: Files the team's briefing had and the repository does not (spelled so this file does
#: not name them itself).
PRIVATE = tuple(f"{name}.md" for name in ("DESIGN", "ALGORITHMS", "STYLE"))
#: Modules of an older commit, named where a measurement says how that commit was run.
OLDER_CODE = {"simulators.experiment", "simulators.replay"}
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"}

_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s)\]>\"'`]+|\bwww\.[^\s)\]>\"'`]+")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_BEFORE = r"(?<![\w./~$\-])"
_ROOTED = re.compile(_BEFORE + r"(?:\./)?((?:" + "|".join(ROOTS) + r")/[\w./\-]*)")
_RELATIVE = re.compile(_BEFORE + r"((?:\.\./)*[\w\-]+(?:/[\w\-.]+)+\.(?:py|md))\b")
_BARE = re.compile(_BEFORE + r"([\w\-]+\.(?:md|py))\b(?![\w/\-])")
_SECTION = re.compile(_BEFORE + r"((?:[\w\-]+/)*[\w\-]+\.md)\)?,?\s+§\s?([\w']+)")
_QUOTED = re.compile(_BEFORE + r"((?:[\w\-]+/)*[\w\-]+\.md)\)?,\s+[\"“]([^\"”\n]+)[\"”]")
_DOTTED = re.compile(r"(?<![\w.\-/])((?:streamlearn|simulators)(?:\.\w[\w\-]*)+)")
_FILE_NAMES = (".toml", ".yaml", ".yml", ".json", ".md", ".py")  # streamlearn.toml
_ISSUE = re.compile(r"\b[Ii]ssues?[ \-_]?#?\d+")
_PATTERN_NEXT = set("*<{$[")


@dataclass(frozen=True)
class Text:
    """A piece of text to scan: where it is (``path``, the line it starts on) and what."""

    path: Path
    line: int
    text: str


def _python_texts(path: Path, *, strings: bool) -> Iterator[Text]:
    """The comments of a module and its string literals (``strings``) or docstrings."""
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT or (strings and token.type == tokenize.STRING):
            yield Text(path, token.start[0], token.string)
    if strings:
        return
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                yield Text(path, first.lineno, first.value.value)


def _files(root: Path, folder: str, pattern: str, ignored: list[Path]) -> Iterator[Path]:
    for path in sorted((root / folder).rglob(pattern)):
        if (path.is_file() and not _SKIP_DIRS.intersection(path.parts)
                and not any(path.is_relative_to(i) for i in ignored)):
            yield path


def generated(root: Path) -> list[Path]:
    """What the scripts create and git ignores: the anchored entries of ``.gitignore``."""
    gitignore = root / ".gitignore"
    if not gitignore.is_file():
        return []
    entries = gitignore.read_text(encoding="utf-8").splitlines()
    return [root / e.strip().strip("/") for e in entries if e.startswith("/")]


def texts(root: Path) -> Iterator[Text]:
    """Every text the repository shows a reader, as :class:`Text` pieces."""
    ignored = generated(root)
    for readme in (root / "README.md",):
        if readme.is_file():
            yield Text(readme, 1, readme.read_text(encoding="utf-8"))
    for path in _files(root, "docs", "*.md", ignored):
        yield Text(path, 1, path.read_text(encoding="utf-8"))
    for path in _files(root, "deploy", "*", ignored):
        try:
            yield Text(path, 1, path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:  # a binary file
            continue
    for folder in ("streamlearn", "simulators"):
        for path in _files(root, folder, "*.py", ignored):
            yield from _python_texts(path, strings=True)
    for path in _files(root, "tests", "*.py", ignored):
        yield from _python_texts(path, strings=False)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces → hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """The headings of a markdown text, outside fenced code."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(match.group(1))
    return found


def titles(markdown: str) -> list[str]:
    """What a citation may quote: the headings and the bold paragraph leads."""
    return headings(markdown) + re.findall(r"\*\*([^*]+)\*\*", markdown)


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(markdown):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[*`_]", "", text)).lower()


class Resolver:
    """Where references of a repository (``root``) point, and whether that exists."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ignored = generated(root)
        self.spelled = {m.group(1) for folder in ("streamlearn", "simulators", "deploy")
                        for p in _files(root, folder, "*", self.ignored) if p.suffix != ".pyc"
                        for m in re.finditer(r"[\"'](streamlearn\.[\w.\-]+)[\"']",
                                             p.read_text(encoding="utf-8", errors="replace"))}
        self.modules = {p.name for folder in ("streamlearn", "simulators", "tests", "deploy")
                        for p in _files(root, folder, "*.py", [])}

    def importable(self, dotted: str) -> bool:
        """Whether ``dotted`` names a module of the repository or a name one of them holds
        (found in its source), or is a name the code spells out (a logger, a topic)."""
        if dotted in self.spelled or dotted in OLDER_CODE or dotted.endswith(_FILE_NAMES):
            return True
        parts = dotted.split(".")
        folder = self.root
        for i, part in enumerate(parts):
            if (folder / part / "__init__.py").is_file():
                folder = folder / part
                continue
            module = folder / f"{part}.py"
            if module.is_file():
                rest = parts[i + 1:]
                source = module.read_text(encoding="utf-8")
                return not rest or re.search(rf"\b{re.escape(rest[0])}\b", source) is not None
            # a name the package's __init__ holds
            init = folder / "__init__.py"
            return i >= 1 and re.search(rf"\b{re.escape(part)}\b",
                                        init.read_text(encoding="utf-8")) is not None
        return True  # a package

    def exists(self, path: Path) -> bool:
        return path.exists() or any(path.is_relative_to(i) for i in self.ignored)

    def first(self, candidates: list[Path]) -> Path | None:
        return next((c for c in candidates if self.exists(c)), None)

    def document(self, name: str, here: Path) -> Path | None:
        """The markdown file a citation ``name`` means, seen from the folder ``here``."""
        return self.first([here / name, self.root / name, self.root / "docs" / name])

    def problems(self, piece: Text) -> Iterator[tuple[int, str]]:
        """(line, what is wrong) for each dangling reference or unwanted wording."""
        text = _URL.sub(lambda m: " " * len(m.group()), piece.text)
        here = piece.path.parent
        for match in _ISSUE.finditer(text):
            yield self._line(text, match.start()), f"issue number: {match.group()!r}"
        for name in PRIVATE:
            for match in re.finditer(re.escape(name), text):
                yield self._line(text, match.start()), f"{name}: not in the repository"
        spans: list[tuple[int, int]] = []
        if piece.path.suffix == ".md":
            for match in _LINK.finditer(text):
                spans.append(match.span(1))
                target = match.group(1)
                if re.match(r"[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = here / file_part if file_part else piece.path
                line = self._line(text, match.start())
                if not self.exists(dest):
                    yield line, f"link to {target}: no such file"
                elif anchor and dest.suffix == ".md" and dest.is_file() and \
                        anchor not in anchors(dest.read_text(encoding="utf-8")):
                    yield line, f"link to {target}: no such heading in {dest.name}"
        for regex, kind in ((_ROOTED, "rooted"), (_RELATIVE, "relative"), (_BARE, "bare")):
            for match in regex.finditer(text):
                start, end = match.span(1)
                if any(a <= start < b for a, b in spans) or text[end:end + 1] in _PATTERN_NEXT:
                    continue
                spans.append((start, end))
                ref = match.group(1).rstrip(".,:;")
                if not ref or ref.endswith("/.") or "//" in ref:
                    continue
                if not self._found(ref, kind, here):
                    yield self._line(text, start), f"{ref}: no such file or folder"
        yield from self._sections(text, here)
        for match in _DOTTED.finditer(text):
            if not self.importable(match.group(1)):
                yield self._line(text, match.start()), f"{match.group(1)}: no such module or name"

    def _found(self, ref: str, kind: str, here: Path) -> bool:
        if kind == "rooted":
            return self.exists(self.root / ref)
        if kind == "relative":
            return self.first([here / ref, self.root / ref, self.root / "streamlearn" / ref]) \
                is not None
        if ref.endswith(".py"):
            return ref in self.modules
        return self.document(ref, here) is not None or ref in PRIVATE  # reported above

    def _sections(self, text: str, here: Path) -> Iterator[tuple[int, str]]:
        for regex, numbered in ((_SECTION, True), (_QUOTED, False)):
            for match in regex.finditer(text):
                name, section = match.group(1), match.group(2)
                doc = self.document(name, here)
                if doc is None or not doc.is_file():
                    continue  # a missing file is reported as one
                markdown = doc.read_text(encoding="utf-8")
                if numbered:
                    ok = any(re.match(rf"{re.escape(section)}\b", h, re.IGNORECASE)
                             for h in headings(markdown))
                else:
                    ok = any(re.sub(r"^[\d.]+ ", "", _plain(title)).startswith(
                        _plain(section).rstrip(".")) for title in titles(markdown))
                if not ok:
                    yield (self._line(text, match.start()),
                           f"{name} has no section {section!r}")

    @staticmethod
    def _line(text: str, offset: int) -> int:
        return text.count("\n", 0, offset)


def dangling(root: Path) -> list[str]:
    """``path:line: what`` for every reference of the repository at ``root`` that does not
    resolve, and every mention of a private file or an issue number."""
    resolver = Resolver(root)
    found = set()
    for piece in texts(root):
        for offset, what in resolver.problems(piece):
            found.add((str(piece.path.relative_to(root)), piece.line + offset, what))
    return [f"{path}:{line}: {what}" for path, line, what in sorted(found)]


def test_every_reference_resolves() -> None:
    problems = dangling(REPO)
    assert problems == [], f"{len(problems)} dangling reference(s):\n" + "\n".join(problems)


def test_a_planted_dangling_reference_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "streamlearn" / "service").mkdir(parents=True)
    (tmp_path / "deploy" / "kafka").mkdir(parents=True)
    for package in ("streamlearn", "streamlearn/service"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / ".gitignore").write_text("/deploy/kafka/lib/\n*.pyc\n")
    (tmp_path / "streamlearn" / "service" / "daemon.py").write_text(
        '"""The loop (docs/guide.md §2; the layers in docs/gone.md)."""\n'
        "# see streamlearn/service/daemon.py and streamlearn/stream/join.py\n"
        "x = 'docs/guide.md'  # https://example.org/docs/nothing.md, /tmp/docs/x.md\n"
        "log = 'streamlearn.daemon'  # a logger: streamlearn.service.daemon.log, not streamlearn.stream\n")
    (tmp_path / "deploy" / "run.sh").write_text("# needs deploy/kafka/kafka.sh\n")
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## 2. The loop\n\n"
        "[the loop](../streamlearn/service/daemon.py), [below](#the-loop), "
        "[self](guide.md#2-the-loop), `streamlearn/service/` and `deploy/kafka/lib/x.jar`.\n"
        "[missing](other.md) and [bad anchor](#3-nothing); tests of `tests/unit/test_*.py`.\n"
        "Old names: `service/candidate_daemon.py`, candidate_daemon.py, guide.md §3,\n"
        'guide.md, "The loop" and guide.md, "A missing part"; since issue 9.\n')
    assert dangling(tmp_path) == [
        "deploy/run.sh:1: deploy/kafka/kafka.sh: no such file or folder",
        "docs/guide.md:5: link to #the-loop: no such heading in guide.md",
        "docs/guide.md:6: link to #3-nothing: no such heading in guide.md",
        "docs/guide.md:6: link to other.md: no such file",
        "docs/guide.md:7: candidate_daemon.py: no such file or folder",
        "docs/guide.md:7: guide.md has no section '3'",
        "docs/guide.md:7: service/candidate_daemon.py: no such file or folder",
        "docs/guide.md:8: guide.md has no section 'A missing part'",
        "docs/guide.md:8: issue number: 'issue 9'",
        "streamlearn/service/daemon.py:1: docs/gone.md: no such file or folder",
        "streamlearn/service/daemon.py:2: streamlearn/stream/join.py: no such file or folder",
        "streamlearn/service/daemon.py:4: streamlearn.stream: no such module or name",
    ]


def test_private_files_and_issue_numbers_are_reported(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "README.md").write_text(f"The maths: {PRIVATE[1]} §2.\n")
    (tmp_path / "tests" / "test_x.py").write_text(
        f'"""Acceptance (Issue 12, first part); see {PRIVATE[0]}."""\n'
        "ISSUE = 'issue 7'  # a literal of a test is not scanned\n")
    assert dangling(tmp_path) == [
        f"README.md:1: {PRIVATE[1]}: not in the repository",
        f"tests/test_x.py:1: {PRIVATE[0]}: not in the repository",
        "tests/test_x.py:1: issue number: 'Issue 12'",
    ]


def test_slugs_follow_github() -> None:
    assert slug("## Decision latency while the rankers retrain (2026-11-30)".lstrip("# ")) == \
        "decision-latency-while-the-rankers-retrain-2026-11-30"
    assert slug("`streamlearn bench`: learners vs VW") == "streamlearn-bench-learners-vs-vw"
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}
