"""pytest plugin (entry point ``minihop``): the ``minihop_oracle`` fixture and ``--minihop-audit``.

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


# --- ``--minihop-audit`` (docs/audit.md; the logic is minihop/audit/) -----------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("minihop", "minihop audit of autograd.Functions (docs/audit.md)")
    group.addoption("--minihop-audit", nargs="?", const="minihop", default=None, choices=("minihop", "dynamo"),
                    help="check every autograd.Function the suite applies against eager, with minihop "
                         "(and with =dynamo also torch.compile(fullgraph=True)), after the last test")
    group.addoption("--minihop-audit-report", default=None, metavar="PATH",
                    help="write the audit's records as JSON to PATH (and a Markdown table beside it)")
    group.addoption("--minihop-audit-signatures", type=int, default=3, metavar="N",
                    help="argument signatures audited per Function where an input requires grad "
                         "(default 3), plus one where none does")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("minihop_audit", None):
        from minihop.audit.plugin import AuditPlugin  # only a suite that asks imports the audit

        config.pluginmanager.register(AuditPlugin(config), "minihop_audit")
