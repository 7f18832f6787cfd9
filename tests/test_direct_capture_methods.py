"""A direct capture (``cap = minihop.capture(F, x)``, then ``cap(x)``) and the Function's
methods replaced since: ``F.forward`` rebound, its defaults or its code replaced. Eager's
``F.apply`` runs the new method; the capture runs what it traced, so it must refuse
(``GuardMismatchError``, MH301) rather than answer with the old graphs. (``minihop.apply`` and
``minihop.function`` key the methods and capture again: ``cache.py``.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import minihop
from minihop.errors import GuardMismatchError


def _make() -> type:
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, s: float = 2.0) -> torch.Tensor:
            ctx.s = s
            return x * s

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
            return g * ctx.s, None

    return Scale


def _rebind_forward(F: type) -> None:
    def forward(ctx: Any, x: torch.Tensor, s: float = 2.0) -> torch.Tensor:
        ctx.s = s
        return x * s + 1

    F.forward = staticmethod(forward)


def _new_default(F: type) -> None:
    F.forward.__defaults__ = (5.0,)


def _new_code(F: type) -> None:
    def other(ctx: Any, x: torch.Tensor, s: float = 2.0) -> torch.Tensor:
        ctx.s = s
        return x * s * s

    F.forward.__code__ = other.__code__


def _new_backward(F: type) -> None:
    F.backward = staticmethod(lambda ctx, g: (g * 0, None))


CHANGES = [_rebind_forward, _new_default, _new_code, _new_backward]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_direct_capture_refuses_replaced_methods(change: Any) -> None:
    F = _make()
    x = torch.arange(1.0, 4.0, requires_grad=True)
    cap = minihop.capture(F, x)
    torch.testing.assert_close(cap(x), F.apply(x))  # unchanged: serves the call
    change(F)
    with pytest.raises(GuardMismatchError, match="not the one captured"):
        cap(x)


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_apply_after_replaced_methods_matches_eager(change: Any) -> None:
    """Through ``minihop.apply`` the new methods are captured again: outputs and grads are eager's."""
    F = _make()
    minihop.apply(F, torch.ones(3, requires_grad=True)).sum().backward()
    change(F)
    x = torch.arange(1.0, 4.0, requires_grad=True)
    e = x.detach().clone().requires_grad_()
    y, ye = minihop.apply(F, x), F.apply(e)
    torch.testing.assert_close(y, ye, rtol=0, atol=0)
    y.sum().backward()
    ye.sum().backward()
    torch.testing.assert_close(x.grad, e.grad, rtol=0, atol=0)
