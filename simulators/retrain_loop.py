"""Does retraining help or harm the live policy? ``streamlearn serve`` with and without it.

For each stream and seed, three real ``python -m streamlearn serve`` runs on the embedded
simulator (same seed, same rate, one after the other):

* ``learner``: the learner alone (its decisions logged with ``--experience-dir``, nothing
  retrained);
* ``retrain``: ``--retrain-every-events N`` (rankers retrained and judged; the learner
  decides);
* ``ranker``: ``--retrain-every-events N --retrain-policy ranker`` (a promoted ranker is
  rolled out and may serve).

Each run's experience log holds every learned decision with its reward and the policy
that served it, in decision order; from it the table gives the cumulative error
(1 − reward), the error of the first ``--early`` events, and, for ``ranker``, the error
of every 2,000-event window after the first promotion against the learner alone's same
window. The ranker history (``rankers/state.json``) gives the promotions, rollbacks and
self-consistency checks (the promotion-time interval against what the ranker then
earned).

Usage::

    python -m simulators.retrain_loop --stream letter --seeds 1,2,3
    python -m simulators.retrain_loop --stream letter-drift --stream synnonsep --json out.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.durability.experience import read_experience
from streamlearn.retrain.store import read_ranker_state

STREAMS: dict[str, list[str]] = {
    "letter": ["--embedded-dataset", "letter"],
    "letter-drift": ["--embedded-dataset", "letter", "--embedded-drift-at", "30000"],
    "synnonsep": ["--embedded-dataset", "synnonsep"],
}
MODES: dict[str, list[str]] = {"learner": [], "retrain": ["retrain"], "ranker": ["retrain", "ranker"]}
WINDOW = 2000
REPO = Path(__file__).resolve().parents[1]


def _serve(directory: Path, stream: str, seed: int, mode: str, args: argparse.Namespace) -> float:
    cmd = [sys.executable, "-m", "streamlearn", "serve", *STREAMS[stream],
           "--embedded-seed", str(seed), "--embedded-rate", str(args.rate),
           "--max-events", str(args.events), "--checkpoint-dir", str(directory),
           "--metrics-port", "-1", "--progress-seconds", "0"]
    if mode == "learner":
        cmd += ["--experience-dir", str(directory / "experience")]
    else:
        cmd += ["--retrain-every-events", str(args.every)]
    if mode == "ranker":
        cmd += ["--retrain-policy", "ranker"]
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"serve failed ({done.returncode}): {done.stderr[-2000:]}")
    (directory / "serve.log").write_text(done.stderr)
    return time.monotonic() - started


def _errors(directory: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(1 − reward, decision time, serving version) of every learned decision, in decision order."""
    rows = read_experience(directory / "experience")
    order = np.lexsort((np.arange(len(rows)), rows.decided_at))
    return (1.0 - rows.rewards[order], rows.decided_at[order], rows.served_by[order])


def _windows(errors: np.ndarray) -> np.ndarray:
    n = len(errors) // WINDOW
    return np.asarray(errors[: n * WINDOW].reshape(n, WINDOW).mean(axis=1))


def _history(directory: Path) -> list[dict[str, Any]]:
    path = directory / "rankers"
    return list(read_ranker_state(path).get("history", [])) if path.is_dir() else []


