"""Suite-wide pytest hooks.

``@pytest.mark.needs_data`` marks tests that read the real datasets of
``../shared/datasets`` (present beside the repository in development and CI):
where that folder is absent — e.g. a clone in a bare temporary directory — they
are skipped with the reason, never failed.

Property tests (hypothesis) run a fixed, derandomised set of examples, so a run of the
suite is a pure function of the code: CI cannot pass on one run and fail on the next.
``STREAMLEARN_HYPOTHESIS=explore`` draws fresh random examples instead (add
``--hypothesis-seed N`` to repeat one such run), the way to hunt for new failures.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from streamlearn.datasets.base import SHARED_DATA_DIR

settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("STREAMLEARN_HYPOTHESIS") == "explore" else "fixed")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_data: reads the real datasets in ../shared/datasets")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if SHARED_DATA_DIR.is_dir():
        return
    skip = pytest.mark.skip(reason=f"real-data test: the shared data folder {SHARED_DATA_DIR} is absent")
    for item in items:
        if item.get_closest_marker("needs_data"):
            item.add_marker(skip)
