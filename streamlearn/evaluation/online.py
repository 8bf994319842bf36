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

from streamlearn.features import row_starts

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
        B = len(chosen)
        if rewards is None:
            if labels is None:
                raise ValueError("observe needs rewards or labels.")
            hits = chosen == labels
            rewards = hits.astype(float)
            losses = 1.0 - rewards
            self.mistakes += B - int(np.count_nonzero(hits))  # exact: the losses are 0 or 1
        else:
            rewards = np.asarray(rewards, dtype=float)
            losses = 1.0 - rewards
            self.mistakes += float(losses.sum())
        self.rounds += B
        self._remember(losses)
        if probs is not None:
            exploit = probs.argmax(axis=1)
            at_exploit = row_starts(*probs.shape) + exploit
            values = rewards * (chosen == exploit) / probs.take(at_exploit)
            self._exploit_value_sum += float(values.sum())
            self._exploit_value_rounds += B
            if labels is not None:  # rows with label -1 (unknown) are left out
                labels = np.asarray(labels)
                if B and labels.min() >= 0:
                    self.exploit_mistakes += int(np.count_nonzero(exploit != labels))
                    self.labelled_rounds += B
                else:
                    known = labels >= 0
                    self.exploit_mistakes += int(np.count_nonzero((exploit != labels) & known))
                    self.labelled_rounds += int(np.count_nonzero(known))

    def _remember(self, losses: np.ndarray) -> None:
        """Write the batch's last ``window`` losses into the ring (at most two slices)."""
        tail = losses[-self.window:]
        n = len(tail)
        start = (self._ring_pos + len(losses) - n) % self.window
        first = min(n, self.window - start)
        self._ring[start:start + first] = tail[:first]
        self._ring[:n - first] = tail[first:]
        self._ring_pos += len(losses)

    @property
    def error_rate(self) -> float:
        return self.mistakes / self.rounds if self.rounds else 0.0

    def _window_losses(self) -> tuple[float, int]:
        """(Σ losses, events) over the last ``window`` events."""
        n = min(self._ring_pos, self.window)
        return float(self._ring[:n].sum()), n

    @property
    def window_error_rate(self) -> float:
        losses, n = self._window_losses()
        return losses / n if n else 0.0  # = mean(), without its overhead

    @property
    def exploit_error_rate(self) -> float:
        return self.exploit_mistakes / self.labelled_rounds if self.labelled_rounds else float("nan")

    @property
    def exploit_error_estimate(self) -> float:
        if not self._exploit_value_rounds:
            return float("nan")
        return 1.0 - self._exploit_value_sum / self._exploit_value_rounds

    @staticmethod
    def combined(trackers: list[OnlineErrorTracker]) -> tuple[float, float, float]:
        """(error rate, window error rate, exploit-error estimate) over several trackers'
        events together, e.g. the partitions one replica serves: each rate's numerator and
        denominator summed (the window: each tracker's last ``window`` events)."""
        rounds = sum(t.rounds for t in trackers)
        windows = [t._window_losses() for t in trackers]
        in_window = sum(n for _, n in windows)
        valued = sum(t._exploit_value_rounds for t in trackers)
        return (sum(t.mistakes for t in trackers) / rounds if rounds else 0.0,
                sum(losses for losses, _ in windows) / in_window if in_window else 0.0,
                1.0 - sum(t._exploit_value_sum for t in trackers) / valued if valued
                else float("nan"))

    @property
    def regret_vs_oracle(self) -> float:
        """Regret against an oracle that always plays a reward-1 action: the mistakes M."""
        return self.mistakes
