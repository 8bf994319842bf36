"""The conservative rollout's floor: the rule on its own, and the simulator's core on letter.

``simulators.conservative_floor`` runs the daemon's :class:`Adoption` and :class:`Engine`
on worlds whose every reward is known; here a few fixed seeds of short runs check that
the live reward never falls below (1 − α) × the baseline's on the same events and that
the learner takes the traffic from a poor baseline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulators.conservative_floor import make_world, run, summarise
from streamlearn.engine import BASELINE
from streamlearn.service.adoption import Adoption, AdoptionSettings

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
needs_data = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"real-data test: the shared data folder {SHARED} is absent")


def _feed(adoption: Adoption, rng: np.random.Generator, base_mean: float, learner_mean: float,
          batches: int, batch: int = 32) -> tuple[float, float]:
    """Serve ``batches`` batches at the adoption's share (the draw of the engine's mixture),
    rewards Bernoulli; return (live, the baseline's own) cumulative rewards."""
    live = base = 0.0
    for _ in range(batches):
        learner = rng.random(batch) < adoption.share
        b = (rng.random(batch) < base_mean).astype(float)
        r = np.where(learner, (rng.random(batch) < learner_mean).astype(float), b)
        live, base = live + r.sum(), base + b.sum()
        adoption.observe(np.where(learner, 0, BASELINE), r, np.zeros(batch, np.int64), batch)
    return live, base


def test_poor_baseline_gives_way_and_a_poor_learner_gets_little() -> None:
    """A baseline earning 0.04 (its upper bound stays more than α × its mean above it for
    long: the form of the rule that charged the baseline's own events with its upper bound
    never gave the learner any traffic) gives way to a learner earning 0.5; a learner
    earning nothing is held to a small share and the floor holds."""
    rng = np.random.default_rng(3)
    good = Adoption(AdoptionSettings(mode="conservative"))
    live, base = _feed(good, rng, 0.04, 0.5, 400)
    assert good.share == 1.0 and live >= 0.95 * base and good.slack > 0
    bad = Adoption(AdoptionSettings(mode="conservative"))
    live, base = _feed(bad, rng, 0.7, 0.0, 400)
    assert bad.share < 0.1 and live >= 0.95 * base
    assert 0.0 < bad.stats["learner"].n < 0.05 * 400 * 32


def test_share_is_zero_until_the_baseline_is_measured_and_slack_needs_it() -> None:
    adoption = Adoption(AdoptionSettings(mode="conservative"))
    assert adoption.conservative_share(100) == 0.0 and adoption.slack == 0.0
    adoption.observe(np.full(64, BASELINE), np.ones(64), np.zeros(64, np.int64), 64)
    assert adoption.slack > 0 and 0.0 <= adoption.conservative_share(64) <= 1.0


@needs_data
def test_floor_holds_and_the_learner_takes_over_from_a_poor_baseline() -> None:
    """Short runs of the simulator's core: three seeds of world (b) and two of world (a);
    the floor holds at every batch end and in world (b) the learner ends with the traffic."""
    poor = [run(make_world("poor-baseline", seed, 8000), "conservative", seed)
            for seed in (0, 3, 9)]
    good = [run(make_world("good-baseline", seed, 3000), "conservative", seed)
            for seed in (1, 2)]
    for r in poor + good:
        assert r.batch_violations == 0 and not r.violated(0.05)
    assert all(r.share[-1] >= 0.9 for r in poor)
    assert all(r.served[-1] >= 0.8 for r in poor)  # the draw follows the share
    assert all(0.0 < max(r.share) < 0.9 for r in good)  # a poor learner gets a little
    summary = summarise([{"conservative": r.as_dict(), "online": r.as_dict()} for r in poor],
                        0.05)
    assert summary["violated"] == 0.0 and summary["reached_full"] == 1.0
    assert summary["reward_conservative"] > 1.5 * summary["reward_baseline"]
