"""``streamlearn evaluate`` on a candidate-mode experience log: per-slot off-policy values.

A candidate-mode log (``serve`` with ``candidates.enabled``) keeps the placed
candidates in the experience log and, in its **request log** (``<log>/requests``),
every candidate of the requests the retrain holds out (by id hash). A policy is
judged on those requests as the retrain loop judges its rankers
(:mod:`streamlearn.retrain.candidates`): **per slot, given the logged prefix**, each
term r_s · π(c_s | the slots placed before s) / p_s, with a confidence sequence per
slot, and against what placed the logged slots, the promotion gate's verdict on the
paired advantage over every slot.

Policies: ``logged`` (what placed the slots: its mean reward per slot, on-policy),
``uniform`` (a uniformly random candidate among those not yet placed) and
``ranker:NAME`` / ``ranker:PATH`` (a retrained ranker deployed as the loop deploys
it: 1 − γ on its best-scored candidate not yet placed, γ spread over those, with the
learner's γ at each request). The learner's own scores are not logged, so it has no
policy of its own here: while it alone serves, it is ``logged``.

``--retrain V`` reads the window of the daemon's candidate retrain ``V`` (its
experience and request-log segments, row cap, watermark and the time since which its
rankers were judged) and judges that retrain's rankers at the miss probability the
loop spent on each: the per-slot values and verdicts the loop acted on, reproduced.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from streamlearn.durability.experience import ExperienceRows, read_experience, require_window
from streamlearn.durability.recorder import REQUESTS_DIR
from streamlearn.errors import ConfigError, DataError
from streamlearn.retrain.artifact import recorded_artifact, resolve_artifact
from streamlearn.retrain.candidates import LoggedRequests, heldout_requests

__all__ = ["CANDIDATE_ESTIMATORS", "CANDIDATE_POLICY_FORMS", "MIN_ESS", "evaluate_candidates",
           "format_value", "is_candidate_log", "print_candidate_table"]

CANDIDATE_POLICY_FORMS = "logged, uniform, ranker:NAME or ranker:PATH"
CANDIDATE_ESTIMATORS = ("bound", "ips")  # the per-slot confidence sequence and its IPS mean
MIN_ESS = 20.0  # fewer effective rows than this: the point estimates are not to be trusted


def _is_pair_id(text: str) -> bool:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def is_candidate_log(log_dir: Path) -> bool:
    """Whether ``log_dir`` was written in candidate mode: it has a request log, or its
    rows are (request, candidate) pairs."""
    if (log_dir / REQUESTS_DIR).is_dir():
        return True
    rows = read_experience(log_dir, max_rows=1)
    return bool(rows.ids) and _is_pair_id(rows.ids[-1])


def _dimensions(learned: ExperienceRows, log_dir: Path, entry: dict[str, Any] | None
                ) -> tuple[int, int]:
    """(d_x, d_c): the retrain's, else from the two logs' widths (experience rows are
    [context, candidate, exploit candidate], request rows [context, candidate])."""
    recorded = (entry or {}).get("candidates")
    if recorded:
        return int(recorded["d_x"]), int(recorded["d_c"])
    requests = read_experience(log_dir / REQUESTS_DIR, max_rows=1)
    if not len(requests):
        raise DataError(f"Expected a request log in {log_dir / REQUESTS_DIR} (serve writes it in "
                        "candidate mode while retraining is on). Got none: a candidate-mode log "
                        "without it has no whole requests to judge a policy on.")
    d_c = learned.X.shape[1] - requests.X.shape[1]
    d_x = requests.X.shape[1] - d_c
    if d_c < 1 or d_x < 0:
        raise DataError(f"Expected experience rows of d_x + 2·d_c columns and request rows of "
                        f"d_x + d_c. Got {learned.X.shape[1]} and {requests.X.shape[1]}.")
    return d_x, d_c


def _judged(entry: dict[str, Any] | None, log_dir: Path, segments: tuple[int | None, int | None],
            max_rows: int | None) -> tuple[LoggedRequests, tuple[int, int]]:
    """The whole requests to judge on (a retrain's, or every one of the request log whose
    placed candidates all have their reward), and (d_x, d_c)."""
    if entry is not None:
        window = entry.get("offpolicy") or {}
        missing = [k for k in ("candidates", "max_rows", "watermark") if k not in entry] + \
            ([] if "request_segments" in window else ["offpolicy.request_segments"])
        if missing:
            raise ConfigError(f"Expected retrain {entry.get('version')} to record its window "
                              f"({', '.join(missing)}). Got an entry without it (written by an "
                              "older streamlearn, or a retrain that judged no ranker: "
                              f"{window.get('skipped', 'no off-policy part')}).")
        first, last = entry["segments"]
        learned = read_experience(log_dir, first, last, entry["max_rows"])
        require_window(entry, learned, log_dir)
        d_x, d_c = _dimensions(learned, log_dir, entry)
        judged = heldout_requests(log_dir, learned, d_x, d_c, float(entry["holdout_fraction"]),
                                  entry["watermark"], entry.get("since"), entry["max_rows"],
                                  window["request_segments"])
    else:
        learned = read_experience(log_dir, segments[0], segments[1], max_rows)
        if not len(learned):
            raise DataError(f"Expected logged rows in {log_dir}. Got none.")
        d_x, d_c = _dimensions(learned, log_dir, None)
        # the request log keeps only held-out requests: every one of them is judged
        judged = heldout_requests(log_dir, learned, d_x, d_c, 1.0, None, None, None)
    if isinstance(judged, str):
        raise DataError(f"Expected whole logged requests to judge on. Got {judged}.")
    return judged, (d_x, d_c)


def _alphas(entry: dict[str, Any] | None, names: list[str], level: float) -> dict[str, float]:
    """The miss probability of each policy's verdict: ``--retrain V``'s rankers at what the
    loop spent on them, every other at 1 − level."""
    spent = {f"ranker:{name}": float(info["offpolicy"]["alpha"])
             for name, info in ((entry or {}).get("rankers") or {}).items()
             if (info or {}).get("offpolicy")}
    return {name: spent.get(name, 1.0 - level) for name in names}


def evaluate_candidates(log_dir: Path, names: list[str] | None, estimators: list[str],
                        segments: tuple[int | None, int | None], max_rows: int | None,
                        level: float, artifacts: Path, entry: dict[str, Any] | None
                        ) -> dict[str, Any]:
    """The JSON report of ``streamlearn evaluate`` on a candidate-mode log (module doc)."""
    judged, (d_x, d_c) = _judged(entry, log_dir, segments, max_rows)
    ranked = [n for n, info in ((entry or {}).get("rankers") or {}).items()
              if (info or {}).get("artifact")]  # (a ranker that failed has none)
    # default: what the retrain judged (with --retrain), else logged and uniform
    names = list(names or (["logged", *(f"ranker:{n}" for n in ranked)] if entry is not None
                           else ["logged", "uniform"]))
    pinned = {n: recorded_artifact(str(info["artifact"]), artifacts)
              for n, info in ((entry or {}).get("rankers") or {}).items()
              if (info or {}).get("artifact")}
    alphas = _alphas(entry, names, level)
    estimates: dict[str, Any] = {}
    for name in names:
        kind, _, arg = name.partition(":")
        if name == "logged":
            estimates[name] = {"slots": judged.logger_intervals(1.0 - level)}
            continue
        if name == "uniform":
            target = judged.uniform()
        elif kind == "ranker" and arg:
            artifact = resolve_artifact(pinned.get(arg, arg), artifacts)
            expected = artifact.meta.get("candidates")
            if expected is None or (int(expected["d_x"]), int(expected["d_c"])) != (d_x, d_c):
                raise ConfigError(f"Expected a ranker retrained on candidate sets of (d_x, d_c) "
                                  f"= {d_x, d_c}. Got {artifact.path} "
                                  f"({'trained on fixed actions' if expected is None else expected}).")
            target = judged.deployed(artifact.ranker)
        else:
            raise ConfigError(f"Expected --policy {CANDIDATE_POLICY_FORMS} on a candidate-mode "
                              f"log (the learner's own scores are not logged; 'logged' is what "
                              f"placed the slots). Got {name!r}.")
        verdict = judged.judge_target(target, alphas[name])
        estimates[name] = {"slots": verdict.pop("slots"),
                           "verdict": {**verdict, "alpha": alphas[name]}}
        if kind == "ranker":  # NAME is the newest artifact of that name: say which
            estimates[name]["artifact"] = str(artifact.path)
    report: dict[str, Any] = {
        "log_dir": str(log_dir), "mode": "candidates", "d_x": d_x, "d_c": d_c,
        "requests": len(judged), "slots": int(judged.logged.shape[1]), "level": level,
        "request_segments": None if judged.segments is None else list(judged.segments),
        "estimators": estimators, "estimates": estimates}
    if entry is not None:
        report["retrain"] = entry["version"]
        report["recorded"] = {f"ranker:{n}": info.get("offpolicy")
                              for n, info in (entry.get("rankers") or {}).items()}
    return report


def format_value(value: float | None) -> str:
    """An estimate as the tables print it: 4 decimals, '—' when there is none."""
    return "—" if value is None or not math.isfinite(value) else f"{value:.4f}"


def print_candidate_table(report: dict[str, Any]) -> None:
    """The candidate-mode report for people."""
    levels = f"level {report['level']}" if "retrain" not in report else (
        f"retrain {report['retrain']}: logged at level {report['level']}, each ranker at the "
        "alpha the loop spent on it (its verdict's line)")
    print(f"candidate log {report['log_dir']}  {report['requests']:,} whole requests (the "
          f"request log's held-out ones)  {report['slots']} slots  {levels}")
    print("Each slot's value given the slots placed before it (what the loop judges rankers "
          "on): 'low'..'high' a confidence sequence, 'value' its IPS mean; 'logged' is "
          "on-policy. On few effective rows the IPS mean is noisy (it can exceed 1 or lie "
          "outside the interval): read the interval.")
    width = max(len("policy"), *(len(p) for p in report["estimates"]))
    show_bound = "bound" in report["estimators"]
    print(f"{'policy':<{width}}  slot  {'value':>8}"
          + (f"  {'low':>8}  {'high':>8}" if show_bound else "") + f"  {'rows':>8}  {'ESS':>8}  note")
    for policy, e in report["estimates"].items():
        for s, iv in enumerate(e["slots"], start=1):
            bound = f"  {format_value(iv['low']):>8}  {format_value(iv['high']):>8}" if show_bound else ""
            note = f"value not to be trusted: {iv['ess']:.1f} effective rows (read the bound)" \
                if iv["ess"] < MIN_ESS else ""
            print(f"{policy:<{width}}  {s:>4}  {format_value(iv['mean']):>8}{bound}  {iv['n']:>8,}  "
                  f"{iv['ess']:>8,.0f}  {note}".rstrip())
    for policy, e in report["estimates"].items():
        v = e.get("verdict")
        if v is None:
            continue
        low = v["advantage_lower"]
        if e.get("artifact"):
            print(f"{policy} is {e['artifact']}")
        print(f"{policy}: {'passed' if v['passed'] else 'did not pass'} against what placed "
              f"the logged slots (advantage per slot >= "
              f"{'—' if low is None else f'{low:+.4f}'} on {v['rows']:,} slots, ESS "
              f"{v['ess']:.0f}, alpha {v['alpha']:.2g})")
