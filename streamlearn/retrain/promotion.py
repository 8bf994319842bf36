"""The promotion gate: is a retrained ranker credibly better than the policy that is live?

Every ranker a retrain produces becomes a **challenger**. Its evidence is every logged
row decided after the rows it was trained on (``since``: the first row of its retrain's
held-out slice, as [decision time, id hash] in evidence order) and before the retrain's
watermark (the oldest decision still waiting
for feedback, so every earlier decision is in the log), in decision order — each look
of a later retrain extends the same sequence. On those rows it is evaluated **as it
would be deployed**: its best allowed action with the exploration rate the learner used
at that decision (:func:`deployed_policy`), against **what was live on the same rows**
(the logger itself), paired row by row:

    Y_i = 1 + r_i·(w_i − 1),   w_i = π(a_i|x_i) / p_i,   E[Y_i] = 1 + V(π) − V(logger_i)

``Y ≥ 0`` whatever the weights, so a betting confidence sequence
(:mod:`streamlearn.evaluation.bounds`) gives a lower bound on the advantage that holds
at every look, at any effective sample size and with weights of any size. A challenger
passes when its sequence rejects "no better than what was live" (``m = 1``). Its evidence
is capped at :data:`MAX_EVIDENCE_WINDOWS` retrain windows of rows (a prefix of the
sequence: the bound stays valid), so a look costs at most that much work.

Several challengers are judged at once and a new batch arrives with every retrain, so
the miss probability is spent: the j-th challenger since the live policy last changed
is judged at ``α_j = α / (j (j + 1))`` (Σ α_j = α). Hence, between two changes of the
live policy, the probability that *any* challenger truly no better than what was live
passes is at most α = 1 − ``level``. A challenger is judged at most
:data:`MAX_LOOKS` times (then dropped) and at most :data:`MAX_CHALLENGERS` are kept.

:func:`promotion_decision` picks, among the challengers that passed, the one with the
highest lower bound on its advantage; passing starts a guarded rollout, not a switch
(:mod:`streamlearn.service.rollout`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamlearn.actions import exploit_around
from streamlearn.durability.experience import ExperienceRows
from streamlearn.evaluation.bounds import HEAVY_GAMBLERS, first_crossing, lower_bound, value_interval
from streamlearn.evaluation.offpolicy import effective_sample_size
from streamlearn.features import hash_strings
from streamlearn.rankers.base import Ranker
from streamlearn.rankers.joint import action_scores

__all__ = [
    "MAX_CHALLENGERS",
    "MAX_EVIDENCE_WINDOWS",
    "MAX_LOOKS",
    "TRIAL_NDCG_MARGIN",
    "advantage_terms",
    "candidate_promotion",
    "challenger_alpha",
    "deployed_policy",
    "evidence_order",
    "from_key",
    "importance",
    "judge",
    "judge_weighted",
    "key_of",
    "not_before",
    "paired_advantage",
    "passes",
    "promotion_decision",
    "still_judged",
]

MAX_LOOKS = 10  # a challenger judged this many times without passing is dropped
MAX_CHALLENGERS = 6  # challengers kept between retrains (the newest)
MAX_EVIDENCE_WINDOWS = 2  # ... and judged on at most this many retrain windows of rows


def challenger_alpha(alpha: float, index: int) -> float:
    """The miss probability spent on the ``index``-th challenger (1-based) since the live
    policy last changed: α / (j (j + 1)), which sums to α over all j.

    >>> challenger_alpha(0.05, 1), round(challenger_alpha(0.05, 3), 6)
    (0.025, 0.004167)
    """
    if index < 1:
        raise ValueError(f"Expected a challenger index >= 1. Got {index}.")
    return alpha / (index * (index + 1))


def evidence_order(rows: ExperienceRows) -> np.ndarray:
    """The row order of a confidence sequence: by decision time, ties (a batch decided at
    once) by a hash of the id, so the order never depends on how the rows were read."""
    return np.lexsort((hash_strings(list(rows.ids)), rows.decided_at))


def from_key(rows: ExperienceRows, key: list[Any]) -> np.ndarray:
    """Rows at or after ``key`` = [decision time, id hash] in :func:`evidence_order`."""
    time, hashed = float(key[0]), np.uint64(int(key[1]))
    t = np.asarray(rows.decided_at)
    return np.asarray((t > time) | ((t == time) & (hash_strings(list(rows.ids)) >= hashed)))


def not_before(key: list[Any], epoch: float | None) -> list[Any]:
    """An evidence start ``key`` moved to ``epoch`` (when what is live last changed) if it
    is earlier: a challenger is judged only on rows that what is live now decided (the
    comparator of its paired advantage is the logger)."""
    if epoch is None or (float(key[0]), int(key[1])) >= (epoch, 0):
        return key
    return [float(epoch), 0]


def key_of(rows: ExperienceRows, row: int) -> list[Any]:
    """The [decision time, id hash] of one row: where an evidence sequence starts."""
    return [float(rows.decided_at[row]), int(hash_strings([rows.ids[row]])[0])]


def deployed_policy(ranker: Ranker, rows: ExperienceRows) -> np.ndarray:
    """The ranker as the loop deploys it, on each logged row: 1 − γ on its best allowed
    action (the actions the logger could take), γ spread over them, with the row's γ."""
    X = np.asarray(rows.X, dtype=np.float64)
    allowed = rows.probs > 0
    return exploit_around(action_scores(ranker, X, rows.probs.shape[1]), allowed,
                          np.asarray(rows.gamma, dtype=np.float64))


