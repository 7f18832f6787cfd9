"""Backward's Python writes under torch.func transforms, against eager.

A ``setup_context``-style Function runs through its capture's ``transformable`` class while a
torch.func transform is active. That class's backward took the gradients of the capture's
backward and dropped the Python writes of the bwd variant that ran: a log that backward, traced
again for a call (the caller turned auditing on), appends to stayed behind eager's under
``torch.func.grad``/``vjp`` (strict and ``fallback="eager"`` alike, no error). Found from
outside (a flag-gated audit log in backward, called under ``torch.func.grad``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import minihop

COUNT = [0]
LOG: list[Any] = []
FLAGS = {"audit": False}


class Counted(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.n = inputs[0].shape[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        COUNT[0] += 1
        if FLAGS["audit"]:
            LOG.append(int(g.shape[0]))
        return g * 2 * ctx.n


class Audited(Counted):
    """Counted's forward; backward writes only when the caller asks (its one write is in a
    variant traced then)."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            LOG.append(int(g.shape[0]))
        return g * 2 * ctx.n


def _script(call: Any, transform: str) -> list[Any]:
    COUNT[0] = 0
    LOG.clear()
    out: list[Any] = []
    for i, n in enumerate([3, 4, 3, 4]):
        x = torch.arange(1.0, 1.0 + n)
        FLAGS["audit"] = i == 3
        if transform == "grad":
            g = torch.func.grad(lambda t: call(t).sum())(x)
        else:
            _, pullback = torch.func.vjp(call, x)
            (g,) = pullback(torch.ones(n))
        FLAGS["audit"] = False
        out.append((g.tolist(), COUNT[0], list(LOG)))
        # the same call outside the transform (another capture path), flag off
        y = torch.arange(1.0, 1.0 + n).requires_grad_()
        call(y).sum().backward()
        out.append((y.grad.tolist(), COUNT[0], list(LOG)))
    return out


@pytest.mark.parametrize("fn_cls", [Counted, Audited], ids=["counted", "audited"])
@pytest.mark.parametrize("transform", ["grad", "vjp"])
@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_backward_writes_under_transforms_match_eager(mode: str, transform: str, fn_cls: type) -> None:
    eager = _script(fn_cls.apply, transform)
    minihop.reset()
    call = minihop.function(fn_cls, fallback="eager" if mode == "fallback" else "raise")
    try:
        mine = _script(call, transform)
    except minihop.MinihopError:
        assert mode == "strict"
        return
    assert mine == eager
