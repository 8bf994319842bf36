"""``streamlearn evaluate LOG_DIR``: off-policy estimates of policies on an experience log.

Policies (``--policy``, repeatable): ``logged`` (what was live: its on-policy mean
reward), ``learner`` (the logged greedy action), ``uniform`` (over the actions the
logger allowed), ``constant:A``, ``best_constant`` (the best constant action by SNIPS
on the training part), and ``ranker:NAME`` (the newest artifact ``NAME-v<version>`` in
``--artifacts``, default ``LOG_DIR/../rankers``) or ``ranker:PATH`` (an artifact
directory) — a ranker as the loop deploys it: its best allowed action, explored with
the rate the learner used at each logged decision.

Estimators (``--estimator``): ``bound`` (a confidence sequence for the running average of
the policy's conditional values: valid at any effective sample size, with weights of any
size, however often it is read, also when the policy or the world changed along the rows
— the one to read), and the point estimates ``ips`` (unbiased, noisy), ``snips`` (biased towards
the logger's own behaviour on small samples) and ``dr`` (as good as its reward model,
fitted on other rows). Weights are unclipped unless ``--clip`` is given. The table
says which to read and flags an estimate resting on few effective rows.

``--retrain V`` evaluates exactly what the daemon's retrain ``V`` evaluated (its
window, watermark and held-out slice, from ``rankers/state.json`` beside the log) and
judges its challengers again: its estimates, bounds and promotion verdicts are the
ones the loop acted on.

A candidate-mode log (one with a request log) is evaluated per slot, as the loop judges
rankers there: :mod:`streamlearn.commands.evaluate_candidates`.

Rows: by default every row of the chosen segments; with ``--holdout-only`` the
retrainer's held-out slice (the newest ``--holdout-fraction`` of the rows, in time).
DR's reward model is never fitted on the rows it evaluates: it is fitted on the
training part for the held-out slice, and for all rows by two-fold cross-fitting.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.commands.evaluate_candidates import (
    CANDIDATE_ESTIMATORS,
    MIN_ESS,
    evaluate_candidates,
    format_value,
    is_candidate_log,
    print_candidate_table,
)
from streamlearn.commands.stream_options import int_at_least, number_in
from streamlearn.durability.experience import ExperienceRows, require_window
from streamlearn.errors import ConfigError, DataError
from streamlearn.evaluation.policies import (
    ESTIMATORS,
    best_constant,
    constant_policy,
    fit_reward_model,
    learner_policy,
    uniform_policy,
)
from streamlearn.retrain.artifact import recorded_artifact, resolve_artifact
from streamlearn.retrain.job import (
    estimate_policies,
    estimates_on,
    judge_challengers,
    read_window,
    split_in_time,
)
from streamlearn.retrain.promotion import deployed_policy

__all__ = ["add_parser", "parse_segments", "run"]

POLICY_FORMS = "logged, learner, uniform, best_constant, constant:A, ranker:NAME or ranker:PATH"
ALL_ESTIMATORS = (*ESTIMATORS, "bound")
DEFAULT_LEVEL = 0.95
DEFAULT_HOLDOUT_FRACTION = 0.2  # as retrain.holdout_fraction


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="off-policy estimates (IPS, SNIPS, DR) of policies on an experience log",
        description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("log_dir", metavar="LOG_DIR", help="the experience log directory")
    parser.add_argument("--policy", action="append", default=None, metavar="POLICY",
                        help=f"{POLICY_FORMS} (repeatable; default: logged, learner and "
                             "uniform; with --retrain the policies the retrain evaluated; on a "
                             "candidate-mode log logged, uniform and ranker:NAME|PATH only)")
    parser.add_argument("--estimator", default=None,
                        help="comma-separated estimators among bound, ips, snips, dr (default: "
                             "all; on a candidate-mode log bound and ips, per slot)")
    parser.add_argument("--segments", default=None, metavar="A:B",
                        help="segments A..B inclusive (A: or :B leave one end open)")
    parser.add_argument("--max-rows", type=int_at_least(1), default=None,
                        help="the newest rows only")
    parser.add_argument("--holdout-only", action="store_true",
                        help="evaluate the retrainer's held-out slice only")
    parser.add_argument("--holdout-fraction", type=number_in(0.0, 1.0, low_open=True, high_open=True),
                        default=None,
                        help="size of the held-out slice (as retrain.holdout_fraction; default "
                             f"{DEFAULT_HOLDOUT_FRACTION})")
    parser.add_argument("--clip", type=number_in(1.0, 1e12), default=None,
                        help="clip the point estimates' weights at this value (default: "
                             "unclipped; clipping biases them towards the logger)")
    parser.add_argument("--level", type=number_in(0.0, 1.0, low_open=True, high_open=True),
                        default=None, help=f"confidence level (default {DEFAULT_LEVEL}; with "
                                           "--retrain on a candidate-mode log, the retrain's)")
    parser.add_argument("--artifacts", default=None, metavar="DIR",
                        help="where ranker:NAME is looked up (default: LOG_DIR/../rankers)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--retrain", type=int_at_least(1), default=None, metavar="V",
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


def _estimators(text: str, allowed: tuple[str, ...] = ALL_ESTIMATORS,
                where: str = "") -> list[str]:
    names = [e.strip().lower() for e in text.split(",") if e.strip()]
    bad = [e for e in names if e not in allowed]
    if bad or not names:
        raise ConfigError(f"Expected --estimator among {', '.join(allowed)}{where}. "
                          f"Got {text!r}.")
    return list(dict.fromkeys(names))


def _ranker(target: str, artifacts: Path) -> Any:
    artifact = resolve_artifact(target, artifacts)
    if artifact.meta.get("candidates") is not None:
        raise ConfigError(f"Expected a ranker retrained on fixed actions. Got {artifact.path}, "
                          "retrained on candidate sets (evaluate it on a candidate-mode log).")
    return artifact.ranker


def _policy(spec: str, rows: ExperienceRows, train: ExperienceRows, artifacts: Path,
            selection_clip: float, pinned: dict[str, str] | None = None) -> np.ndarray:
    kind, _, arg = spec.partition(":")
    n, K = rows.probs.shape
    if spec == "logged":
        return np.asarray(rows.probs, dtype=np.float64)
    if spec == "learner":
        return learner_policy(rows.probs)
    if spec == "uniform":
        return uniform_policy(rows.probs)
    if spec == "best_constant":
        return constant_policy(n, K, best_constant(train, selection_clip))
    if kind == "constant" and arg:
        try:
            action = int(arg)
        except ValueError:
            raise ConfigError(f"Expected constant:A with an integer action. Got {spec!r}.") from None
        return constant_policy(n, K, action)
    if kind == "ranker" and arg:
        return deployed_policy(_ranker((pinned or {}).get(arg, arg), artifacts), rows)
    raise ConfigError(f"Expected --policy {POLICY_FORMS}. Got {spec!r}.")


DEFAULT_SELECTION_CLIP = 20.0  # best_constant is chosen as the retrainer chooses it (retrain.clip)


def _cross_fitted(rows: ExperienceRows, held: np.ndarray) -> np.ndarray:
    """r̂ of every row from a model that never saw it (two folds: training part ↔ slice)."""
    K = rows.probs.shape[1]
    train, test = rows.take(~held), rows.take(held)
    if len(train) == 0 or len(test) == 0:
        raise DataError("Expected a training part and a held-out slice to cross-fit DR's reward "
                        f"model. Got {len(train)} and {len(test)} rows.")
    out = np.empty((len(rows), K))
    out[held] = fit_reward_model(train.X, train.actions, train.rewards, K).predict(test.X)
    out[~held] = fit_reward_model(test.X, test.actions, test.rewards, K).predict(train.X)
    return out


def _retrain_entry(args: argparse.Namespace, artifacts: Path) -> dict[str, Any]:
    """The history entry of the daemon's retrain ``args.retrain``."""
    if args.segments is not None or args.max_rows is not None:
        raise ConfigError("Expected either --retrain or --segments / --max-rows. Got both.")
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
    return dict(entry)


