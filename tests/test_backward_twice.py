"""Differentiating a captured Function's outputs twice, against eager.

Issue 29: a second ``.backward()`` through the same outputs. With ``retain_graph=True`` the
grads accumulate as in eager whatever forward kept (ctx attributes, ``save_for_backward``,
``mark_dirty``, ``set_materialize_grads(False)`` with another None pattern the second time).
Without it, eager raises ("backward through the graph a second time") only when the user's
backward unpacks ``ctx.saved_tensors``: a backward reading ctx attributes only, or nothing at
all, runs again -- minihop's runtime read ``ctx.saved_tensors`` itself and raised there.

Each case runs eager ``F.apply``, strict ``minihop.function(F)``, ``fallback="eager"`` and
``minihop.apply`` on twin arguments over several sizes, comparing outputs, every ``.grad`` after
both backwards, and the error eager raises (type and message) where it raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop

SIZES = (3, 5, 7)
MODES = ("strict", "fallback", "apply")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.reset()


class CtxAttributes(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.x, ctx.w, ctx.h = x, w, x * w  # plain attributes: no saved-tensor bookkeeping
        return (x * w).sin()

    @staticmethod
    def backward(ctx, g):
        c = g * ctx.h.cos()
        return c * ctx.w, c * ctx.x


class SizeOnCtx(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.n = x.shape[0]
        return x * w.sum()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.n, torch.zeros(ctx.n).fill_(g.sum().item())


class NothingKept(Function):
    @staticmethod
    def forward(ctx, x, w):
        return x * 2 + w

    @staticmethod
    def backward(ctx, g):
        return g * 2, g


class Saved(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, g * x


class SavedAndAttribute(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x)
        ctx.w = w
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * ctx.w, g * x


class Dirty(Function):
    @staticmethod
    def forward(ctx, x, w):
        x.mul_(2)
        ctx.mark_dirty(x)
        ctx.save_for_backward(w)
        return x, x * w

    @staticmethod
    def backward(ctx, gx, gy):
        w, = ctx.saved_tensors
        return gx * 2 + gy * w * 2, None


class NotMaterialized(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, w)
        return x * w, x * 3

    @staticmethod
    def backward(ctx, ga, gb):
        x, w = ctx.saved_tensors
        gx = torch.zeros_like(x)
        gw = None
        if ga is not None:
            gx = gx + ga * w
            gw = ga * x
        if gb is not None:
            gx = gx + gb * 3
        return gx, gw


FUNCTIONS = [CtxAttributes, SizeOnCtx, NothingKept, Saved, SavedAndAttribute, Dirty, NotMaterialized]


def _runner(F: type, mode: str) -> Callable[..., Any]:
    if mode == "strict":
        return minihop.function(F)
    if mode == "fallback":
        return minihop.function(F, fallback="eager")
    return lambda *a: minihop.apply(F, *a)


def _twice(apply: Callable[..., Any], F: type, n: int, retain: bool) -> dict[str, Any]:
    """Forward once, backward twice (the second may raise, as eager's); what eager fixes."""
    gen = torch.Generator().manual_seed(n)
    x0 = torch.randn(n, requires_grad=True, generator=gen)
    w = torch.randn(n, requires_grad=True, generator=gen)
    x = x0.clone() if F is Dirty else x0  # mark_dirty writes into a non-leaf
    out = apply(x, w)
    outs = out if isinstance(out, tuple) else (out,)
    first = outs[0].sum() if F is NotMaterialized else sum(o.sum() for o in outs)
    second = sum(o.sum() for o in outs)  # NotMaterialized: another None pattern
    first.backward(retain_graph=retain)
    error = None
    try:
        second.backward() if F is not NotMaterialized or retain else outs[0].sum().backward()
    except RuntimeError as e:
        error = (type(e), str(e).split("\n")[0][:60])
    return {"outs": [o.detach().clone() for o in outs], "x": x0.grad, "w": w.grad, "error": error}


def _assert_same(mine: dict[str, Any], eager: dict[str, Any]) -> None:
    assert mine["error"] == eager["error"]
    torch.testing.assert_close(mine["outs"], eager["outs"])
    for name in ("x", "w"):
        assert (mine[name] is None) == (eager[name] is None), name
        if eager[name] is not None:
            torch.testing.assert_close(mine[name], eager[name])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("F", FUNCTIONS, ids=lambda F: F.__name__)
def test_retain_graph_twice_accumulates_as_eager(F: type, mode: str) -> None:
    run = _runner(F, mode)
    for n in SIZES:
        eager = _twice(F.apply, F, n, retain=True)
        assert eager["error"] is None
        _assert_same(_twice(run, F, n, retain=True), eager)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("F", FUNCTIONS, ids=lambda F: F.__name__)
def test_second_backward_without_retain_graph_as_eager(F: type, mode: str) -> None:
    """Eager raises only where its backward unpacks ctx.saved_tensors (or another node of the
    graph freed its saved values); otherwise the second backward accumulates again."""
    run = _runner(F, mode)
    for n in SIZES:
        _assert_same(_twice(run, F, n, retain=False), _twice(F.apply, F, n, retain=False))


def test_eager_cases_differ() -> None:
    """The cases above cover both of eager's answers to a second backward without retain_graph."""
    errors = {F.__name__: _twice(F.apply, F, 4, retain=False)["error"] is not None for F in FUNCTIONS}
    assert not errors["CtxAttributes"] and not errors["NothingKept"] and not errors["SizeOnCtx"]
    assert errors["Saved"] and errors["SavedAndAttribute"]
