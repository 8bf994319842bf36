"""``streamlearn evaluate LOG_DIR``: off-policy estimates of policies on an experience log.

Policies (``--policy``, repeatable): ``learner`` (the logged greedy action),
``uniform`` (over the actions the logger allowed), ``constant:A``,
``best_constant`` (the best constant action by SNIPS on the training part), and
``ranker:NAME`` (the newest artifact ``NAME-v<version>`` in ``--artifacts``,
default ``LOG_DIR/../rankers``) or ``ranker:PATH`` (an artifact directory).

``--retrain V`` evaluates on exactly the held-out slice the daemon's retrain ``V``
used (its segments, rows, held-out fraction and clip, from ``rankers/state.json``
beside the log), so its estimates are the ones the loop exported.

Rows: by default every row of the chosen segments; with ``--holdout-only`` the
held-out slice of the retrainer (:func:`~streamlearn.evaluation.policies.holdout_mask`
with ``--holdout-fraction``), so the same segments, clip and level reproduce
exactly the estimates :func:`streamlearn.retrain.job.run_retrain` reported. DR's
reward model is never fitted on the rows it evaluates: it is fitted on the
training part for the held-out slice, and for all rows by two-fold cross-fitting
(training part → held-out slice, held-out slice → training part).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.commands.stream_options import int_at_least, number_in
from streamlearn.errors import ConfigError, DataError
from streamlearn.evaluation.policies import (
    ESTIMATORS,
    best_constant,
    constant_policy,
    evaluate_policies,
    fit_reward_model,
    holdout_mask,
    learner_policy,
    ranker_policy,
    uniform_policy,
)
from streamlearn.retrain.artifact import find_artifact, load_artifact
from streamlearn.retrain.job import DEFAULT_CLIP, estimate_dict
from streamlearn.stream.experience import ExperienceRows, read_experience

__all__ = ["add_parser", "parse_segments", "run"]

POLICY_FORMS = "learner, uniform, best_constant, constant:A, ranker:NAME or ranker:PATH"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="off-policy estimates (IPS, SNIPS, DR) of policies on an experience log",
        description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("log_dir", metavar="LOG_DIR", help="the experience log directory")
    parser.add_argument("--policy", action="append", default=None, metavar="POLICY",
                        help=f"{POLICY_FORMS} (repeatable; default: learner and uniform)")
    parser.add_argument("--estimator", default="ips,snips,dr",
                        help="comma-separated estimators among ips, snips, dr")
    parser.add_argument("--segments", default=None, metavar="A:B",
                        help="segments A..B inclusive (A: or :B leave one end open)")
    parser.add_argument("--max-rows", type=int_at_least(1), default=None,
                        help="the newest rows only")
    parser.add_argument("--holdout-only", action="store_true",
                        help="evaluate the retrainer's held-out slice only")
    parser.add_argument("--holdout-fraction", type=number_in(0.0, 1.0, low_open=True, high_open=True),
                        default=0.2,
                        help="size of the held-out slice (as retrain.holdout_fraction)")
    parser.add_argument("--clip", type=number_in(1.0, 1e12), default=DEFAULT_CLIP,
                        help="IPS weight clip")
    parser.add_argument("--level", type=number_in(0.0, 1.0, low_open=True, high_open=True),
                        default=0.95, help="confidence level")
    parser.add_argument("--artifacts", default=None, metavar="DIR",
                        help="where ranker:NAME is looked up (default: LOG_DIR/../rankers)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--retrain", type=int, default=None, metavar="V",
                        help="the window and held-out slice of the daemon's retrain V "
                             "(from <artifacts>/state.json)")
    parser.set_defaults(run=run)


def parse_segments(text: str | None) -> tuple[int | None, int | None]:
    """``"A:B"`` → (A, B) with A <= B; either end may be empty (open)."""
    if text is None:
        return None, None
    first, sep, last = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        low, high = (int(first) if first else None), (int(last) if last else None)
    except ValueError:
        raise ConfigError(f"Expected --segments A:B (integers, either may be empty). "
                          f"Got {text!r}.") from None
    if low is not None and high is not None and low > high:
        raise ConfigError(f"Expected --segments A:B with A <= B (segments A to B inclusive). "
                          f"Got {text!r}, a reversed range: did you mean {high}:{low}?")
    return low, high


def _estimators(text: str) -> list[str]:
    names = [e.strip().lower() for e in text.split(",") if e.strip()]
    bad = [e for e in names if e not in ESTIMATORS]
    if bad or not names:
        raise ConfigError(f"Expected --estimator among {', '.join(ESTIMATORS)}. Got {text!r}.")
    return names


def _ranker(target: str, artifacts: Path) -> Any:
    path = Path(target)
    if path.is_dir():
        return load_artifact(path).ranker
    if "/" in target or "\\" in target:
        raise ConfigError(f"Expected ranker:NAME or ranker:PATH of an artifact. {target!r} "
                          "is not a directory.")
    return load_artifact(find_artifact(artifacts, target)).ranker


def _policy(spec: str, rows: ExperienceRows, train: ExperienceRows, clip: float,
            artifacts: Path) -> np.ndarray:
    kind, _, arg = spec.partition(":")
    n, K = rows.probs.shape
    if spec == "learner":
        return learner_policy(rows.probs)
    if spec == "uniform":
        return uniform_policy(rows.probs)
    if spec == "best_constant":
        return constant_policy(n, K, best_constant(train, clip))
    if kind == "constant" and arg:
        try:
            action = int(arg)
        except ValueError:
            raise ConfigError(f"Expected constant:A with an integer action. Got {spec!r}.") from None
        return constant_policy(n, K, action)
    if kind == "ranker" and arg:
        return ranker_policy(_ranker(arg, artifacts), rows.X, rows.probs)
    raise ConfigError(f"Expected --policy {POLICY_FORMS}. Got {spec!r}.")


def _reward_model(rows: ExperienceRows, held: np.ndarray, holdout_only: bool) -> np.ndarray:
    """r̂ of the evaluated rows, from a model that never saw them."""
    K = rows.probs.shape[1]
    train, test = rows.take(~held), rows.take(held)
    if len(train) == 0:
        raise DataError("Expected training rows to fit DR's reward model. Got none.")
    on_held = fit_reward_model(train.X, train.actions, train.rewards, K).predict(test.X)
    if holdout_only:
        return on_held
    if len(test) == 0:
        raise DataError("Expected held-out rows to cross-fit DR's reward model. Got none.")
    out = np.empty((len(rows), K))
    out[held] = on_held
    out[~held] = fit_reward_model(test.X, test.actions, test.rewards, K).predict(train.X)
    return out


def _use_retrain_window(args: argparse.Namespace) -> None:
    """Set segments, rows, held-out slice and clip to those of the daemon's retrain ``V``."""
    if args.segments is not None or args.max_rows is not None:
        raise ConfigError("Expected either --retrain or --segments / --max-rows. Got both.")
    artifacts = Path(args.artifacts) if args.artifacts else Path(args.log_dir).parent / "rankers"
    state_file = artifacts / "state.json"
    try:
        history = orjson.loads(state_file.read_bytes()).get("history", [])
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"Expected the retrain history {state_file}. Got: {exc}.") from exc
    entry = next((e for e in history if e.get("version") == args.retrain and e.get("segments")),
                 None)
    if entry is None:
        known = [e["version"] for e in history if e.get("segments")]
        raise ConfigError(f"Expected --retrain to name a retrain in {state_file}: one of "
                          f"{known}. Got {args.retrain}.")
    first, last = entry["segments"]
    args.segments, args.max_rows, args.holdout_only = f"{first}:{last}", entry["rows"], True
    args.holdout_fraction = entry.get("holdout_fraction") or args.holdout_fraction
    args.clip = entry.get("clip") or args.clip


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON report of ``streamlearn evaluate`` (policy → estimator → estimate)."""
    if getattr(args, "retrain", None) is not None:
        _use_retrain_window(args)
    estimators = _estimators(args.estimator)
    first, last = parse_segments(args.segments)
    log_dir = Path(args.log_dir)
    rows = read_experience(log_dir, first, last, args.max_rows)
    if len(rows) == 0:
        raise DataError(f"Expected logged rows in {log_dir}. Got none.")
    held = holdout_mask(rows.ids, args.holdout_fraction)
    train = rows.take(~held)
    evaluated = rows.take(held) if args.holdout_only else rows
    if len(evaluated) == 0:
        raise DataError("Expected held-out rows to evaluate. Got none.")
    artifacts = Path(args.artifacts) if args.artifacts else log_dir.parent / "rankers"
    names = args.policy or ["learner", "uniform"]
    policies = {name: _policy(name, evaluated, train, args.clip, artifacts) for name in names}
    model = _reward_model(rows, held, args.holdout_only) if "dr" in estimators else None
    estimates = evaluate_policies(evaluated, policies, estimators, args.clip, args.level, model)
    return {"log_dir": str(log_dir), "segments": list(rows.segments) if rows.segments else None,
            "rows": len(evaluated), "holdout_only": bool(args.holdout_only), "clip": args.clip,
            "level": args.level,
            "estimates": {p: {e: estimate_dict(v) for e, v in ests.items()}
                          for p, ests in estimates.items()}}


def _fmt(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _print_table(report: dict[str, Any]) -> None:
    print(f"log {report['log_dir']}  segments {report['segments']}  rows {report['rows']:,}"
          f"{' (held-out slice)' if report['holdout_only'] else ''}  clip {report['clip']}  "
          f"level {report['level']}")
    width = max(len("policy"), *(len(p) for p in report["estimates"]))
    print(f"{'policy':<{width}}  estimator  {'value':>8}  {'low':>8}  {'high':>8}  "
          f"{'stderr':>8}  clipped")
    for policy, ests in report["estimates"].items():
        for name, e in ests.items():
            print(f"{policy:<{width}}  {name:<9}  {_fmt(e['value']):>8}  {_fmt(e['low']):>8}  "
                  f"{_fmt(e['high']):>8}  {_fmt(e['stderr']):>8}  {e['clipped']}")


def run(args: argparse.Namespace) -> int:
    report = evaluate(args)
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        _print_table(report)
    return 0

