"""The runtime's code emitter (``minihop.runtime.codegen.emit``) computes what fx's own
GraphModule code computes, for the argument forms minihop's graphs contain; and it declines
(returns None) what it does not handle, so the caller falls back on a GraphModule."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from minihop.runtime.codegen import emit


def graph_of(fn: Any) -> fx.Graph:
    return fx.symbolic_trace(fn).graph


def same_as_fx(fn: Any, *args: Any) -> None:
    gm = fx.symbolic_trace(fn)
    code = emit(gm.graph)
    assert code is not None
    torch.testing.assert_close(code(*args), gm(*args))


def test_arithmetic_indexing_and_methods() -> None:
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    same_as_fx(lambda a, b: (a + b * 2 - a / 3, (-a)[1:, ::2], (a @ b.t()).sum(dim=1, keepdim=True)), x, y)


def test_constants_by_reference() -> None:
    """inf, dtypes, devices, slices and Ellipsis are passed as objects, not re-parsed."""
    x = torch.randn(3, 4)
    same_as_fx(lambda a: (a.clamp(max=float("inf"), min=-float("inf")), a.to(torch.float64),
                          a.to(torch.device("cpu")), a[..., 1:3]), x)


def test_lists_dicts_and_keywords() -> None:
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    same_as_fx(lambda a, b: torch.cat([a, b, a], dim=0).split([2, 4], dim=0), x, y)
    same_as_fx(lambda a, b: torch.stack((a, b)).transpose(0, 1).reshape(-1), x, y)


def test_statement_without_users_and_skip() -> None:
    """A node nobody reads still runs (in-place write); skipped nodes do not."""
    graph = fx.Graph()
    a = graph.placeholder("a")
    graph.call_method("add_", (a, 1.0))
    toggle = graph.call_function(torch._C._set_grad_enabled, (False,))
    out = graph.call_function(operator.mul, (a, 2))
    graph.output((out,))
    code = emit(graph, skip=lambda node: node is toggle)
    assert code is not None
    t = torch.zeros(3)
    with torch.enable_grad():
        (result,) = code(t)
        assert torch.is_grad_enabled()  # the toggle was skipped
    torch.testing.assert_close(t, torch.ones(3))
    torch.testing.assert_close(result, torch.full((3,), 2.0))


def test_declines_get_attr() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w

    assert emit(fx.symbolic_trace(M()).graph) is None
