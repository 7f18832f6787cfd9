"""Calls on a tensor's autograd state inside a Function, against eager.

- ``t.requires_grad = True`` (the setter) in a backward that recomputes and calls
  ``torch.autograd.grad``: recorded as ``requires_grad_`` (it was lost: "element 0 of tensors
  does not require grad").
- ``register_hook`` / ``retain_grad`` on an input inside forward: in eager they act on the
  caller's tensor; a graph cannot hold them, so strict mode refuses (MH104) and
  ``fallback="eager"`` gives eager's grads (they acted on the fake input, silently).
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import Function

import minihop

SIZES = (3, 5, 7)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.reset()


class Recompute(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            t = x.detach()
            t.requires_grad = True
            y = t.sin() * t
            (gx,) = torch.autograd.grad(y, t, g)
        return gx


@pytest.mark.parametrize("fallback", ["raise", "eager"])
def test_requires_grad_setter_in_backward(fallback: str) -> None:
    run = minihop.function(Recompute, fallback=fallback)
    for n in SIZES:
        x = torch.randn(n, requires_grad=True)
        xe = x.detach().clone().requires_grad_(True)
        run(x).sum().backward()
        Recompute.apply(xe).sum().backward()
        torch.testing.assert_close(x.grad, xe.grad, rtol=0, atol=0)
    assert run.stats.eager_calls == 0


class HookInput(Function):
    @staticmethod
    def forward(ctx, x):
        x.register_hook(lambda g: g * 10)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class RetainInput(Function):
    @staticmethod
    def forward(ctx, x):
        x.retain_grad()
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def run_through(call, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    x = torch.randn(n, requires_grad=True)
    z = x * 1  # a non-leaf input: retain_grad gives it a .grad in eager
    call(z).sum().backward()
    return x.grad, z.grad


@pytest.mark.parametrize("fn_cls", [HookInput, RetainInput])
def test_hooks_on_inputs_strict_refuses(fn_cls: type) -> None:
    with pytest.raises(minihop.UnsupportedOperationError, match=rf"\[MH104\] {fn_cls.__name__}.forward calls "):
        minihop.apply(fn_cls, torch.randn(3, requires_grad=True))


@pytest.mark.parametrize("fn_cls", [HookInput, RetainInput])
def test_hooks_on_inputs_fallback_is_eager(fn_cls: type) -> None:
    run = minihop.function(fn_cls, fallback="eager")
    with pytest.warns(UserWarning, match="running .* eagerly"):
        for n in SIZES:
            torch.manual_seed(n)
            eager = run_through(fn_cls.apply, n)
            torch.manual_seed(n)
            mine = run_through(run, n)
            for e, m in zip(eager, mine, strict=True):
                assert (e is None) == (m is None)
                if e is not None:
                    torch.testing.assert_close(m, e, rtol=0, atol=0)