def _rows(args: argparse.Namespace, entry: dict[str, Any] | None
          ) -> tuple[ExperienceRows, ExperienceRows, ExperienceRows, list[Any] | None]:
    """(every row read, the training part, the held-out slice, the slice's start)."""
    log_dir = Path(args.log_dir)
    if entry is not None:
        first, last = entry["segments"]
        rows = read_window(log_dir, first, last, entry.get("max_rows") or entry["rows"],
                           entry.get("watermark"))
        fraction = float(entry.get("holdout_fraction") or args.holdout_fraction
                         or DEFAULT_HOLDOUT_FRACTION)
    else:
        first_, last_ = parse_segments(args.segments)
        rows = read_window(log_dir, first_, last_, args.max_rows, None)
        fraction = args.holdout_fraction or DEFAULT_HOLDOUT_FRACTION
    if entry is not None:
        require_window(entry, rows, log_dir)
    if len(rows) == 0:
        raise DataError(f"Expected logged rows in {log_dir}. Got none.")
    train, held, cut = split_in_time(rows, fraction)
    return rows, train, held, cut


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON report of ``streamlearn evaluate`` (policy → estimator → estimate)."""
    log_dir = Path(args.log_dir)
    if not log_dir.is_dir():
        raise ConfigError(f"Expected LOG_DIR to be an experience log directory "
                          f"(<checkpoint.dir>/experience). Got {str(log_dir)!r}, not a directory.")
    artifacts = Path(args.artifacts) if args.artifacts else log_dir.parent / "rankers"
    entry = _retrain_entry(args, artifacts) if getattr(args, "retrain", None) is not None else None
    if is_candidate_log(log_dir):
        for given, option, why in (
                (args.clip is not None, "--clip", "its per-slot bounds take the weights unclipped"),
                (args.holdout_only or args.holdout_fraction is not None,
                 "--holdout-only or --holdout-fraction", "its request log keeps only the "
                 "held-out requests (retrain.holdout_fraction of the daemon), and all of them "
                 "are judged"),
                (entry is not None and args.level is not None, "--level with --retrain",
                 "the retrain's rankers are judged at the miss probability the loop spent on "
                 "each, and the rest at the retrain's level")):
            if given:
                raise ConfigError(f"Expected no {option} on a candidate-mode log: {why}. "
                                  f"Got {option}.")
        level = float((entry or {}).get("level") or args.level or DEFAULT_LEVEL)
        estimators = _estimators(args.estimator or ",".join(CANDIDATE_ESTIMATORS),
                                 CANDIDATE_ESTIMATORS, " on a candidate-mode log (per-slot values)")
        return evaluate_candidates(log_dir, args.policy, estimators,
                                   parse_segments(args.segments), args.max_rows, level,
                                   artifacts, entry)
    args.level = DEFAULT_LEVEL if args.level is None else args.level
    estimators = _estimators(args.estimator or "bound,ips,snips,dr")
    rows, train, held, cut = _rows(args, entry)
    holdout_only = bool(args.holdout_only or entry is not None)
    evaluated = held if holdout_only else rows
    if len(evaluated) == 0:
        raise DataError("Expected held-out rows to evaluate. Got none.")
    if args.policy:
        names = args.policy
    elif entry is not None:
        names = list(entry.get("estimates") or {})
    else:
        names = ["logged", "learner", "uniform"]
    if entry is not None and "current" in names:
        names.remove("current")  # the live ranker of then: evaluated by its artifact
    selection_clip = float((entry or {}).get("clip") or DEFAULT_SELECTION_CLIP)
    # --retrain V: ranker:NAME is the artifact retrain V made, not the newest one of NAME
    pinned = {c["name"]: recorded_artifact(c["artifact"], artifacts)
              for c in (entry or {}).get("challengers") or []
              if c.get("version") == (entry or {}).get("version")}
    policies = {name: _policy(name, evaluated, train, artifacts, selection_clip, pinned)
                for name in names}
    clip = math.inf if args.clip is None else float(args.clip)
    if holdout_only:
        estimates = estimate_policies(train, held, policies, estimators, args.level, clip)
    else:
        estimates = _all_rows_estimates(rows, len(train), policies, estimators, args.level, clip)
    report: dict[str, Any] = {
        "log_dir": str(log_dir), "segments": list(rows.segments) if rows.segments else None,
        "rows": len(evaluated), "holdout_only": holdout_only,
        "clip": None if args.clip is None else clip, "level": args.level,
        "evidence_since": cut, "estimates": estimates}
    if entry is not None:
        report["retrain"] = entry["version"]
        tracked = entry.get("challengers") or []
        report["challengers"] = [
            {k: c[k] for k in ("name", "version", "rows", "passed", "advantage_lower", "value",
                               "ess", "alpha")}
            for c in judge_challengers(log_dir, [{**c, "looks": int(c.get("looks", 1)) - 1,
                                                  "artifact": recorded_artifact(c["artifact"],
                                                                                artifacts)}
                                                 for c in tracked],
                                       held, entry["segments"][1], entry.get("watermark"), {},
                                       entry.get("max_evidence"))]
    return report


def _all_rows_estimates(rows: ExperienceRows, n_train: int, policies: dict[str, np.ndarray],
                        estimators: list[str], level: float, clip: float
                        ) -> dict[str, dict[str, dict[str, Any]]]:
    """Estimates over every row (in evidence order, the first ``n_train`` the training part);
    DR's reward model by two-fold cross-fitting."""
    held = np.arange(len(rows)) >= n_train
    model = _cross_fitted(rows, held) if "dr" in estimators else None
    return estimates_on(rows, policies, estimators, level, clip, model)


