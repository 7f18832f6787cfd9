"""Differentiating through another ``autograd.Function`` inside a captured phase, against eager.

A Function whose forward or backward calls ``torch.autograd.grad`` (or ``backward()``, the
checkpoint style) over a graph holding ``Inner.apply`` gets, in eager, the gradient of
``Inner``'s own ``backward``. minihop's graph holds ``Inner``'s forward ops inlined, so run
time autograd would differentiate those ops instead: a silent wrong gradient (found by the
reads fuzzer, access form ``inner_apply_backward``). Strict mode refuses it (MH104);
``fallback="eager"`` equals eager.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import Function

import minihop

SCALE = [2.0]


class Inner(Function):
    # Forward is the identity; its backward scales: an op-level derivative would give 1.
    @staticmethod
    def forward(ctx, t):
        return t * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * SCALE[0]


def inner_grad() -> torch.Tensor:
    with torch.enable_grad():
        t = torch.ones((), requires_grad=True)
        (d,) = torch.autograd.grad(Inner.apply(t), t)
    return d


def inner_backward() -> torch.Tensor:
    with torch.enable_grad():
        t = torch.ones((), requires_grad=True)
        Inner.apply(t * 1.0).backward()
    return t.grad


class ByGrad(Function):
    @staticmethod
    def forward(ctx, x):
        return x * inner_grad()

    @staticmethod
    def backward(ctx, g):
        return g * inner_grad()


class ByBackwardInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * inner_backward()


def _run(call, fn_cls) -> list[torch.Tensor]:
    got = []
    for scale in (2.0, 3.0):
        SCALE[0] = scale
        x = torch.linspace(-1.0, 1.0, 3, requires_grad=True)
        out = call(fn_cls)(x)
        SCALE[0] = scale + 1.5  # changed before backward: eager's backward reads this one
        out.sum().backward()
        got += [out.detach(), x.grad]
    return got


@pytest.mark.parametrize("fn_cls", [ByGrad, ByBackwardInBackward])
def test_differentiating_through_an_inner_function_is_refused_or_eager(fn_cls: type) -> None:
    eager = _run(lambda f: f.apply, fn_cls)
    with pytest.raises(minihop.MinihopError) as info:
        _run(lambda f: (lambda *a: minihop.apply(f, *a)), fn_cls)
    assert info.value.code == "MH104" and "Inner.apply" in str(info.value)
    with pytest.warns(UserWarning, match="MH104"):
        fallback = _run(lambda f: minihop.function(f, fallback="eager").apply, fn_cls)
    for got, want in zip(fallback, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
