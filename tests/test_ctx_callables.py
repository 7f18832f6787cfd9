"""Callables and iterators kept on ctx, as surrogate-gradient and spiking packages keep them
(``ctx.surrogate = functools.partial(sg, alpha=...)``, then ``ctx.surrogate(g)`` in backward).

Backward calls what ctx holds when it runs; the caller may change it between forward and
``.backward()`` (``sg.keywords["alpha"] = 4.0``): eager's backward computes with the new value.
minihop reads the callable through its place (the argument, the global, the argument inside a
dict forward made) when backward runs. An iterator or generator kept on ctx moves as backward
takes values from it (a second backward, ``retain_graph=True``, takes the next): refused,
MH106, and ``fallback="eager"`` runs it eagerly. Each case against eager in strict, apply and
fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import eager_modes


def surrogate(t: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return t * alpha


SG = functools.partial(surrogate, alpha=2.0)


class KeepsArgument(torch.autograd.Function):
    """The surrogate is an argument, kept on ctx."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Any) -> torch.Tensor:
        ctx.fn = fn
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.fn(g), None


class KeepsGlobal(torch.autograd.Function):
    """The surrogate is a global, kept on ctx."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.fn = SG
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return ctx.fn(g)


class KeepsInDict(torch.autograd.Function):
    """The surrogate is an argument, inside a dict forward makes."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Any) -> torch.Tensor:
        ctx.fns = {"sg": fn}
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.fns["sg"](g), None


def _alpha(i: int) -> None:
    SG.keywords["alpha"] = 2.0 + i


def _reset() -> None:
    SG.keywords["alpha"] = 2.0


@pytest.mark.parametrize("fn_cls", [KeepsArgument, KeepsGlobal, KeepsInDict])
def test_partial_changed_before_backward_matches_eager(fn_cls: type) -> None:
    """``alpha`` changed in place between forward and ``.backward()`` (was forward's alpha,
    silently, in every mode)."""
    args = (lambda i: (torch.ones(3, requires_grad=True), SG)) if fn_cls is not KeepsGlobal \
        else (lambda i: (torch.ones(3, requires_grad=True),))
    eager_modes.matches_eager(fn_cls, args, mid=_alpha, reset=_reset)


class TakesFromIterator(torch.autograd.Function):
    """Forward keeps an iterator of scales on ctx; each backward takes the next."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.scales = iter([1.0, 2.0, 3.0])
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * next(ctx.scales)


def test_iterator_on_ctx_is_refused_or_matches() -> None:
    """Two backwards of a call take 1.0 then 2.0 in eager (the second took 1.0 again, silently)."""
    eager_modes.matches_eager(TakesFromIterator, lambda i: (torch.ones(3, requires_grad=True),), backwards=2)
