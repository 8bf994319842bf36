"""``streamlearn inspect PATH``: what a checkpoint (or a saved learner, or a ranker) holds.

``PATH`` may be one snapshot (a ``ckpt-<seq>`` directory, a directory
written by ``save_learner`` or a ranker artifact), the state directory of a
scaled-out group (its ``partition-<p>`` checkpoints, summed:
:mod:`streamlearn.commands.inspect_group`) or a checkpoint directory, in
which case its newest ``ckpt-<seq>`` is shown (``--all`` lists every one) and,
when the daemon retrains rankers, the live and promoted ranker artifacts and
the promotion history (``rankers/state.json``). The snapshot is
read with :func:`streamlearn.snapshot.read_snapshot`, which verifies the
format version and the sha256 of the arrays: a corrupt file is reported as
such (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.commands.inspect_group import (
    describe_changelog,
    describe_group,
    is_group_state,
    print_group,
)
from streamlearn.commands.readable import spec_text
from streamlearn.errors import ConfigError, StateError
from streamlearn.retrain.artifact import recorded_artifact
from streamlearn.service.rollout import ArmStats
from streamlearn.snapshot import ARRAYS_FILE, META_FILE, read_snapshot

__all__ = ["add_parser", "describe", "describe_state", "run", "snapshots_in"]

_CKPT = re.compile(r"^ckpt-(\d+)$")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect", help="show what a checkpoint or saved learner holds",
        description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", metavar="PATH", nargs="?",
                        help="a snapshot directory, or a checkpoint directory (newest shown)")
    parser.add_argument("--changelog", metavar="TOPIC",
                        help="instead of PATH: every partition's newest checkpoint in this "
                        "changelog topic (checkpoint.changelog), read only; needs --bootstrap")
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka, for --changelog")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--all", action="store_true",
                        help="every snapshot of a checkpoint directory, oldest first")
    parser.set_defaults(run=run)


def snapshots_in(path: Path) -> list[Path]:
    """The snapshot(s) ``path`` designates, oldest first."""
    if not path.exists():
        raise StateError(f"{path} does not exist.")
    if (path / META_FILE).is_file() or (path / ARRAYS_FILE).is_file():
        return [path]
    if path.is_dir():
        found = sorted((int(m.group(1)), p) for p in path.iterdir()
                       if (m := _CKPT.match(p.name)) and p.is_dir())
        if found:
            return [p for _, p in found]
    raise StateError(f"{path} is neither a streamlearn snapshot ({META_FILE} + {ARRAYS_FILE}) "
                     f"nor a checkpoint directory (ckpt-<seq> inside).")


def _learner_meta(meta: dict[str, Any]) -> dict[str, Any] | None:
    """Where the learner's own metadata sits: top level, or under a 'learner' key; a
    candidate-set learner's (its dimensions and hyperparameters) in the same shape."""
    for candidate in (meta.get("learner"), meta):
        if isinstance(candidate, dict) and "class" in candidate and "params" in candidate:
            return candidate
    learner = meta.get("learner")
    if isinstance(learner, dict) and "class" in learner and "hyperparameters" in learner:
        return {"class": learner["class"],
                "params": {"d_x": learner.get("d_x"), "d_c": learner.get("d_c"),
                           "seed": learner.get("seed"), **(learner["hyperparameters"] or {})},
                "counters": {"requests": learner.get("n_requests")}}
    return None


def _shown_settings(settings: Any) -> Any:
    """The settings as a reader needs them: in candidate mode the fixed-action learner's
    section (unused there; the candidate learner is under ``candidates``) is left out."""
    if isinstance(settings, dict) and (settings.get("candidates") or {}).get("enabled"):
        return {k: v for k, v in settings.items() if k != "learner"}
    return settings


def describe(path: Path) -> dict[str, Any]:
    """A JSON-ready summary of one snapshot (raises StateError when it is corrupt)."""
    arrays, meta = read_snapshot(path)
    return describe_state(str(path), arrays, meta)


