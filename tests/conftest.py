"""Test-suite settings: the ``slow`` marker.

Tests marked ``slow`` (several multi-process launches each, minutes on a 2-core machine: ``tests/test_multinode.py``)
run only with ``TRL_PADFREE_SLOW=1``; ``make test`` stays within about ten minutes without them, and ``.ci/run``
runs them after ``make test``.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: several multi-process launches; run with TRL_PADFREE_SLOW=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TRL_PADFREE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow (multi-process launches): run with TRL_PADFREE_SLOW=1, as .ci/run does")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