def importance(rows: ExperienceRows, pi: np.ndarray) -> np.ndarray:
    """w = π(a|x)/p of every row (unclipped)."""
    picked = pi[np.arange(len(rows)), rows.actions]
    return np.asarray(picked / rows.propensities, dtype=np.float64)


def advantage_terms(rewards: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``1 + r·(w − 1)`` per logged decision: nonnegative, mean 1 + V(π) − V(logger)."""
    return np.asarray(1.0 + np.asarray(rewards, np.float64) * (np.asarray(w, np.float64) - 1.0))


def paired_advantage(rows: ExperienceRows, pi: np.ndarray) -> np.ndarray:
    """:func:`advantage_terms` of every logged row for the target ``pi``."""
    return advantage_terms(rows.rewards, importance(rows, pi))


def passes(advantage: np.ndarray, alpha: float) -> bool:
    """The gate: the confidence sequence of the paired advantage (in evidence order) rejects
    "no better than what was live" (its mean ≤ 1) at ``alpha``. It agrees with the lower bound
    :func:`judge` reports being ≥ 0."""
    return first_crossing(advantage, alpha, 1.0, HEAVY_GAMBLERS) is not None


def judge(rows: ExperienceRows, pi: np.ndarray, alpha: float) -> dict[str, Any]:
    """A challenger's verdict on its evidence rows (already in :func:`evidence_order`).

    ``passed``: its advantage over what was live is credibly above 0 (at ``alpha``);
    ``advantage_lower``: the confidence sequence's lower bound on that advantage;
    ``value``: a confidence sequence for its own value (each side at ``alpha``/2: the
    interval its live value is later checked against), with the IPS estimate ``mean``.
    """
    return judge_weighted(np.asarray(rows.rewards), importance(rows, pi), alpha)


def judge_weighted(rewards: np.ndarray, w: np.ndarray, alpha: float) -> dict[str, Any]:
    """:func:`judge` from each logged decision's reward and importance weight (in evidence
    order): what candidate mode judges per slot (:func:`streamlearn.candidates.slates.slot_terms`)."""
    if not len(rewards):
        return {"rows": 0, "passed": False, "advantage_lower": None, "value": None,
                "ess": 0.0, "max_weight": None, "mean_weight": None}
    y = advantage_terms(rewards, w)
    low = lower_bound(y, alpha, high=2.0, n_gamblers=HEAVY_GAMBLERS)
    value = value_interval(rewards, w, alpha)
    return {"rows": len(rewards), "passed": passes(y, alpha), "advantage_lower": low - 1.0,
            "value": value.as_dict(), "ess": effective_sample_size(w),
            "max_weight": float(np.max(w)), "mean_weight": float(np.mean(w))}


def promotion_decision(result: dict[str, Any]) -> dict[str, Any]:
    """The challenger to promote from a retrain's report: among those that passed, the one
    with the highest lower bound on its advantage (ties: the first listed)."""
    challengers = result.get("challengers") or []
    passed = [c for c in challengers if c.get("passed")]
    decision: dict[str, Any] = {"promote": False, "ranker": None, "artifact": None,
                                "advantage_lower": None, "alpha": None}
    if not passed:
        best = max((c for c in challengers if c.get("advantage_lower") is not None),
                   key=lambda c: c["advantage_lower"], default=None)
        if best is None:
            return {**decision, "reason": "no challenger has evidence yet"}
        return {**decision, "ranker": best["name"], "advantage_lower": best["advantage_lower"],
                "reason": (f"no challenger is credibly better than what was live; best "
                           f"{best['name']} v{best['version']}: advantage >= "
                           f"{_fmt(best['advantage_lower'])} on {best['rows']:,} rows "
                           f"({_evidence(best)})")}
    best = max(passed, key=lambda c: c["advantage_lower"])
    return {"promote": True, "ranker": best["name"], "artifact": best["artifact"],
            "version": best["version"], "advantage_lower": best["advantage_lower"],
            "alpha": best["alpha"], "value": best["value"],
            "reason": (f"{best['name']} v{best['version']}: advantage over what was live >= "
                       f"{_fmt(best['advantage_lower'])} on {best['rows']:,} rows "
                       f"({_evidence(best)})")}


def _evidence(challenger: dict[str, Any]) -> str:
    """How much the rows say about a challenger: the ESS counts the rows its weights use,
    the mean weight how much of its probability the logger covered (E[w] = 1 when it acted
    wherever the challenger would; below, the rest of the challenger's mass fell where
    nothing was logged, which no ESS shows: an outside test read "ESS 2,076" for a ranker
    with mean weight 0.42)."""
    mean = challenger.get("mean_weight")
    covered = "" if mean is None else f", mean weight {mean:.2f}"
    return f"ESS {challenger['ess']:.0f}{covered}, alpha {challenger['alpha']:.2g}"


#: how far a ranker's held-out NDCG must exceed the learner's own slot order for a trial
TRIAL_NDCG_MARGIN = 0.05


def candidate_promotion(result: dict[str, Any], trial: bool) -> dict[str, Any]:
    """Candidate mode's decision from a retrain's report
    (:func:`streamlearn.retrain.candidates.run_candidate_retrain`).

    A ranker whose per-slot verdict passed is promoted by :func:`promotion_decision`'s rule.
    When none passed and ``trial`` (the caller allows one: the daemon does when the learner
    alone serves), the ranker with
    the best held-out NDCG enters the rollout **as a trial** if that NDCG exceeds the
    learner's own slot order by :data:`TRIAL_NDCG_MARGIN` and its off-policy value is not
    credibly below the learner's (its interval wholly below the learner's mean reward per
    slot). A trial serves the
    rollout's first share, where the on-policy guardrail decides: when the learner
    explores little (OHSUMED: γ ≈ 0.01 over ~150 candidates) no log holds the evidence
    an off-policy gate needs about a ranker that disagrees with it, and the first share is
    how that evidence is collected at a bounded cost.
    """
    version = result.get("version")
    rankers = result.get("rankers") or {}
    challengers = [{"name": name, "artifact": info["artifact"], "version": version,
                    **info["offpolicy"]}
                   for name, info in rankers.items() if info.get("offpolicy", {}).get("rows")]
    decision = promotion_decision({"challengers": challengers})
    if not challengers:  # say why no ranker was judged (no request log, none held out yet)
        skipped = (result.get("offpolicy") or {}).get("skipped")
        decision["reason"] = f"no ranker judged off-policy: {skipped or 'no held-out slot'}"
    if decision["promote"] or not trial:
        return decision
    learner = (result.get("learner") or {}).get("ndcg")
    scored = [(info["ndcg"], name) for name, info in rankers.items()
              if info.get("ndcg") is not None]
    if learner is None or not scored:
        return decision
    ndcg, name = max(scored)
    info = rankers[name]
    verdict = info.get("offpolicy") or {}
    value = verdict.get("value")
    logger = [v for v in (result.get("offpolicy") or {}).get("learner_slots", [])
              if v is not None and math.isfinite(v)]
    worse = value is not None and logger and value["high"] < float(np.mean(logger))
    if ndcg < learner + TRIAL_NDCG_MARGIN or worse:
        return decision
    return {"promote": True, "trial": True, "ranker": name, "artifact": info["artifact"],
            "version": version, "advantage_lower": verdict.get("advantage_lower"),
            "alpha": verdict.get("alpha"), "value": value,
            "reason": (f"trial: {name} v{version}: held-out NDCG {ndcg:.4f} > the learner's "
                       f"{learner:.4f} + {TRIAL_NDCG_MARGIN}; no ranker is credibly better "
                       f"off-policy ({decision['reason']}), so it serves the rollout's first "
                       "share and the on-policy guardrail judges it")}


def still_judged(judged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The challengers of a retrain's report judged again at the next one (none promoted):
    those that neither passed nor ran out of evidence or looks, the newest
    :data:`MAX_CHALLENGERS`, as ``state.json`` keeps them."""
    kept = [c for c in judged if not c.get("passed") and not c.get("exhausted")
            and c["looks"] < MAX_LOOKS]
    return [{k: c[k] for k in ("name", "artifact", "version", "since", "first_segment",
                               "index", "alpha", "looks")} for c in kept[-MAX_CHALLENGERS:]]


def _fmt(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:+.4f}"