def _note(name: str, e: dict[str, Any]) -> str:
    """What a reader should know about one estimate."""
    ess, n = e.get("ess"), e.get("n") or 0
    low, high = e.get("low"), e.get("high")
    if name == "bound":
        if low is not None and high is not None and low > high:
            return ("contradicted: low above high, no constant value fits this log (the "
                    "policy did differently on older and newer rows: docs/daemon.md §8)")
        return "read this: valid at any sample size and weight"
    notes = []
    if low is not None and low == high and n:
        notes.append("an interval of zero width: every weighted reward alike, which "
                     "understates the doubt")
    if ess is not None and ess < MIN_ESS:
        notes.append(f"not to be trusted: {ess:.0f} effective rows")
    if e.get("clipped"):
        notes.append(f"{100 * e['clipped'] / max(n, 1):.1f} % of weights clipped (biased)")
    return "; ".join(notes)


def _print_table(report: dict[str, Any]) -> None:
    clip = "unclipped" if report["clip"] is None else f"clip {report['clip']:g}"
    print(f"log {report['log_dir']}  segments {report['segments']}  rows {report['rows']:,}"
          f"{' (held-out slice)' if report['holdout_only'] else ''}  {clip}  "
          f"level {report['level']}")
    print("Read 'bound': a confidence sequence (for the running average of the policy's values "
          "along the rows), valid at any effective sample size, with weights of any size. "
          "ips/snips/dr are point estimates: ips unbiased but noisy, "
          "snips pulled towards the logger's behaviour on few effective rows, dr as good as its "
          "reward model.")
    width = max(len("policy"), *(len(p) for p in report["estimates"]))
    print(f"{'policy':<{width}}  estimator  {'value':>8}  {'low':>8}  {'high':>8}  {'ESS':>8}  note")
    for policy, ests in report["estimates"].items():
        for name, e in ests.items():
            ess = e.get("ess")
            print(f"{policy:<{width}}  {name:<9}  {format_value(e['value']):>8}  "
                  f"{format_value(e['low']):>8}  {format_value(e['high']):>8}  "
                  f"{'—' if ess is None else f'{ess:,.0f}':>8}  "
                  f"{_note(name, e)}".rstrip())
    for c in report.get("challengers") or []:
        verdict = "passed" if c["passed"] else "did not pass"
        low = c["advantage_lower"]
        print(f"challenger {c['name']} v{c['version']}: {verdict} (advantage over what was live "
              f">= {'—' if low is None else f'{low:+.4f}'} on {c['rows']:,} rows, ESS "
              f"{c['ess']:.0f}, alpha {c['alpha']:.2g})")


def run(args: argparse.Namespace) -> int:
    report = evaluate(args)
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    elif report.get("mode") == "candidates":
        print_candidate_table(report)
    else:
        _print_table(report)
    return 0

