"""Double backward through a recomputing backward: ``autograd.grad(..., create_graph=True)`` and
``backward(create_graph=True)`` inside a Function's backward, against eager (issue 31).

The bwd graph holds the recomputation and its differentiation with ``create_graph=True``, so
the gradients it returns keep their graph; ``backward(create_graph=True)`` accumulates ``.grad``
as eager's ``AccumulateGrad`` does with grad mode on (a copy keeping the graph, then ``+``).
Each case compares with eager ``F.apply``: first-order grads (taken with ``create_graph`` and
``grad_outputs`` that require grad, so the second derivative flows through backward's ``g``),
whether they require grad, second derivatives with respect to the inputs and to those
``grad_outputs``, and the plain ``.grad`` -- in strict, ``fallback="eager"`` and ``minihop.apply``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop

SIZES = (3, 5)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.reset()


class RecomputeGradCreateGraph(Function):
    """Recompute on detached inputs, differentiate with create_graph=True, return the result."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.tanh(x * w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            wd = w.detach().requires_grad_()
            out = torch.tanh(xd * wd)
            gx, gw = torch.autograd.grad(out, (xd, wd), g, create_graph=True)
        return gx, gw


class RecomputeBackwardCreateGraph(Function):
    """backward(create_graph=True) into detached leaves, returning their .grad."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.sin() * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            wd = w.detach().requires_grad_()
            torch.autograd.backward(xd.sin() * wd, g, create_graph=True)
        return xd.grad, wd.grad


class GradOfSavedInputs(Function):
    """autograd.grad with create_graph=True over the saved inputs themselves (not detached):
    the second derivative reaches the caller's inputs, as in eager."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.tanh(x * w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            out = torch.tanh(x * w)
            gx, gw = torch.autograd.grad(out, (x, w), g, create_graph=True)
        return gx, gw


FUNCTIONS = [RecomputeGradCreateGraph, RecomputeBackwardCreateGraph, GradOfSavedInputs]


def _derivatives(apply: Callable[..., Any], n: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(n)
    x, w, v = (torch.randn(n, dtype=torch.double, generator=gen, requires_grad=True) for _ in range(3))
    out = apply(x, w)
    firsts = torch.autograd.grad(out, (x, w), v, create_graph=True)
    differentiable = [f.requires_grad for f in firsts]
    total = sum((f * f).sum() for f in firsts if f.requires_grad)
    seconds = torch.autograd.grad(total, (x, w, v), allow_unused=True) if any(differentiable) else None
    xp, wp = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    apply(xp, wp).sum().backward()
    return {"out": out.detach(), "firsts": [f.detach() for f in firsts], "differentiable": differentiable,
            "seconds": seconds, "plain": (xp.grad, wp.grad)}


def _assert_same(mine: dict[str, Any], eager: dict[str, Any]) -> None:
    assert mine["differentiable"] == eager["differentiable"]
    torch.testing.assert_close(mine["out"], eager["out"])
    torch.testing.assert_close(mine["firsts"], eager["firsts"])
    torch.testing.assert_close(mine["plain"], eager["plain"])
    assert (mine["seconds"] is None) == (eager["seconds"] is None)
    for m, e in zip(mine["seconds"] or (), eager["seconds"] or (), strict=True):
        assert (m is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(m, e)


@pytest.mark.parametrize("mode", ["strict", "fallback", "apply"])
@pytest.mark.parametrize("F", FUNCTIONS, ids=lambda F: F.__name__)
def test_double_backward_through_recomputation(F: type, mode: str) -> None:
    run = {"strict": minihop.function(F), "fallback": minihop.function(F, fallback="eager"),
           "apply": lambda *a: minihop.apply(F, *a)}[mode]
    for n in SIZES:
        eager = _derivatives(F.apply, n)
        assert eager["seconds"] is not None  # each case has a second derivative to compare
        _assert_same(_derivatives(run, n), eager)
    if mode == "strict":
        assert run.stats.eager_calls == 0


def test_backward_create_graph_keeps_grad_graph() -> None:
    """``.grad`` written by backward(create_graph=True) inside the capture has a graph, as
    eager's (the bwd graph's accumulate_grad node is told so)."""
    x = torch.randn(4, requires_grad=True)
    cap = minihop.capture(RecomputeBackwardCreateGraph, x, torch.randn(4, requires_grad=True))
    assert "create_graph = True" in cap.bwd.code
