"""pytest plugin (entry point ``minihop``): the ``minihop_oracle`` fixture.

Installed with the package; any project's tests can then ask for the fixture to compare their
own system's graphs or results with minihop's. minihop is imported only when the fixture is
used, so the plugin costs nothing to test suites that do not use it.
"""

from __future__ import annotations

import types
from typing import Any

import pytest


@pytest.fixture
def minihop_oracle() -> Any:
    """minihop's testing helpers: capture, check_consistent, assert_matches_eager,
    assert_same_graph, dynamo_graphs and the standalone ``autograd_function_apply`` op."""
    import minihop
    import minihop.ops
    import minihop.testing

    return types.SimpleNamespace(
        capture=minihop.capture,
        check_consistent=minihop.check_consistent,
        assert_matches_eager=minihop.testing.assert_matches_eager,
        assert_same_graph=minihop.testing.assert_same_graph,
        dynamo_graphs=minihop.testing.dynamo_graphs,
        autograd_function_apply=minihop.ops.autograd_function_apply,
    )
