"""Interop checks after sizes have changed, not only on a fresh cache.

The automatic dynamic cache makes a dimension symbolic once a second size is seen; every
later call runs a symbolic capture. torch.func transforms, torch.compile on top, autocast and
inference mode are checked here on calls made after that, against eager (outputs, their
types, every grad).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop

SIZES = (3, 5, 7, 4)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.reset()
    torch._dynamo.reset()


class Lin(Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, w):
        return x @ w, x.shape[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w = inputs
        ctx.save_for_backward(x, w)
        ctx.n = x.shape[0]

    @staticmethod
    def backward(ctx, g, _n):
        x, w = ctx.saved_tensors
        g = g.to(x.dtype)  # under autocast y, and so g, is bfloat16
        return g @ w.t(), (x.t() @ g) * (ctx.n / x.shape[0])


def warm(run: Any) -> None:
    """Two sizes through the cache: from here on the first dimension is symbolic."""
    for n in (2, 6):
        run(torch.randn(n, 4), torch.randn(4, 3))


@pytest.mark.parametrize("transform", ["grad", "vjp", "jacrev", "vmap"])
def test_torch_func_after_sizes_changed(transform: str) -> None:
    run = minihop.function(Lin)
    warm(run)
    w = torch.randn(4, 3)
    for n in SIZES:
        x = torch.randn(n, 4)
        for call, name in ((Lin.apply, "eager"), (run, "minihop")):
            if transform == "grad":
                result = torch.func.grad(lambda w_: call(x, w_)[0].sum())(w)
            elif transform == "vjp":
                out, pull = torch.func.vjp(lambda x_, w_: call(x_, w_)[0], x, w)
                result = (out, *pull(torch.ones_like(out)))
            elif transform == "jacrev":
                result = torch.func.jacrev(lambda w_: call(x, w_)[0].sum(0))(w)
            else:
                result = torch.func.vmap(lambda xb: call(xb, w)[0])(torch.stack([x, 2 * x]))
            if name == "eager":
                expected = result
        torch.testing.assert_close(result, expected, rtol=1e-6, atol=1e-6)
    assert run.stats.captures >= 2 and run.stats.eager_calls == 0


def test_compile_on_top_after_sizes_changed() -> None:
    run = minihop.function(Lin)
    warm(run)

    def program(call: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y, n = call(x, w)
        return y.sum() * n

    compiled = torch.compile(lambda x, w: program(run, x, w), backend="eager", fullgraph=True)
    for n in SIZES:
        x = torch.randn(n, 4, requires_grad=True)
        w = torch.randn(4, 3, requires_grad=True)
        xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        mine, eager = compiled(x, w), program(Lin.apply, xe, we)
        torch.testing.assert_close(mine, eager)
        mine.backward()
        eager.backward()
        torch.testing.assert_close(x.grad, xe.grad)
        torch.testing.assert_close(w.grad, we.grad)


@pytest.mark.parametrize("mode", ["autocast", "inference_mode", "no_grad"])
def test_modes_after_sizes_changed(mode: str) -> None:
    run = minihop.function(Lin)
    warm(run)
    for n in SIZES:
        x, w = torch.randn(n, 4), torch.randn(4, 3)
        if mode == "autocast":
            x.requires_grad_()
            w.requires_grad_()
        ctx = {"autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
               "inference_mode": torch.inference_mode, "no_grad": torch.no_grad}[mode]
        xe, we = x.detach().clone().requires_grad_(x.requires_grad), w.detach().clone().requires_grad_(w.requires_grad)
        with ctx():
            (m, mn), (e, en) = run(x, w), Lin.apply(xe, we)
        assert (type(mn), mn) == (type(en), en) == (int, n)
        torch.testing.assert_close(m, e, rtol=0, atol=0)
        assert (m.dtype, m.requires_grad, m.is_inference()) == (e.dtype, e.requires_grad, e.is_inference())
        if m.requires_grad:
            m.float().sum().backward()
            e.float().sum().backward()
            torch.testing.assert_close(x.grad, xe.grad, rtol=0, atol=0)
            torch.testing.assert_close(w.grad, we.grad, rtol=0, atol=0)
    assert run.stats.eager_calls == 0
