"""A trace that is refused leaves Python state as it found it, even what code minihop did not
analyse wrote (a descriptor, a user object's method), so ``fallback="eager"`` runs eager once
(not the trace's writes plus eager's).

The Functions count calls in a way pystate's snapshot does not see in advance: a property-like
descriptor that bumps a module-level list when read, and a method of an argument object that
bumps its own attribute. Backward is refused (it differentiates through another Function's
apply, MH104), after forward already ran that code while traced.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import MinihopError

CALLS = [0]


class Counted:
    """A descriptor: reading ``Config.scale`` counts a read (a common debug or stats hook)."""

    def __get__(self, obj: Any, objtype: Any = None) -> float:
        CALLS[0] += 1
        return 2.0


class Config:
    scale = Counted()


CONFIG = Config()


class Meter:
    def __init__(self) -> None:
        self.seen = 0

    def update(self, n: int) -> float:
        self.seen += n
        return 1.0


class Inner(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 3

    @staticmethod
    def backward(ctx, g):
        return g * 5


def _inner_grad() -> torch.Tensor:
    with torch.enable_grad():
        t = torch.ones((), requires_grad=True)
        (d,) = torch.autograd.grad(Inner.apply(t), t)
    return d


class ScaledByDescriptor(Function):
    @staticmethod
    def forward(ctx, x):
        return x * CONFIG.scale

    @staticmethod
    def backward(ctx, g):
        return g * _inner_grad()


class Metered(Function):
    @staticmethod
    def forward(ctx, x, meter):
        return x * meter.update(x.shape[0])

    @staticmethod
    def backward(ctx, g):
        return g * _inner_grad(), None


def _run(call: Any, make_args: Any, steps: int = 3) -> list[Any]:
    out = []
    for i in range(steps):
        args = make_args(i)
        y = call(*args)
        y.sum().backward()
        out.append((y.detach(), args[0].grad))
    return out


@pytest.mark.parametrize("case", ["descriptor", "method"])
def test_fallback_runs_eager_once_after_a_refused_trace(case: str) -> None:
    meter = Meter()
    fn, make_args, count = {
        "descriptor": (ScaledByDescriptor, lambda i: (torch.randn(3 + i, requires_grad=True),), lambda: CALLS[0]),
        "method": (Metered, lambda i: (torch.randn(3 + i, requires_grad=True), meter), lambda: meter.seen),
    }[case]
    torch.manual_seed(0)
    before = count()
    eager = _run(fn.apply, make_args)
    eager_count = count() - before
    torch.manual_seed(0)
    before = count()
    mine = _run(minihop.function(fn, fallback="eager"), make_args)
    assert count() - before == eager_count  # was twice eager's: the refused trace's reads stayed
    for (y, g), (ey, eg) in zip(mine, eager, strict=True):
        torch.testing.assert_close(y, ey)
        torch.testing.assert_close(g, eg)


def test_strict_refusal_leaves_the_count_as_it_was() -> None:
    before = CALLS[0]
    with pytest.raises(MinihopError, match="MH104"):
        minihop.function(ScaledByDescriptor)(torch.randn(3, requires_grad=True))
    assert CALLS[0] == before