def run_stream(stream: str, seeds: list[int], args: argparse.Namespace, root: Path
               ) -> dict[str, Any]:
    out: dict[str, Any] = {"stream": stream, "seeds": seeds, "runs": []}
    for seed in seeds:
        per_mode: dict[str, Any] = {}
        for mode in MODES:
            directory = root / f"{stream}-{seed}-{mode}"
            seconds = _serve(directory, stream, seed, mode, args)
            errors, decided_at, served = _errors(directory)
            history = _history(directory)
            promotions = [h for h in history if h.get("promoted")]
            first_promotion = min((h["at"] for h in promotions), default=None)
            per_mode[mode] = {
                "seconds": seconds, "events": len(errors), "cum_error": float(errors.mean()),
                "early_error": float(errors[: args.early].mean()),
                "windows": _windows(errors).tolist(),
                "first_promotion_event": None if first_promotion is None else
                int(np.searchsorted(decided_at, first_promotion)),
                "ranker_share": float((served != 0).mean()),
                "retrains": sum(1 for h in history if "version" in h and "rollout" not in h),
                "promotions": len(promotions),
                "rollbacks": [h.get("reason") for h in history if h.get("rollout") == "rolled_back"],
                "consistency": [{"ranker": h["ranker"], "version": h["ranker_version"],
                                 "result": h["reason"], "realised": h["realised"],
                                 "interval": h["interval"], "events": h["events"]}
                                for h in history if h.get("rollout") == "consistency"],
                "overruns": (directory / "serve.log").read_text().count("still running")}
            print(f"{stream} seed {seed} {mode:<8} cum-error {errors.mean():.4f}  first "
                  f"{args.early} {errors[: args.early].mean():.4f}  promotions "
                  f"{len(promotions)}  ranker share {per_mode[mode]['ranker_share']:.3f}  "
                  f"({seconds:.0f} s)", file=sys.stderr, flush=True)
        base = np.asarray(per_mode["learner"]["windows"])
        ranker = per_mode["ranker"]
        start = ranker["first_promotion_event"]
        worse = (np.asarray(ranker["windows"])[: len(base)] - base[: len(ranker["windows"])])
        ranker["worst_window_gap"] = (None if start is None else
                                      float(worse[start // WINDOW:].max(initial=-np.inf)))
        out["runs"].append({"seed": seed, **per_mode})
    summary: dict[str, Any] = {}
    for mode in MODES:
        summary[mode] = {"cum_error": float(np.mean([r[mode]["cum_error"] for r in out["runs"]])),
                         "early_error": float(np.mean([r[mode]["early_error"] for r in out["runs"]]))}
    gaps = [r["ranker"]["worst_window_gap"] for r in out["runs"]
            if r["ranker"]["worst_window_gap"] is not None]
    checks = [c for r in out["runs"] for m in ("retrain", "ranker") for c in r[m]["consistency"]]
    summary["ranker"]["worst_window_gap"] = max(gaps) if gaps else None
    summary["consistency"] = {"checked": len(checks),
                              "inside": sum(c["result"] == "inside" for c in checks)}
    out["summary"] = summary
    return out


def print_table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"{'stream':<13} {'mode':<8} {'cum-error':>10} {f'first {args.early}':>11} "
          f"{'promotions':>10} {'rollbacks':>9} {'ranker share':>12}")
    for res in results:
        for mode in MODES:
            runs = [r[mode] for r in res["runs"]]
            s = res["summary"][mode]
            print(f"{res['stream']:<13} {mode:<8} {s['cum_error']:>10.4f} {s['early_error']:>11.4f} "
                  f"{sum(r['promotions'] for r in runs):>10} "
                  f"{sum(len(r['rollbacks']) for r in runs):>9} "
                  f"{np.mean([r['ranker_share'] for r in runs]):>12.3f}")
        summary = res["summary"]
        gap = summary["ranker"]["worst_window_gap"]
        c = summary["consistency"]
        cum = summary["ranker"]["cum_error"] - summary["learner"]["cum_error"]
        early = summary["retrain"]["early_error"] - summary["learner"]["early_error"]
        print(f"{'':<13} ranker - learner: mean cum-error {cum:+.4f}, worst {WINDOW}-event window "
              f"after a promotion {'(none promoted)' if gap is None else f'{gap:+.4f}'}; "
              f"retrain - learner, first {args.early}: {early:+.4f}; self-consistency "
              f"{c['inside']}/{c['checked']} inside")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stream", action="append", choices=sorted(STREAMS), default=None)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--rate", type=float, default=3000.0)
    parser.add_argument("--every", type=int, default=4000, help="--retrain-every-events")
    parser.add_argument("--early", type=int, default=6000)
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the runs' directories here")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="retrain-loop-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        results = [run_stream(stream, seeds, args, root) for stream in args.stream or ["letter"]]
    print_table(results, args)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
