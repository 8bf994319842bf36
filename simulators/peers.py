"""Peer systems for ``streamlearn bench``: a per-event Python Banditron and Vowpal Wabbit ``--cbify``.

* :func:`python_loop_banditron` — the Banditron written the plain way, one event
  at a time (``W @ x`` per event). It draws its randomness exactly as
  streamlearn does (:func:`streamlearn.learners.randomness.uniforms` keyed by the
  stream position, then :func:`~streamlearn.learners.randomness.sample`) and
  applies the same update arithmetic, so on a dense stream it makes the same
  decisions and ends with the same weights as ``Banditron`` at batch size 1. The
  difference in speed is the cost of not vectorising.
* :func:`run_vw` — Vowpal Wabbit's ``--cbify K`` reduction with one explorer
  (:data:`VW_EXPLORERS`), fed pre-formatted text lines. Only the learn calls are
  timed: lines are formatted once (:func:`vw_lines`) and parsed into examples in
  chunks outside the timer; each example's played action is read back right
  after its learn call (cbify predicts, samples and learns in that call —
  progressive validation) and examples are finished (which updates VW's own
  loss counters) outside the timer.

>>> import numpy as np
>>> X = np.array([[1.0, 0.0], [0.0, 1.0]] * 50); y = np.array([0, 1] * 50)
>>> run = python_loop_banditron(X, y, n_actions=2, gamma=0.1, seed=0)
>>> run.actions.shape, run.weights is not None
((100,), True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from streamlearn.errors import ConfigError
from streamlearn.features import Batch, SparseBatch
from streamlearn.learners.randomness import sample, uniforms

__all__ = [
    "VW_EXPLORERS",
    "PeerRun",
    "import_vw",
    "python_loop_banditron",
    "run_vw",
    "vw_lines",
]

#: bench system name → the VW arguments added to ``--cbify K`` (explorers at their defaults).
#: Each explorer also runs with the cost encoding ``--loss0 -1 --loss1 0`` (the ``-neg``
#: systems: a correct action costs −1, a wrong one 0), which is often the stronger one.
_VW_BASE: dict[str, str] = {
    "vw-epsilon": "--epsilon 0.05",
    "vw-bag": "--bag 5",
    "vw-cover": "--cover 3",
    "vw-squarecb": "--cb_explore_adf --squarecb",
}
VW_NEG_COSTS = "--loss0 -1 --loss1 0"
VW_EXPLORERS: dict[str, str] = {
    **_VW_BASE,
    **{f"{name}-neg": f"{args} {VW_NEG_COSTS}" for name, args in _VW_BASE.items()},
}

Progress = Callable[[int, int, float], None]  # (events done, total, error so far)
_REPORT_EVERY_S = 2.0


@dataclass
class PeerRun:
    """What a peer did: played actions (0-based, stream order) and the timed seconds."""

    actions: np.ndarray
    seconds: float
    weights: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def python_loop_banditron(
    X: Batch, y: np.ndarray, n_actions: int, gamma: float, seed: int,
    progress: Progress | None = None,
) -> PeerRun:
    """The Banditron, one event at a time (docs/algorithms.md §2); event ``t`` is keyed by ``t``.

    Timed: everything from the keyed uniforms to the last update.
    """
    n, d = X.shape
    K = n_actions
    W = np.zeros((K, d))
    played = np.zeros(n, dtype=np.int64)
    sparse = isinstance(X, SparseBatch)
    dense = None if sparse else np.asarray(X)
    start = last = time.perf_counter()
    cpu_start = time.process_time()
    u = uniforms(seed, np.arange(n))  # keyed randomness: a pure function of (seed, t)
    for t in range(n):
        if sparse:
            lo, hi = X.indptr[t], X.indptr[t + 1]  # type: ignore[union-attr]
            idx, x = X.indices[lo:hi], X.values[lo:hi]  # type: ignore[union-attr]
            s = W[:, idx] @ x
        else:
            x = dense[t]  # type: ignore[index]
            s = W @ x
        y_hat = int(np.argmax(s))
        p = np.full(K, gamma / K)
        p[y_hat] += 1.0 - gamma
        a = int(sample(p[None, :], u[t:t + 1])[0])
        played[t] = a
        coef = (1.0 if a == y[t] else 0.0) / p[a]  # r / P(ỹ)
        if sparse:  # same coefficients, scattered (duplicate indices add up)
            if a == y_hat:
                np.add.at(W[a], idx, (coef - 1.0) * x)
            else:
                np.add.at(W[y_hat], idx, -1.0 * x)
                np.add.at(W[a], idx, coef * x)
        elif a == y_hat:
            W[a] += (coef - 1.0) * x
        else:
            W[y_hat] += -1.0 * x
            W[a] += coef * x
        if progress is not None and t % 4096 == 4095 and time.perf_counter() - last >= _REPORT_EVERY_S:
            last = time.perf_counter()
            progress(t + 1, n, float(np.mean(played[:t + 1] != y[:t + 1])))
    seconds = time.perf_counter() - start
    return PeerRun(played, seconds, weights=W, extra={"cpu_seconds": time.process_time() - cpu_start})


def import_vw() -> ModuleType | None:
    """``vowpalwabbit.pyvw`` when the optional ``bench`` extra is installed, else None."""
    try:
        from vowpalwabbit import pyvw
    except ImportError:
        return None
    module: ModuleType = pyvw  # the package has no type information
    return module


def vw_lines(X: Batch, y: np.ndarray) -> list[str]:
    """One cbify text line per row: ``"{label + 1} | fj:v ..."`` with the nonzero features only.

    Feature names are ``f<column>``, hashed by VW. Bare integer names would be used as
    raw weight indices, and cbify's ADF path (which VW 9 uses for every explorer)
    overwrites the low bits of each index with the action's offset, so small integer
    names would all share one weight per action. Values keep 7 significant digits
    (VW stores float32). VW adds its own constant feature.
    """
    if isinstance(X, SparseBatch):
        rows = [(X.indices[X.indptr[i]:X.indptr[i + 1]], X.values[X.indptr[i]:X.indptr[i + 1]])
                for i in range(X.shape[0])]
    else:
        dense = np.asarray(X, dtype=np.float64)
        rows = [(np.flatnonzero(r), r[r != 0]) for r in dense]
    return [f"{int(label) + 1} | " + " ".join(f"f{j}:{v:.7g}" for j, v in zip(idx.tolist(), val.tolist(),
                                                                               strict=True))
            for (idx, val), label in zip(rows, y, strict=True)]


def run_vw(
    pyvw: ModuleType, explorer: str, n_actions: int, lines: Sequence[str], order: np.ndarray,
    seed: int, progress: Progress | None = None, chunk: int = 4096,
) -> PeerRun:
    """Run ``--cbify n_actions <explorer>`` over ``lines[order]``; time only the learn calls.

    ``extra`` holds ``vw_reported_error`` (VW's own average cbify loss: sum loss /
    weighted examples — the 0/1 multiclass loss of the played action whatever
    ``--loss0``/``--loss1`` say; it must equal the played-action error we count),
    ``parse_seconds`` (untimed text parsing) and the VW arguments.
    """
    if explorer not in VW_EXPLORERS:
        raise ConfigError(f"Expected a VW explorer in {sorted(VW_EXPLORERS)}. Got {explorer!r} instead.")
    args = f"--cbify {n_actions} {VW_EXPLORERS[explorer]} --random_seed {seed} --quiet"
    vw = pyvw.Workspace(args)
    n = len(order)
    played = np.zeros(n, dtype=np.int64)
    labels = np.zeros(n, dtype=np.int64)
    timed = parse_s = cpu = 0.0
    last = time.perf_counter()
    try:
        for lo in range(0, n, chunk):
            t0 = time.perf_counter()
            examples = [vw.parse(lines[i]) for i in order[lo:lo + chunk]]
            t1, c1 = time.perf_counter(), time.process_time()
            for j, ex in enumerate(examples):
                vw.learn(ex)
                played[lo + j] = ex.get_multiclass_prediction()
            t2 = time.perf_counter()
            cpu += time.process_time() - c1
            for j, ex in enumerate(examples):
                labels[lo + j] = ex.get_multiclass_label()
                vw.finish_example(ex)
            parse_s += t1 - t0
            timed += t2 - t1
            if progress is not None and time.perf_counter() - last >= _REPORT_EVERY_S:
                last = time.perf_counter()
                done = min(n, lo + chunk)
                progress(done, n, float(np.mean(played[:done] != labels[:done])))
        weighted = vw.get_weighted_examples()
        reported = vw.get_sum_loss() / weighted if weighted else float("nan")
    finally:
        vw.finish()
    return PeerRun(played - 1, timed, extra={
        "vw_args": args, "vw_reported_error": reported, "parse_seconds": parse_s, "cpu_seconds": cpu,
        "labels": labels - 1,
    })
