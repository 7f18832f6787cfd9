"""pytest plugin (entry point ``minihop``): the ``minihop_oracle`` fixture and ``--minihop-audit``.

Installed with the package; any project's tests can then ask for the fixture to compare their
own system's graphs or results with minihop's. minihop is imported only when the fixture is
used, so the plugin costs nothing to test suites that do not use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # for the annotations only: the plugin imports minihop when the fixture is used
    import torch.fx as fx

    from minihop import Capture, PairShape
    from minihop.testing import DynamoGraphs, EagerComparison


class MinihopOracle:
    """What the ``minihop_oracle`` fixture gives a test: minihop's public entry points and its
    testing helpers, as typed methods (an IDE completes them; each has the helper's docstring).
    minihop is imported when the fixture is first used."""

    def __init__(self) -> None:
        import minihop
        import minihop.ops
        import minihop.testing

        self._minihop = minihop
        self._testing = minihop.testing
        self._ops = minihop.ops

    def capture(self, fn_cls: type, /, *args: Any, **kwargs: Any) -> Capture:
        """``minihop.capture``: the consistent pair of ``fn_cls`` for arguments like ``args``."""
        return self._minihop.capture(fn_cls, *args, **kwargs)

    def apply(self, fn_cls: type, /, *args: Any, **kwargs: Any) -> Any:
        """``minihop.apply``: a drop-in for ``fn_cls.apply`` through minihop's guarded cache."""
        return self._minihop.apply(fn_cls, *args, **kwargs)

    def trace(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> fx.GraphModule:
        """``minihop.trace``: a function or module that applies Functions, as one GraphModule."""
        return self._minihop.trace(fn, *args, **kwargs)

    def load(self, path: str) -> Capture:
        """``minihop.load``: a capture saved with ``Capture.save``, runnable without its class."""
        return self._minihop.load(path)

    def check_consistent(self, fwd: fx.GraphModule | fx.Graph, bwd: fx.GraphModule | fx.Graph) -> PairShape:
        """``minihop.check_consistent``: the graph contract, on anyone's pair."""
        return self._minihop.check_consistent(fwd, bwd)

    def assert_matches_eager(self, fn_cls: type, *args: Any, **kwargs: Any) -> EagerComparison:
        """``minihop.testing.assert_matches_eager``: a capture against eager ``fn_cls.apply``."""
        __tracebackhide__ = True
        return self._testing.assert_matches_eager(fn_cls, *args, **kwargs)

    def assert_pair_matches_eager(self, fn_cls: type, args: tuple[Any, ...], fwd: fx.GraphModule | fx.Graph,
                                  bwd: fx.GraphModule | fx.Graph, **kwargs: Any) -> EagerComparison:
        """``minihop.testing.assert_pair_matches_eager``: another system's pair against eager."""
        __tracebackhide__ = True
        return self._testing.assert_pair_matches_eager(fn_cls, args, fwd, bwd, **kwargs)

    def assert_same_graph(self, a: fx.GraphModule | fx.Graph, b: fx.GraphModule | fx.Graph, *,
                          check_meta: bool = False, normalize: bool = False) -> None:
        """``minihop.testing.assert_same_graph``: the same program, up to node names."""
        __tracebackhide__ = True
        self._testing.assert_same_graph(a, b, check_meta=check_meta, normalize=normalize)

    def dynamo_graphs(self, fn_cls: type, *args: Any, **kwargs: Any) -> DynamoGraphs:
        """``minihop.testing.dynamo_graphs``: torch.compile's outer graph and bodies for the call."""
        return self._testing.dynamo_graphs(fn_cls, *args, **kwargs)

    def autograd_function_apply(self, fwd: Callable[..., Any], bwd: Callable[..., Any], *args: Any,
                                **kwargs: Any) -> tuple[Any, ...]:
        """``minihop.ops.autograd_function_apply``: any consistent pair as one differentiable op."""
        return self._ops.autograd_function_apply(fwd, bwd, *args, **kwargs)


@pytest.fixture
def minihop_oracle() -> MinihopOracle:
    """minihop's testing helpers as one typed object (see ``MinihopOracle``): ``capture``,
    ``apply``, ``trace``, ``load``, ``check_consistent``, ``assert_matches_eager``,
    ``assert_pair_matches_eager``, ``assert_same_graph``, ``dynamo_graphs`` and the standalone
    ``autograd_function_apply`` op."""
    return MinihopOracle()


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
