"""Functions that read nothing outside their arguments are never single-use (issue 28).

A capture is single-use when its code read or ran what minihop cannot bound; a Function whose
forward and backward use only their arguments, ctx, torch, ``torch.nn.functional``, ``math``
and builtins (and the user's own helpers that do the same) must be captured once and reused.
Each Function here is written the way such Functions are written in the wild and is called
through ``minihop.function(F)`` four times with new data of the same shapes: one capture,
three hits, ``python_state.single_use`` empty, and every output and ``.grad`` equal to eager's.
``python -m bench.single_use`` counts the suite's single-use Functions (bench/RESULTS.md).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import Function

import minihop


def _gelu_grad(x: torch.Tensor) -> torch.Tensor:
    # A module-level helper of the user's that reads only its argument.
    cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


class MySin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


class Linear(Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        return g @ weight, g.t() @ x, g.sum(0)


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, eps):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        rstd = 1.0 / torch.sqrt(var + eps)
        y = (x - mean) * rstd
        ctx.save_for_backward(y, rstd)
        return y

    @staticmethod
    def backward(ctx, g):
        y, rstd = ctx.saved_tensors
        n = y.shape[-1]
        gy = g - g.mean(-1, keepdim=True) - y * (g * y).mean(-1, keepdim=True)
        return gy * rstd * (n / n), None


class Gelu(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * _gelu_grad(x)


class ScaledWithCtx(Function):
    # setup_context style, a Python number and a flag kept on ctx.
    @staticmethod
    def forward(x, scale, clamp):
        y = x * scale
        return y.clamp(min=0.0) if clamp else y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale, clamp = inputs
        ctx.scale, ctx.clamp = scale, clamp
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        mask = (out > 0).to(g.dtype) if ctx.clamp else torch.ones_like(g)
        return g * mask * ctx.scale, None, None


class TwoOutputs(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b, a + b

    @staticmethod
    def backward(ctx, ga, gb):
        a, b = ctx.saved_tensors
        return ga * b + gb, ga * a + gb


class SoftmaxXent(Function):
    @staticmethod
    def forward(ctx, logits, target):
        p = torch.softmax(logits, dim=-1)
        ctx.save_for_backward(p, target)
        return -(torch.log(p) * target).sum(-1).mean()

    @staticmethod
    def backward(ctx, g):
        p, target = ctx.saved_tensors
        return g * (p - target) / p.shape[0], None


def _args(name: str, i: int) -> tuple:
    gen = torch.Generator().manual_seed(i)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).requires_grad_()
    return {
        "MySin": lambda: (r(5),),
        "Linear": lambda: (r(4, 3), r(2, 3), r(2)),
        "LayerNorm": lambda: (r(3, 6), 1e-5),
        "Gelu": lambda: (r(7),),
        "ScaledWithCtx": lambda: (r(6), 1.5, True),
        "TwoOutputs": lambda: (r(4), r(4)),
        "SoftmaxXent": lambda: (r(3, 5), torch.softmax(torch.randn(3, 5, generator=gen), -1)),
    }[name]()


def _run(call, fn_cls: type, i: int) -> list:
    args = _args(fn_cls.__name__, i)
    out = call(*args)
    outs = out if isinstance(out, tuple) else (out,)
    sum((o * (k + 1)).sum() for k, o in enumerate(outs)).backward()
    return [o.detach() for o in outs] + [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


@pytest.mark.parametrize("fn_cls", [MySin, Linear, LayerNorm, Gelu, ScaledWithCtx, TwoOutputs, SoftmaxXent],
                         ids=lambda c: c.__name__)
def test_a_function_of_its_arguments_is_captured_once_and_reused(fn_cls: type) -> None:
    cf = minihop.function(fn_cls)
    for i in range(4):
        got, want = _run(cf, fn_cls, i), _run(fn_cls.apply, fn_cls, i)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
    assert (cf.stats.captures, cf.stats.hits) == (1, 3), cf.stats
    cap = minihop.capture(fn_cls, *_args(fn_cls.__name__, 0))
    assert cap.python_state.single_use == (), cap.python_state.single_use
