"""Custom collectors read at scrape time (used by :class:`~streamlearn.service.metrics.PrometheusObserver`).

* :class:`ArrayHistogram` — a histogram fed whole numpy arrays (one
  ``searchsorted`` + ``bincount`` per batch instead of one ``observe`` per event);
* :class:`ActionCollector` — per-action counters with a bounded label set;
* :class:`CheckpointAge` — seconds since the last checkpoint, computed when scraped.

Each holds a lock: the daemon thread writes while the HTTP thread scrapes.

>>> h = ArrayHistogram("demo_seconds", "demo", (0.1, 1.0))
>>> h.observe(np.array([0.05, 0.5, 0.5, 7.0]))
>>> [(s.labels.get("le"), s.value) for s in next(iter(h.collect())).samples][:3]
[('0.1', 1.0), ('1.0', 3.0), ('+Inf', 4.0)]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["ActionCollector", "ArrayHistogram", "CheckpointAge"]


def _as_array(values: np.ndarray | float | Sequence[float]) -> np.ndarray:
    return np.atleast_1d(np.asarray(values, dtype=np.float64)).reshape(-1)


class ArrayHistogram(Collector):
    """A histogram of durations fed whole arrays at once (vectorised), exposed at scrape time.

    A value below 0 counts as 0: the durations observed here (a decision's latency from its
    record timestamp, a feedback's delay from its decision) span two machines' clocks, and
    Prometheus reads ``_sum`` as a counter, which a negative observation would make fall
    (an outside test: ``_sum`` at -1.8e9 after one feedback stamped ``ts`` 0).

    >>> h = ArrayHistogram("skew_seconds", "demo", (0.1,))
    >>> h.observe(np.array([-5.0, 0.05])); h._sum, h._counts.tolist()
    (0.05, [2, 0])
    """

    def __init__(self, name: str, documentation: str, buckets: Iterable[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(sorted(float(b) for b in buckets), dtype=np.float64)
        self._counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # last one: +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, values: np.ndarray | float | Sequence[float]) -> None:
        v = _as_array(values)
        v = np.maximum(v[np.isfinite(v)], 0.0)
        if v.size == 0:
            return
        # bucket i counts v <= bounds[i] (Prometheus "le" is inclusive)
        binned = np.bincount(np.searchsorted(self.bounds, v, side="left"),
                             minlength=len(self._counts))
        with self._lock:
            self._counts += binned
            self._sum += float(v.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative = np.cumsum(self._counts)
            total = self._sum
        buckets = [(_le(b), float(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)]
        buckets.append(("+Inf", float(cumulative[-1])))
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], buckets, total)
        yield family


def _le(bound: float) -> str:
    return repr(float(bound))


class ActionCollector(Collector):
    """Per-action decision and reward counters, bounded to ``max_actions`` label values."""

    def __init__(self, max_actions: int = 64) -> None:
        if max_actions < 1:
            raise ValueError(f"max_actions must be >= 1. Got {max_actions}.")
        self.max_actions = max_actions
        self._decisions = np.zeros(max_actions + 1, dtype=np.int64)  # last slot: "other"
        self._rewards = np.zeros(max_actions + 1, dtype=np.float64)
        self._lock = threading.Lock()

    def _slots(self, actions: np.ndarray) -> np.ndarray:
        a = np.asarray(actions, dtype=np.int64).reshape(-1)
        return np.where((a >= 0) & (a < self.max_actions), a, self.max_actions)

    def add_decisions(self, actions: np.ndarray) -> None:
        counts = np.bincount(self._slots(actions), minlength=self.max_actions + 1)
        with self._lock:
            self._decisions += counts

    def add_rewards(self, actions: np.ndarray, rewards: np.ndarray) -> None:
        sums = np.bincount(self._slots(actions), weights=_as_array(rewards),
                           minlength=self.max_actions + 1)
        with self._lock:
            self._rewards += sums

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            decisions, rewards = self._decisions.copy(), self._rewards.copy()
        seen = np.flatnonzero((decisions > 0) | (rewards > 0))  # only actions ever used
        dec = CounterMetricFamily("streamlearn_action_decisions",
                                  "Decisions per chosen action.", labels=["action"])
        rew = CounterMetricFamily("streamlearn_action_rewards",
                                  "Rewards per chosen action (joined feedback).", labels=["action"])
        for slot in seen:
            label = "other" if slot == self.max_actions else str(int(slot))
            dec.add_metric([label], float(decisions[slot]))
            rew.add_metric([label], float(rewards[slot]))
        yield dec
        yield rew


class CheckpointAge(Collector):
    """Seconds since the last checkpoint (since start before the first one), read at scrape."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.last = float(clock())

    def collect(self) -> Iterator[Metric]:
        now = float(self._clock())
        yield GaugeMetricFamily("streamlearn_checkpoint_age_seconds",
                                "Seconds since the last completed checkpoint "
                                "(since process start before the first one).",
                                value=max(0.0, now - self.last))
