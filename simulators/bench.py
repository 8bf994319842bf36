"""The ``streamlearn bench`` harness: several learners and peers on one stream, compared.

Every system sees the same stream — the one ``streamlearn replay`` would run,
built by :func:`streamlearn.datasets.stream.prepare_stream` from the same options
(``passes`` passes, each reshuffled with ``seed`` unless ``--no-shuffle``, or
cut/extended to ``rounds``) — and every system is scored the same way: the
error rate is the fraction of rounds whose *played* action was wrong
(progressive validation: each event is decided before its label is used).

Preprocessing (done once, before any timer), the same as ``streamlearn replay``
(:func:`streamlearn.datasets.stream.standardise` / :func:`~streamlearn.datasets.stream.add_bias`):
dense data sets flagged ``standardise`` are centred and scaled by the mean and
standard deviation of the data set's rows; streamlearn learners and the
per-event loop get an extra constant 1 feature (the bias; VW adds its own
constant feature).

What each system's seconds cover:

* ``streamlearn-*``: the whole :func:`streamlearn.replay.replay` loop — slicing each
  micro-batch, ``decide``, reward, error tracking, ``update``.
* ``python-loop-banditron``: the per-event loop of :func:`simulators.peers.python_loop_banditron`.
* ``vw-*``: only the ``learn`` calls (plus reading back the played action); text
  formatting, parsing and ``finish_example`` are outside the timer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from simulators.peers import VW_EXPLORERS, import_vw, python_loop_banditron, run_vw, vw_lines
from streamlearn.datasets.stream import (
    ROUND_BYTES,
    PreparedStream,
    add_bias,
    check_fits_in_memory,
    standardise,
)
from streamlearn.errors import ConfigError, DataError
from streamlearn.features import SparseBatch
from streamlearn.learners import make_learner
from streamlearn.learners.exploration import LEARNER_DEFAULT, Exploration
from streamlearn.replay import replay

__all__ = [
    "DEFAULT_SYSTEMS",
    "SYSTEMS",
    "BenchReport",
    "BenchResult",
    "add_bias",
    "parse_systems",
    "run_bench",
    "standardise",
]

#: system name → (kind, learner or explorer, batch size or None for the --batch-size value)
SYSTEMS: dict[str, tuple[str, str, int | None]] = {
    "streamlearn-banditron": ("streamlearn", "banditron", None),
    "streamlearn-banditron-b1": ("streamlearn", "banditron", 1),
    "streamlearn-pnorm": ("streamlearn", "pnorm", None),
    "streamlearn-eg": ("streamlearn", "eg", None),
    "streamlearn-epsilon-greedy": ("streamlearn", "epsilon-greedy", None),
    "streamlearn-squarecb": ("streamlearn", "squarecb", None),
    "streamlearn-bag": ("streamlearn", "bag", None),
    "streamlearn-linucb": ("streamlearn", "linucb", None),
    "streamlearn-lints": ("streamlearn", "lints", None),
    "streamlearn-newtron": ("streamlearn", "newtron", None),
    "streamlearn-soba": ("streamlearn", "soba", None),
    "python-loop-banditron": ("python", "banditron", 1),
    **{name: ("vw", name, 1) for name in VW_EXPLORERS},
}
DEFAULT_SYSTEMS: tuple[str, ...] = tuple(SYSTEMS)
#: learners that run with their own default (drift-aware) exploration; the Banditron family
#: (banditron, pnorm, eg) runs with the fixed --gamma
OWN_EXPLORATION = frozenset({"epsilon-greedy", "squarecb", "bag", "linucb", "lints", "newtron", "soba"})
_GROUPS = {
    "all": DEFAULT_SYSTEMS,
    "streamlearn": tuple(s for s in SYSTEMS if SYSTEMS[s][0] == "streamlearn"),
    "vw": tuple(VW_EXPLORERS),
}

Progress = Callable[[str], None]


@dataclass
class BenchResult:
    """One row of the comparison; ``skipped`` says why a system did not run."""

    system: str
    batch_size: int
    events_per_second: float | None
    error_rate: float | None
    seconds: float | None
    skipped: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class BenchReport:
    dataset: str
    rounds: int
    passes: int | None
    n_features: int
    n_classes: int
    standardised: bool
    gamma: float | None  # None: the streamlearn learners used another exploration strategy
    exploration: dict[str, Any]
    seed: int
    results: list[BenchResult]

    def reference(self) -> tuple[BenchResult, str] | None:
        """The row every other is related to, and why: the VW row with the lowest error (the
        peer to beat), else — no VW row ran — the row with the lowest error; None when no row
        ran."""
        ran = [r for r in self.results if r.error_rate is not None and r.events_per_second]
        vw = [r for r in ran if SYSTEMS[r.system][0] == "vw"]
        pool, why = ((vw, "the VW row with the lowest error") if vw else
                     (ran, "the row with the lowest error (no VW row ran)"))
        if not pool:
            return None
        return min(pool, key=lambda r: float(r.error_rate or 0.0)), why

    def speed_vs_reference(self, result: BenchResult) -> float | None:
        """This row's events/s ÷ the reference's (2.0: twice as fast); None if either is
        missing."""
        ref = self.reference()
        if ref is None or not result.events_per_second or not ref[0].events_per_second:
            return None
        return result.events_per_second / ref[0].events_per_second

    def error_vs_reference(self, result: BenchResult) -> float | None:
        """This row's error rate − the reference's (negative: fewer wrong actions)."""
        ref = self.reference()
        if ref is None or result.error_rate is None or ref[0].error_rate is None:
            return None
        return result.error_rate - ref[0].error_rate

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "results"}
        out["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE")
        ref = self.reference()
        out["reference"] = None if ref is None else {"system": ref[0].system, "why": ref[1]}
        out["results"] = [{**asdict(r), "speed_vs_reference": self.speed_vs_reference(r),
                           "error_vs_reference": self.error_vs_reference(r)}
                          for r in self.results]
        return out

    def to_markdown(self) -> str:
        ref = self.reference()
        name = ref[0].system if ref is not None else "-"
        lines = ([f"Relative to {name}, {ref[1]}: speed = events/s ÷ its events/s, error − its "
                  f"error rate.", ""] if ref is not None else [])
        lines += [f"| system | batch | events/s | error rate | speed ÷ {name} | error − {name} |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in self.results:
            if r.skipped:
                continue
            speed, delta = self.speed_vs_reference(r), self.error_vs_reference(r)
            lines.append(f"| {r.system} | {r.batch_size} | {r.events_per_second:,.0f} | "
                         f"{r.error_rate:.4f} | {'n/a' if speed is None else f'{speed:.2f}'} | "
                         f"{'n/a' if delta is None else f'{delta:+.4f}'} |")
        notes = self._skipped_notes() + [
            f"- {r.system}: VW's own average cbify loss {r.details['vw_reported_error']:.4f} "
            f"({'matches' if r.details.get('vw_error_matches') else 'DIFFERS from'} the count "
            f"above); text parsing, untimed, took {r.details['parse_seconds']:.2f} s"
            for r in self.results if "vw_reported_error" in r.details]
        cpu = [f"{r.system} {self.rounds / r.details['cpu_seconds']:,.0f}" for r in self.results
               if r.details.get("cpu_seconds")]
        if cpu:
            notes.append("- events per CPU second (process time, less sensitive to other load on the "
                         "machine): " + ", ".join(cpu))
        return "\n".join(lines + (["", *notes] if notes else []))

    def _skipped_notes(self) -> list[str]:
        """One line per reason a system was skipped, naming the systems."""
        by_reason: dict[str, list[str]] = {}
        for r in self.results:
            if r.skipped:
                by_reason.setdefault(r.skipped, []).append(r.system)
        return [f"- skipped, {reason}: {', '.join(names)}" for reason, names in by_reason.items()]


def parse_systems(text: str) -> list[str]:
    """Comma-separated system names or groups (all, streamlearn, vw), order kept, no repeats."""
    chosen: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        names = _GROUPS.get(name, (name,))
        for n in names:
            if n not in SYSTEMS:
                raise ConfigError(f"--systems expects a comma-separated list of {sorted(SYSTEMS)} or "
                                  f"{sorted(_GROUPS)}. Got {name!r} instead.")
            if n not in chosen:
                chosen.append(n)
    if not chosen:
        raise ConfigError(f"--systems expects at least one system name. Got {text!r} instead.")
    return chosen


def _replay_progress(system: str, say: Progress) -> Callable[[int, int, float], None]:
    def report(done: int, total: int, error: float) -> None:
        say(f"bench: {system}: {done:,}/{total:,} events, error so far {error:.4f}")
    return report


def run_bench(
    stream: PreparedStream,
    *,
    batch_size: int = 64,
    exploration: Exploration | None = None,
    systems: Sequence[str] = DEFAULT_SYSTEMS,
    seed: int = 0,
    progress: Progress | None = None,
) -> BenchReport:
    """Run every system of ``systems`` on ``stream`` and measure it.

    ``stream`` is built by :func:`streamlearn.datasets.stream.prepare_stream`, as
    for ``streamlearn replay``. The Banditron-family learners explore with
    ``exploration`` (``None``: their own default), the others with their own
    default; the per-event loop needs a fixed γ (it is skipped otherwise); VW
    uses its own explorers.
    """
    say: Progress = progress if progress is not None else (lambda _msg: None)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ConfigError(f"--systems expects names in {sorted(SYSTEMS)}. Got {unknown} instead.")
    if stream.rounds == 0:
        raise DataError(f"Dataset {stream.dataset!r} has no rows.")
    dense = not isinstance(stream.features, SparseBatch)  # generated rows are dense too
    check_fits_in_memory(stream.rounds, ROUND_BYTES + (8 * stream.n_features if dense else 0),
                         f"the stream bench holds ({stream.n_features} features a round)")
    X_stream, y_stream = stream.materialise()  # every system needs the whole stream
    if not isinstance(X_stream, SparseBatch):
        X_stream = np.asarray(X_stream, dtype=np.float64)
    K, d = stream.n_classes, stream.n_features
    spec: dict[str, Any] = (exploration.spec() if exploration is not None
                            else {"name": LEARNER_DEFAULT})
    gamma = spec.get("gamma") if spec["name"] == "fixed" else None
    say(f"bench: {stream.dataset}: {stream.rounds:,} rounds, {K} classes, {d - 1} features + bias"
        f"{', standardised' if stream.standardised else ''}, exploration {spec}")

    results: list[BenchResult] = []
    lines: list[str] | None = None
    pyvw = None
    for system in systems:
        kind, algo, fixed_batch = SYSTEMS[system]
        b = fixed_batch if fixed_batch is not None else batch_size
        if kind == "streamlearn":
            own = algo in OWN_EXPLORATION  # the new learners run at their own defaults
            learner = make_learner(algo, K, d, None if own or exploration is None
                                   else exploration.clone(), seed=seed)
            cpu_start = time.process_time()
            res = replay(learner, X_stream, y_stream, batch_size=b,
                         progress=_replay_progress(system, say))
            results.append(BenchResult(system, b, res.events_per_second, res.error_rate, res.seconds,
                                       details={"cpu_seconds": time.process_time() - cpu_start}))
        elif kind == "python":
            if gamma is None:
                results.append(BenchResult(system, b, None, None, None,
                                           skipped="explores with a fixed γ only (use --gamma)"))
                continue
            run = python_loop_banditron(X_stream, y_stream, K, float(gamma), seed,
                                        progress=_replay_progress(system, say))
            results.append(_peer_result(system, b, run.actions, y_stream, run.seconds, run.extra))
        else:
            if pyvw is None:
                pyvw = import_vw()
            if pyvw is None:
                results.append(BenchResult(system, b, None, None, None,
                                           skipped="vowpalwabbit not installed (pip install "
                                                   "'streamlearn[bench]')"))
                continue
            if lines is None:
                t0 = time.perf_counter()
                rows = stream.data_rows()
                lines = vw_lines(rows if isinstance(rows, SparseBatch)
                                 else np.asarray(rows, dtype=np.float64), stream.row_labels)
                say(f"bench: formatted {len(lines):,} VW lines in {time.perf_counter() - t0:.1f} s "
                    "(untimed)")
            run = run_vw(pyvw, algo, K, lines, stream.order, seed,
                         progress=_replay_progress(system, say))
            extra = {k: v for k, v in run.extra.items() if k != "labels"}
            if not np.array_equal(run.extra["labels"], y_stream):
                raise DataError(f"{system}: the labels VW parsed differ from the stream's labels.")
            results.append(_peer_result(system, b, run.actions, y_stream, run.seconds, extra))
            # our count of wrong played actions must equal VW's own cbify average loss
            extra["vw_error_matches"] = bool(abs(results[-1].error_rate - extra["vw_reported_error"])
                                             < 1e-9)
        last = results[-1]
        say(f"bench: {system}: {last.events_per_second:,.0f} events/s "
            f"({stream.rounds / max(last.details['cpu_seconds'], 1e-9):,.0f} per CPU second), "
            f"error {last.error_rate:.4f}")
    return BenchReport(dataset=stream.dataset, rounds=stream.rounds, passes=stream.passes,
                       n_features=d - 1, n_classes=K, standardised=stream.standardised,
                       gamma=gamma, exploration=spec, seed=seed, results=results)


def _peer_result(system: str, b: int, actions: np.ndarray, y: np.ndarray, seconds: float,
                 details: dict[str, Any]) -> BenchResult:
    n = len(y)
    eps = n / seconds if seconds > 0 else float("inf")
    return BenchResult(system, b, eps, float(np.mean(actions != y)), seconds, details=details)