def describe_state(where: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]
                   ) -> dict[str, Any]:
    """A JSON-ready summary of a snapshot's arrays and metadata, read from ``where``."""
    learner = _learner_meta(meta)
    info: dict[str, Any] = {
        "path": where,
        "kind": meta.get("kind", "checkpoint" if "offsets" in meta else "unknown"),
        "format_version": meta.get("format_version"),
        "package_version": meta.get("package_version"),
        "checksum_ok": True,  # read_snapshot verified the sha256 or raised
        "arrays_sha256": meta.get("arrays_sha256"),
    }
    if "seq" in meta:
        info["seq"] = meta["seq"]
    if learner is not None:
        info["learner"] = {"class": learner.get("class"), "params": learner.get("params"),
                           "counters": learner.get("counters")}
    if "offsets" in meta:
        info["offsets"] = [{"topic": t, "partition": p, "next_offset": o}
                           for t, p, o in meta["offsets"]]
    if "pending.ids.ends" in arrays:
        info["pending_joins"] = len(arrays["pending.ids.ends"])
    elif "pending.ids" in arrays:  # checkpoints written before ids were stored as UTF-8 bytes
        info["pending_joins"] = len(arrays["pending.ids"])
    rollout = meta.get("rollout")
    if isinstance(rollout, dict) and (rollout.get("live") or rollout.get("candidate")):
        info["rollout"] = _rollout_summary(rollout)
    adoption = meta.get("adoption")
    if isinstance(adoption, dict) and "mode" in adoption:
        info["adoption"] = _adoption_summary(adoption)
    skip = {"format_version", "package_version", "arrays_sha256", "kind", "seq", "offsets",
            "learner", "rollout", "adoption"} | ({"class", "params", "counters", "exploration_state"}
                                     if learner is meta else set())
    extra = {k: _shown_settings(v) if k == "settings" else v
             for k, v in meta.items() if k not in skip}
    if extra:
        info["other"] = extra
    info["arrays"] = [{"name": name, "shape": list(a.shape), "dtype": str(a.dtype)}
                      for name, a in sorted(arrays.items())]
    info["arrays_bytes"] = int(sum(a.nbytes for a in arrays.values()))
    return info


def _rollout_summary(rollout: dict[str, Any]) -> dict[str, Any]:
    """Who served which share at this checkpoint (retrain.policy = "ranker")."""
    shares = {int(v): float(p) for v, p in (rollout.get("shares") or {}).items()}
    out: dict[str, Any] = {"learner_share": shares.get(0)}
    for role in ("live", "candidate"):
        arm = rollout.get(role)
        if arm:
            out[role] = {"ranker": arm.get("name"), "version": arm.get("version"),
                         "share": shares.get(int(arm.get("version", -1))),
                         "served": arm.get("served"), "interval": arm.get("interval")}
    if rollout.get("candidate"):
        out["stage"] = int(rollout.get("stage", 0)) + 1
    return out


def _adoption_summary(adoption: dict[str, Any]) -> dict[str, Any]:
    """Who serves next to an existing system (``rollout.mode``): the mode, the learner's share,
    the agreement with the baseline, each side's live value and the switches so far."""
    stats = adoption.get("stats") or {}
    values = {}
    for side in ("baseline", "learner"):
        kept = stats.get(side)
        arm = ArmStats.from_state({}, kept) if kept else ArmStats(0.05)
        values[side] = {"events": arm.n, "mean": arm.mean if arm.n else None,
                        "low": arm.lower(), "high": arm.upper()}
    mode = adoption.get("mode")
    return {"mode": mode, "configured": adoption.get("configured", mode),
            "learner_share": 1.0 if mode == "online" else adoption.get("share"),
            "agreement": adoption.get("agreement"), "events": adoption.get("events"),
            "earned": adoption.get("earned"), "live_value": values,
            "history": list(adoption.get("history") or [])}


def _short(value: Any, limit: int = 160) -> str:
    """``value`` as one line of JSON; a longer one is cut at ``limit`` characters and says
    how many more there are and where they are (``--json``)."""
    text = orjson.dumps(value, default=str).decode() if not isinstance(value, str) else value
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit:,} characters: --json shows all)"


def _column(names: list[str], at_least: int) -> int:
    """Width of a name column: the longest name and two spaces, so no value runs into its
    name (``learner.oracle.intercept_sq_grad`` is 32 characters)."""
    return max([at_least, *(len(n) + 2 for n in names)])


