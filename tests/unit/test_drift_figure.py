"""The drift table's recovery count (docs/results.md §6), on a constructed error sequence."""

from __future__ import annotations

import numpy as np

from simulators.drift_figure import AT, DriftRun


def test_events_to_recover_count_to_the_end_of_the_first_window_back_within_0_05() -> None:
    n = 54_960
    wrong = (np.arange(n) % 10 == 0).astype(float)  # 0.1 in every window aligned to 10
    wrong[AT:AT + 2_500] = 1.0  # every decision wrong for 2,500 events after the change
    row = DriftRun("x", wrong, np.full(n, 0.01), detections=1).row()
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "0.100"  # the pre-change error
    # windows start every 100 events from the change; the first one holding none of the
    # all-wrong run starts 2,500 events after it and ends 1,000 later
    assert cells[3] == "3,500"
    assert cells[4] == "1" and cells[5] == "0.0100 → 0.0100"


def test_a_learner_that_never_recovers_says_never() -> None:
    n = 54_960
    wrong = np.zeros(n)
    wrong[AT:] = 1.0
    assert "| never |" in DriftRun("x", wrong, np.zeros(n), detections=0).row()
