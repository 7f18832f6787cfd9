"""Grad modes, inference mode and autograd's own behaviour around a captured Function, against eager.

Each case runs eager ``F.apply``, strict ``minihop.function(F)`` and
``minihop.function(F, fallback="eager")`` on twin arguments over several sizes (so the
automatic dynamic cache has made the sizes symbolic by the last calls), comparing outputs,
their types and every ``.grad``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.testing import clone_args

SIZES = (3, 5, 7, 9)
MODES = {"strict": {}, "fallback": {"fallback": "eager"}}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.reset()


class Mul(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w, x.shape[0]

    @staticmethod
    def backward(ctx, g, _n):
        x, w = ctx.saved_tensors
        return g * w, g * x


@pytest.mark.parametrize("mode", MODES)
def test_inference_mode_with_inference_tensors(mode: str) -> None:
    run = minihop.function(Mul, **MODES[mode])
    with torch.inference_mode():
        for n in SIZES:
            x, w = torch.randn(n), torch.randn(n)
            (e, en), (m, mn) = Mul.apply(x, w), run(x, w)
            torch.testing.assert_close(m, e, rtol=0, atol=0)
            assert (type(mn), mn) == (type(en), en)
            assert m.is_inference() == e.is_inference() and m.requires_grad == e.requires_grad
    if mode == "strict":
        assert run.stats.captures >= 2 and run.stats.eager_calls == 0


def test_inference_mode_capture_then_normal_calls() -> None:
    """A capture made under inference mode is not used for a call that needs autograd."""
    run = minihop.function(Mul)
    with torch.inference_mode():
        run(torch.randn(4), torch.randn(4))
    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    y, _ = run(x, w)
    y.sum().backward()
    torch.testing.assert_close(x.grad, w.detach())


class DictOnly(Function):
    """Returns only a dict of tensors: autograd sees no output, eager never calls backward."""

    @staticmethod
    def forward(ctx, x):
        return {"double": x * 2, "n": x.shape[0]}

    @staticmethod
    def backward(ctx, g):
        return g * 2  # g would be None: never called in eager


@pytest.mark.parametrize("mode", MODES)
def test_dict_only_output_never_calls_backward(mode: str) -> None:
    run = minihop.function(DictOnly, **MODES[mode])
    for n in SIZES:
        x = torch.randn(n, requires_grad=True)
        e, m = DictOnly.apply(x), run(x)
        assert list(m) == list(e) and m["n"] == e["n"] and type(m["n"]) is int
        torch.testing.assert_close(m["double"], e["double"], rtol=0, atol=0)
        assert m["double"].requires_grad == e["double"].requires_grad
    if mode == "strict":
        assert run.stats.eager_calls == 0


class NoBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("NoBackward is forward-only")


def test_backward_raising_off_the_loss_path_falls_back() -> None:
    """Eager is fine until someone differentiates through it; fallback='eager' must be too."""
    run = minihop.function(NoBackward, fallback="eager")
    for n in SIZES:
        x, w = torch.randn(n, requires_grad=True), torch.randn(n, requires_grad=True)
        side = run(x)  # off the loss path
        (w * 3).sum().backward()
        torch.testing.assert_close(side, x.detach() * 2)
        with pytest.raises(NotImplementedError, match="NoBackward is forward-only"):
            side.sum().backward()