def _print_text(info: dict[str, Any]) -> None:
    if "error" in info:  # --all: a snapshot that does not read
        print(f"snapshot        {info['path']}\nunreadable      {info['error']}")
        return
    for passed in info.get("skipped", []):
        print(f"passed over     {passed['path']}: {passed['error']}")
    print(f"snapshot        {info['path']}" + (" (the newest that reads: serve restores it)"
                                                 if info.get("skipped") else ""))
    print(f"kind            {info['kind']}" + (f" (seq {info['seq']})" if "seq" in info else ""))
    print(f"format version  {info['format_version']}   written by streamlearn "
          f"{info['package_version']}")
    print(f"checksum        ok (sha256 {str(info['arrays_sha256'])[:16]}…)")
    if "learner" in info:
        learner = info["learner"]
        print(f"learner         {learner['class']}")
        params = learner.get("params") or {}
        width = _column(list(params), 14)
        for key, value in params.items():
            shown = spec_text(value) if isinstance(value, dict) and "name" in value else (
                _short(value))
            print(f"  {key:<{width}}{shown}")
        counters = learner.get("counters") or {}
        if counters:
            print("counters        " + "   ".join(
                f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in counters.items()))
    if "offsets" in info:
        print("offsets (next to read)")
        places = [f"{row['topic']}[{row['partition']}]" for row in info["offsets"]]
        width = _column(places, 0)
        for place, row in zip(places, info["offsets"], strict=True):
            print(f"  {place:<{width}}{row['next_offset']:,}")
    if "pending_joins" in info:
        print(f"pending joins   {info['pending_joins']:,}")
    if "rollout" in info:
        settings = (info.get("other") or {}).get("settings") or {}
        candidates = bool((settings.get("candidates") or {}).get("enabled"))
        adoption = info.get("adoption") or {}
        learner_share = adoption.get("learner_share") if adoption.get("mode") not in (
            None, "online") else None
        policy = (settings.get("retrain") or {}).get("policy", "ranker")
        if policy == "ranker":
            _print_rollout(info["rollout"], "slots" if candidates else "events",
                           None if learner_share is None else float(learner_share))
        else:  # written by a daemon whose rankers rank but do not serve
            print(f"serving         the learner (retrain.policy = {policy}; the rollout is "
                  "kept for policy = ranker)")
            _print_rollout(info["rollout"], "slots" if candidates else "events",
                           label="kept rollout")
    if "adoption" in info:
        _print_adoption(info["adoption"])
    other = info.get("other") or {}
    width = _column(list(other), 16)
    for key, value in other.items():
        print(f"{key:<{width}}{_short(value)}")
    print(f"arrays          {len(info['arrays'])} ({info['arrays_bytes']:,} bytes)")
    width = _column([row["name"] for row in info["arrays"]], 30)
    for row in info["arrays"]:
        shape = "×".join(str(s) for s in row["shape"]) or "scalar"
        print(f"  {row['name']:<{width}}{shape:<16}{row['dtype']}")


