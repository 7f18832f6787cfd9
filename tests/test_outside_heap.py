"""Tensors forward puts outside its return value, found by the one heap watch.

``tracer/outside.py`` keeps no snapshot of its own: it takes its share of the heap watch's one
diff (``heap.changes``), so every holder the heap watch knows is a place a tensor can be put
and found again — not only the lists, dicts and plain objects a second walk used to know.
Each case was a silent difference from eager, or a refusal, before the two were one: a
tensor's attribute set by backward, an attribute set on a global tensor (the fake stayed
there), a tensor put into a deque, a ``UserDict``, a global ``nn.Module``, a dict inside a tuple.
Each runs against eager in strict, apply and fallback mode (``eager_modes.matches_eager``),
with the holder's state compared after every forward and backward.
"""

from __future__ import annotations

import collections

import pytest
import torch

from eager_modes import matches_eager


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1.0, 1.0, 6) + i).requires_grad_()


def _detached(v):
    return v.detach() if isinstance(v, torch.Tensor) else v


def test_backward_sets_an_attribute_on_a_saved_input() -> None:
    """``x._seen_by_backward = n``: eager sets it on the caller's tensor on every backward."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            x._seen_by_backward = True
            return g * 2

    xs = []

    def make_args(i):
        xs.append(_x(i))
        return (xs[-1],)

    matches_eager(F, make_args, steps=3, state=lambda: [getattr(x, "_seen_by_backward", None) for x in xs],
                  reset=xs.clear, refusable=False)


W = torch.ones(6)


def test_forward_sets_an_attribute_on_a_global_tensor() -> None:
    """``W._last = y`` on a global tensor: eager leaves this call's ``y`` there."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x * W
            W._last = y
            return y

        @staticmethod
        def backward(ctx, g):
            return g * W

    def reset():
        W.__dict__.pop("_last", None)

    matches_eager(F, lambda i: (_x(i),), steps=3, state=lambda: _detached(getattr(W, "_last", None)),
                  reset=reset, refusable=False)
    reset()


DEQUE: collections.deque = collections.deque(maxlen=2)
USERDICT = collections.UserDict()


class Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 3.0


MODULE = Holder()


@pytest.mark.parametrize("where", ["deque argument", "global deque", "global UserDict", "global module",
                                   "dict in a tuple argument", "module argument private"])
def test_a_tensor_stored_in_a_holder(where: str) -> None:
    box: dict = {}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, holder):
            y = x.sin()
            if where == "deque argument":
                holder.append(y)
            elif where == "global deque":
                DEQUE.append(y)
            elif where == "global UserDict":
                USERDICT["last"] = y
            elif where == "global module":
                MODULE.cache = y
            elif where == "dict in a tuple argument":
                holder[0]["last"] = y
            else:
                holder._cache = y
            ctx.save_for_backward(x)
            return y * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2 * x.cos(), None

    def reset():
        DEQUE.clear()
        USERDICT.clear()
        MODULE.__dict__.pop("cache", None)
        box["holder"] = {"deque argument": collections.deque(), "dict in a tuple argument": ({},),
                         "module argument private": Holder()}.get(where)

    def state():
        if where in ("deque argument", "global deque"):
            return [_detached(v) for v in (box["holder"] if where == "deque argument" else DEQUE)]
        if where == "global UserDict":
            return _detached(USERDICT.get("last"))
        if where == "global module":
            return _detached(getattr(MODULE, "cache", None))
        if where == "dict in a tuple argument":
            return _detached(box["holder"][0].get("last"))
        return _detached(getattr(box["holder"], "_cache", None))

    matches_eager(F, lambda i: (_x(i), box["holder"]), steps=3, state=state, reset=reset, refusable=False)
    reset()
