"""The periodic progress line of ``serve`` and ``simulate``: each label before its number.

::

       10.0s  events      52,224     5,204/s  cum-error 0.1994  ewma-error 0.1412  γ 0.0500  ...

``cum-error`` is the error rate over every round learned so far;
``ewma-error`` weighs recent rounds more, with a half-life of
:data:`EWMA_HALF_LIFE_ROUNDS` rounds: it follows the learning curve without
the noise of a 1,000-round window (±0.01 at an error of 0.1) and without the
lag of the cumulative rate. Both are computed from cumulative counts (rounds,
mistakes) read at each line, so the caller only keeps counters. A value not
known yet (no round learned, no decision made) is shown as ``–``, never as 0.

>>> clock = iter([0.0, 10.0, 20.0]).__next__
>>> p = ProgressLine(clock=clock)
>>> p.line(events=0, rounds=0, mistakes=0)
'   10.0s  events           0         0/s  cum-error –  ewma-error –'
>>> p.line(events=1000, rounds=1000, mistakes=200, extra=[("γ", "0.0500")])
'   20.0s  events       1,000       100/s  cum-error 0.2000  ewma-error 0.2000  γ 0.0500'
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

__all__ = ["EWMA_HALF_LIFE_ROUNDS", "ErrorEwma", "ProgressLine", "number_or_dash"]

#: Half-life, in learned rounds, of the exponentially weighted error rate of the progress line.
EWMA_HALF_LIFE_ROUNDS = 10_000


def number_or_dash(value: float | None, fmt: str = ".4f") -> str:
    """``value`` formatted, or ``–`` when it is unknown (None or NaN)."""
    return "–" if value is None or math.isnan(value) else format(value, fmt)


class ErrorEwma:
    """Exponentially weighted error rate over rounds, fed with cumulative counts.

    Round ``t`` back has weight ``λ**t`` with ``λ = 2**(-1 / half_life)``. The
    rounds between two updates are taken to have their mistakes spread evenly
    (exact when updated every round). The weights are normalised, so the first
    value is the plain error rate of the first rounds rather than a value
    biased towards 0.

    >>> e = ErrorEwma(half_life=10)
    >>> e.update(rounds=10, mistakes=5)
    0.5
    >>> round(e.update(rounds=20, mistakes=5), 4)  # ten error-free rounds halve the old weight
    0.1667
    """

    def __init__(self, half_life: float = EWMA_HALF_LIFE_ROUNDS) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0. Got {half_life}.")
        self.decay = 2.0 ** (-1.0 / half_life)
        self._weighted_mistakes = 0.0
        self._weight = 0.0
        self._rounds = 0.0
        self._mistakes = 0.0

    @property
    def value(self) -> float:
        """The current rate; NaN before any round."""
        return self._weighted_mistakes / self._weight if self._weight > 0 else math.nan

    def update(self, rounds: float, mistakes: float) -> float:
        """Take the new cumulative counts into account and return :attr:`value`."""
        n, m = rounds - self._rounds, mistakes - self._mistakes
        if n > 0:
            old = self.decay ** n
            # total weight of n evenly spread new rounds: Σ_{t<n} λ**t
            new = (1.0 - old) / (1.0 - self.decay)
            self._weighted_mistakes = old * self._weighted_mistakes + new * (m / n)
            self._weight = old * self._weight + new
        self._rounds, self._mistakes = rounds, mistakes
        return self.value


class ProgressLine:
    """Formats one progress line from cumulative counts; keeps the rate and the EWMA between lines."""

    def __init__(self, noun: str = "events", half_life: float = EWMA_HALF_LIFE_ROUNDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.noun = noun
        self.clock = clock
        self.started = self._last_t = clock()
        self._last_events = 0.0
        self.ewma = ErrorEwma(half_life)

    def line(self, events: float, rounds: float, mistakes: float,
             extra: Sequence[tuple[str, str]] = (), cumulative: float | None = None,
             of: str = "") -> str:
        """``events`` seen; ``rounds`` learned with ``mistakes``; ``extra`` (label, text) pairs.

        ``cumulative`` overrides mistakes / rounds (e.g. a rate restored from a checkpoint).
        ``of`` qualifies the error labels (``"published"``: ``published cum-error``, when
        what was published is not the learner's choice alone).
        """
        now = self.clock()
        rate = (events - self._last_events) / max(now - self._last_t, 1e-9)
        self._last_events, self._last_t = events, now
        if cumulative is None:
            cumulative = mistakes / rounds if rounds > 0 else math.nan
        ewma = self.ewma.update(rounds, mistakes)
        of = f"{of} " if of else ""
        parts = [f"{now - self.started:7.1f}s", f"{self.noun} {events:>11,.0f}", f"{rate:>8,.0f}/s",
                 f"{of}cum-error {number_or_dash(cumulative)}",
                 f"{of}ewma-error {number_or_dash(ewma)}"]
        parts += [f"{label} {text}" for label, text in extra]
        return "  ".join(parts)
