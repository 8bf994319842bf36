"""What ``simulators.bench_daemon`` sends through the broker: fixed-action instances or
candidate-set requests, with the bare relay's decoding and the caller's rewards for each.

* :func:`fixed_actions`: SynNonSep (d = 400, K = 9) instances, dense or sparse JSON;
  the relay turns ``x`` into a numpy row; a decision is rewarded when its action is
  the label.
* :func:`candidate_sets`: requests of N candidates with d_c = 45 dense features each
  (the shape of the OHSUMED candidate stream, as ``simulators.bench_loop --candidates``);
  the relay turns each request's candidates into one (N, 45) array; a decision is
  rewarded when its first placed candidate is the request's best under a fixed linear
  scorer (so the daemon has something to learn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

D_C = 45  # candidate mode: features per candidate


@dataclass(frozen=True)
class Workload:
    """One benchmark stream: the encoded instances and how each party handles them."""

    description: str
    keys: list[bytes]
    values: list[bytes]
    relay_decode: Callable[[Any], object]  # the bare relay's decode of one parsed event
    reward: Callable[[dict[str, Any]], float]  # the caller's reward for one decision
    serve_args: tuple[str, ...]  # the `serve` options that select the mode and learner

    def head(self, n: int) -> Workload:
        """The first n instances."""
        return Workload(self.description, self.keys[:n], self.values[:n], self.relay_decode,
                        self.reward, self.serve_args)


def decode_event(event: dict[str, Any]) -> np.ndarray:
    """The bare relay's decode of one parsed instance or candidate request: its features
    into numpy."""
    if "candidates" in event:
        return np.asarray([c["x"] for c in event["candidates"]], dtype=np.float64)
    return _row(event["x"])


def _row(x: Any) -> np.ndarray:
    """An instance's features as numpy: the dense row, or (sparse form) indices and values."""
    if isinstance(x, dict):
        return np.stack([np.asarray(x["idx"], dtype=np.float64),
                         np.asarray(x["val"], dtype=np.float64)])
    return np.asarray(x, dtype=np.float64)


def encode_instance(i: int, x: np.ndarray, label: int, form: str) -> bytes:
    if form == "sparse":
        nz = np.flatnonzero(x)
        return orjson.dumps({"id": f"e{i}", "x": {"idx": nz.tolist(), "val": x[nz].tolist()},
                             "label": label})
    return orjson.dumps({"id": f"e{i}", "x": x.tolist(), "label": label})


def fixed_actions(n: int, form: str, seed: int) -> Workload:
    from streamlearn.datasets.synthetic import synthetic_stream

    X, y = synthetic_stream(n, noise=0.05, seed=seed)
    values = [encode_instance(i, X[i], int(y[i]), form) for i in range(n)]
    return Workload(
        description=f"SynNonSep d=400 K=9, {form} JSON (~{len(values[0])} bytes/event)",
        keys=[f"e{i}".encode() for i in range(n)], values=values,
        relay_decode=decode_event,
        reward=lambda decision: float(decision["action"] == y[int(decision["id"][1:])]),
        serve_args=("--learner", "banditron", "--exploration", "fixed", "--gamma", "0.05"))


def candidate_sets(n: int, per_request: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    scorer = rng.standard_normal(D_C)
    keys, values, best = [], [], {}
    for i in range(n):
        items = np.round(rng.random((per_request, D_C)), 6)
        request = {"id": f"r{i}", "candidates": [{"id": f"doc-{i}-{k}", "x": x}
                                                 for k, x in enumerate(items.tolist())]}
        keys.append(f"r{i}".encode())
        values.append(orjson.dumps(request))
        best[f"r{i}"] = f"doc-{i}-{int(np.argmax(items @ scorer))}"
    return Workload(
        description=(f"candidate requests of {per_request} candidates x {D_C} dense features "
                     f"(~{len(values[0]) // 1000} KB/request)"),
        keys=keys, values=values,
        relay_decode=decode_event,
        reward=lambda decision: float(decision["candidates"][0]["id"] == best[decision["id"]]),
        serve_args=("--candidates-enabled", "true", "--candidates-shared-features", "0",
                    "--candidates-candidate-features", str(D_C),
                    "--candidates-max-candidates", str(max(per_request, 1000))))