def describe_rankers(rankers_dir: Path) -> dict[str, Any] | None:
    """The retrained rankers of a checkpoint directory: live, promoted, history (or None)."""
    state_file = rankers_dir / "state.json"
    if not state_file.is_file():
        return None
    try:
        state: dict[str, Any] = orjson.loads(state_file.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise StateError(f"{state_file} is not valid JSON: {exc}") from exc
    def here(recorded: Any) -> str | None:  # recorded paths are read by name in this store
        return recorded_artifact(str(recorded), rankers_dir) if recorded else None

    promoted = [here(p) for p in state.get("promoted") or []]
    history = state.get("history") or []
    return {"live": here(state.get("live")), "best_measured": here(state.get("best_measured")),
            "promoted": promoted[-1] if promoted else None,
            "rollback_to": promoted[-2] if len(promoted) > 1 else None,
            "rollbacks": sum(1 for e in history
                             if e.get("rollout") == "rolled_back" or "rolled_back" in e),
            "abandoned": list(state.get("abandoned") or []),
            # candidate mode (its retrains measure queries) rolls out slots, not events
            "unit": "slots" if state.get("best_measured") or any("queries" in e for e in history)
            else "events",
            "history": history}


def _print_rollout(rollout: dict[str, Any], unit: str = "events",
                   of_learner: float | None = None, label: str = "serving") -> None:
    """Who serves which share; ``unit``: what a share is of (candidate mode: slots).
    ``of_learner``: next to a caller's baseline (rollout mode apprentice or conservative),
    the learner's share of the events, which the rollout's shares divide; the line then
    gives shares of all the events, the baseline's included (an outside test read a
    candidate at 10 % where it served 1 %)."""
    scale = 1.0 if of_learner is None else of_learner
    parts = []
    for role in ("live", "candidate"):
        arm = rollout.get(role)
        if arm:
            stage = f", stage {rollout['stage']}" if role == "candidate" else ""
            parts.append(f"{role} {arm['ranker']} v{arm['version']} "
                         f"{_percent(scale * (arm['share'] or 0))}"
                         f"{stage} ({arm['served'] or 0:,} learned {unit} served)")
    parts.append(f"learner {_percent(scale * (rollout.get('learner_share') or 0))}")
    if of_learner is not None:
        parts.append(f"baseline {_percent(1.0 - of_learner)}")
    print(f"{label:<16}{'; '.join(parts)}")


def _percent(share: float) -> str:
    """A share as a percentage: whole numbers, one decimal below 10 % (1.2 %, not 1 %)."""
    return f"{100 * share:.1f} %" if 0 < share < 0.1 else f"{100 * share:.0f} %"


def _print_adoption(adoption: dict[str, Any]) -> None:
    configured = adoption["configured"]
    since = "" if configured == adoption["mode"] else f" (configured {configured})"
    share = adoption.get("learner_share")
    agreement = adoption.get("agreement")
    if adoption["mode"] == "online":  # no baseline serves: who does is the 'serving' line
        print(f"rollout mode    online{since}: the caller's baseline serves nothing"
              + ("" if agreement is None else
                 f"; agreement with the baseline {float(agreement):.3f}"))
    else:
        print(f"rollout mode    {adoption['mode']}{since}; the learner serves "
              f"{'-' if share is None else f'{100 * float(share):.0f} %'} (the baseline the "
              f"rest); agreement with the baseline "
              f"{'-' if agreement is None else f'{float(agreement):.3f}'}")
    if adoption["mode"] != "online":
        sides = [f"{side} {v['mean']:.4f} [{v['low']:.4f}, {v['high']:.4f}] on {v['events']:,}"
                 for side, v in adoption["live_value"].items() if v["events"]]
        print(f"  earned        {'; '.join(sides) or '- (nothing learned in this mode yet)'}")
    history = adoption["history"]
    print(f"  switches      {len(history)}{', newest last' if history else ''}")
    for entry in history:
        print(f"    {entry.get('from')} -> {entry.get('to')}: {entry.get('why')}")


def _print_rankers(rankers: dict[str, Any]) -> None:
    best = rankers.get("best_measured")
    if best:  # candidate mode
        status = "promoted: see the serving line" if best == rankers["promoted"] else \
            "measured only: a ranker places slots once promoted"
        print(f"best measured   {best} (the newest retrain's best held-out NDCG; {status})")
    else:
        print(f"newest ranker   {rankers['live'] or '-'}")
    print(f"promoted        {rankers['promoted'] or '- (the online learner decides)'}")
    history = rankers["history"]
    print(f"rollbacks       {rankers['rollbacks']}")
    abandoned = rankers.get("abandoned") or []
    if abandoned:
        versions = ", ".join(f"v{entry.get('version')}" for entry in abandoned)
        print(f"abandoned       retrain {versions} (the daemon stopped while it ran; its "
              "artifacts were removed)")
    print(f"history         {len(history)} event(s), newest last")
    for entry in history[-20:]:
        print(f"  {_history_line(entry, rankers.get('unit', 'events'))}")


def _history_line(entry: dict[str, Any], unit: str = "events") -> str:
    """One history entry in words: a retrain's verdict, a rollout step, a rollback, a check;
    ``unit``: what a share is of (candidate mode: slots)."""
    kind = entry.get("rollout")
    who = f"{entry.get('ranker')} v{entry.get('ranker_version')}"
    if kind == "advanced":
        return f"rollout {who}: now {100 * float(entry.get('share', 0)):.0f} % of the {unit}"
    if kind == "replaced":
        return f"rollout {who}: ended, {entry.get('reason')}"
    if kind == "completed":
        return f"rollout {who}: complete, it serves all but the learner's holdback"
    if kind == "rolled_back":
        compared = entry.get("compared") or {}
        detail = "; ".join(f"{'learner' if v == '0' else 'v' + v} earned {c['mean']:.4f} "
                           f"[{c['low']:.4f}, {c['high']:.4f}] on {c['events']:,}"
                           for v, c in compared.items() if c.get("events"))
        return f"ROLLED BACK {who} ({entry.get('reason')}){': ' + detail if detail else ''}"
    if kind == "consistency":
        iv = entry.get("interval") or {}
        return (f"check {who}: earned {entry.get('realised', float('nan')):.4f} on "
                f"{entry.get('events', 0):,} {unit}, {entry.get('reason')} its off-policy "
                f"interval [{iv.get('low', float('nan')):.4f}, {iv.get('high', float('nan')):.4f}]")
    if "rolled_back" in entry:
        return f"rolled back {entry['rolled_back']} -> {entry.get('promoted_now') or 'learner'}"
    if "failed_in_serving" in entry:
        return (f"FAILED IN SERVING {Path(str(entry['failed_in_serving'])).name}: taken out "
                f"({entry.get('reason')})")
    verdict = f"PROMOTED {entry.get('ranker')}" if entry.get("promoted") else "none promoted"
    failed = entry.get("failed_rankers") or {}
    failures = "".join(f"; ranker {name} FAILED ({why})" for name, why in failed.items())
    return (f"retrain v{entry.get('version')}: {verdict} ({entry.get('reason')}){failures}"
            f"{_held_out_quality(entry)}")


def _held_out_quality(entry: dict[str, Any]) -> str:
    """'; held-out NDCG rankboost 0.7234, ...' for a retrain that measured its rankers on the
    logged slates (candidate mode), rounded to 4 decimals; '' otherwise."""
    rankers = entry.get("rankers")
    if not isinstance(rankers, dict):
        return ""
    shown = [f"{name} {info['ndcg']:.4f}" if isinstance(info.get("ndcg"), float)
             else f"{name} - (constant scores: the fit kept nothing)"
             for name, info in rankers.items()
             if isinstance(info, dict) and (isinstance(info.get("ndcg"), float)
                                            or info.get("degenerate"))]
    learner = (entry.get("learner") or {}).get("ndcg")
    if isinstance(learner, float):
        shown.append(f"the learner's slot order {learner:.4f}")
    return f"; held-out NDCG {', '.join(shown)}" if shown else ""


def _described_or_error(path: Path) -> dict[str, Any]:
    """``describe(path)``, or ``{"path", "error"}`` when that snapshot cannot be read."""
    try:
        return describe(path)
    except StateError as exc:
        return {"path": str(path), "error": str(exc)}


def _restorable(paths: list[Path]) -> list[dict[str, Any]]:
    """The newest snapshot that reads: the one ``serve`` restores, which falls back past a
    corrupt newest one (docs/daemon.md §4); the snapshots passed over are listed under
    ``skipped``. Only when none reads is it an error (the newest one's)."""
    skipped: list[dict[str, Any]] = []
    for path in reversed(paths):
        info = _described_or_error(path)
        if "error" not in info:
            return [{**info, "skipped": skipped} if skipped else info]
        skipped.append(info)
    if skipped:
        raise StateError(skipped[0]["error"])
    return []


def run(args: argparse.Namespace) -> int:
    if args.changelog is not None or args.path is None:
        if args.changelog is None or args.bootstrap is None or args.path is not None:
            raise ConfigError("inspect needs a PATH, or --changelog TOPIC with --bootstrap "
                              f"HOST:PORT. Got path {args.path!r}, --changelog "
                              f"{args.changelog!r}, --bootstrap {args.bootstrap!r}.")
        group = describe_changelog(args.bootstrap, args.changelog)
        if args.json:
            print(orjson.dumps(group, option=orjson.OPT_INDENT_2, default=_json_default).decode())
        else:
            print_group(group)
        return 0
    path = Path(args.path)
    if is_group_state(path) and not any(_CKPT.match(p.name) for p in path.iterdir()):
        group = describe_group(path)
        if args.json:
            print(orjson.dumps(group, option=orjson.OPT_INDENT_2, default=_json_default).decode())
        else:
            print_group(group)
        return 0
    rankers = describe_rankers(path / "rankers") if path.is_dir() else None
    if rankers is None and path.is_dir() and (path / "state.json").is_file():
        rankers = describe_rankers(path)  # the rankers directory itself
        paths: list[Path] = []
    else:
        paths = snapshots_in(path)
    infos = [_described_or_error(p) for p in paths] if args.all else _restorable(paths)
    if args.json:
        payload: Any = infos if args.all else (infos[0] if infos else {})
        if rankers is not None:
            payload = {"snapshots": infos, "rankers": rankers} if args.all else {
                **payload, "rankers": rankers}
        print(orjson.dumps(payload, option=orjson.OPT_INDENT_2, default=_json_default).decode())
    else:
        for i, info in enumerate(infos):
            if i:
                print()
            _print_text(info)
        if rankers is not None:
            print()
            _print_rankers(rankers)
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
