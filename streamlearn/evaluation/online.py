"""Online trackers: cumulative and sliding-window error, exploit-error estimate, regret.

The tracker works from what a bandit sees (reward of the chosen action) and,
when labels are known (simulators), from the labels too.

* ``error_rate`` — mistakes of the *played* actions, M/T (= regret vs the oracle / T).
* ``exploit_error_rate`` — mistakes of the exploit action ŷ (exact, needs labels).
* ``exploit_error_estimate`` — unbiased estimate of the same from bandit feedback only:
  1 − mean(r·1[ỹ=ŷ]/P(ŷ)).
* ``window_error_rate`` — played-action error over the last ``window`` events.

>>> t = OnlineErrorTracker(window=2)
>>> t.observe(chosen=np.array([0, 1, 1]), rewards=np.array([1.0, 0.0, 1.0]))
>>> t.rounds, round(t.error_rate, 3), t.window_error_rate
(3, 0.333, 0.5)
"""

from __future__ import annotations

import numpy as np

__all__ = ["OnlineErrorTracker"]


class OnlineErrorTracker:
    """Cumulative and windowed error/regret counters, updated a batch at a time."""

    def __init__(self, window: int = 1000) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1. Got {window}.")
        self.window = window
        self.rounds = 0
        self.mistakes = 0.0  # Σ (1 − reward of the played action)
        self.exploit_mistakes = 0  # Σ 1[ŷ ≠ y], labels known
        self.labelled_rounds = 0
        self._exploit_value_sum = 0.0  # Σ r·1[ỹ=ŷ]/P(ŷ)
        self._exploit_value_rounds = 0
        self._ring = np.zeros(window)
        self._ring_pos = 0

    def observe(
        self,
        chosen: np.ndarray,
        rewards: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        probs: np.ndarray | None = None,
    ) -> None:
        """Record a batch: played actions with their rewards (or labels, which imply them).

        ``probs`` (the logged (B, K) distributions) enables the exploit-error estimate
        and, with labels, the exact exploit error.
        """
        chosen = np.asarray(chosen)
        if rewards is None:
            if labels is None:
                raise ValueError("observe needs rewards or labels.")
            rewards = (chosen == labels).astype(float)
        losses = 1.0 - np.asarray(rewards, dtype=float)
        B = len(chosen)
        self.rounds += B
        self.mistakes += float(losses.sum())
        tail = losses[-self.window:]
        positions = (self._ring_pos + B - len(tail) + np.arange(len(tail))) % self.window
        self._ring[positions] = tail
        self._ring_pos += B
        if probs is not None:
            exploit = np.argmax(probs, axis=1)
            rows = np.arange(B)
            values = np.asarray(rewards) * (chosen == exploit) / probs[rows, exploit]
            self._exploit_value_sum += float(values.sum())
            self._exploit_value_rounds += B
            if labels is not None:  # rows with label -1 (unknown) are left out
                known = np.asarray(labels) >= 0
                self.exploit_mistakes += int(((exploit != labels) & known).sum())
                self.labelled_rounds += int(known.sum())

    @property
    def error_rate(self) -> float:
        return self.mistakes / self.rounds if self.rounds else 0.0

    @property
    def window_error_rate(self) -> float:
        n = min(self._ring_pos, self.window)
        return float(self._ring[:n].mean()) if n else 0.0

    @property
    def exploit_error_rate(self) -> float:
        return self.exploit_mistakes / self.labelled_rounds if self.labelled_rounds else float("nan")

    @property
    def exploit_error_estimate(self) -> float:
        if not self._exploit_value_rounds:
            return float("nan")
        return 1.0 - self._exploit_value_sum / self._exploit_value_rounds

    @property
    def regret_vs_oracle(self) -> float:
        """Regret against an oracle that always plays a reward-1 action: the mistakes M."""
        return self.mistakes
