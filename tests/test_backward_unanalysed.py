"""Code minihop did not analyse, run by backward, reading what changes before ``.backward()``.

A callback forward keeps on ctx (out of a list passed in), functions a backward folds over with
``functools.reduce``, maps over from an object's dict or hands to ``pytree.tree_map``, a method
set on ``torch.Tensor``: the code runs where the bytecode chains do not follow it, so its reads
are unknown (the capture is single-use), and what it reads may change between forward and
``.backward()`` (here a global the callback multiplies by). Eager's backward reads it then.
Before round 8 the capture's backward, traced with forward, ran with the value seen then, in
strict and apply mode; now a backward that ran such code is traced again when it runs
(``tracer/pystate.finish``: a backward read no value matches, ``spec.UNMATCHED``).

Each runs against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.utils._pytree as pytree

import minihop
from eager_modes import matches_eager

K = [2.0]


def callback(g):
    return g * K[0]


def set_k(v):
    K[0] = v


FNS = [callback]


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


class CallbackOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cbs):
        ctx.cb = cbs[0]
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return ctx.cb(g), None


class Folds(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return functools.reduce(lambda acc, f: f(acc), FNS, g)


class Holder:
    def __init__(self):
        self.fns = {"a": callback}


class MapsOverHolder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h):
        ctx.h = h
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return list(map(lambda f: f(g), ctx.h.fns.values()))[0], None


class TreeMaps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fns):
        ctx.fns = fns
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return pytree.tree_map(lambda f: f(g), ctx.fns)["a"], None


HOLDER = Holder()
CASES = {
    "callback on ctx": (CallbackOnCtx, lambda i: (x_(i), [callback])),
    "functools.reduce": (Folds, lambda i: (x_(i),)),
    "map over an object's dict": (MapsOverHolder, lambda i: (x_(i), HOLDER)),
    "pytree.tree_map": (TreeMaps, lambda i: (x_(i), {"a": callback})),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_changed_before_backward(name) -> None:
    fn, make_args = CASES[name]
    matches_eager(fn, make_args, between=lambda i: set_k(2.0), mid=lambda i: set_k(3.0 + i),
                  reset=lambda: set_k(2.0))


def test_tensor_method_rebound_before_backward() -> None:
    """``torch.Tensor.scale_k`` rebound between forward and ``.backward()``."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.scale_k()

    def mid(i):
        torch.Tensor.scale_k = lambda self: self * (3 + i)

    try:
        matches_eager(F, lambda i: (x_(i),), between=lambda i: setattr(torch.Tensor, "scale_k", lambda self: self * 2),
                      mid=mid)
    finally:
        del torch.Tensor.scale_k


def test_explain_names_the_retrace() -> None:
    """``explain`` lists backward's unknown read beside the single-use reason."""
    text = str(minihop.explain(CallbackOnCtx, x_(0), [callback]))
    assert "single-use" in text and "callback" in text, text
    assert "backward ran code minihop did not analyse: traced again each time backward runs" in text, text
