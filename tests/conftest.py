"""Suite-wide plugins: the Dynamo sweep (``dynamo_sweep.py``; ``-p no:dynamo_sweep`` turns it off)."""

from __future__ import annotations

import pytest

from dynamo_sweep import SweepPlugin


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SweepPlugin(), "dynamo_sweep")
