"""How many times backward reads ``ctx.saved_tensors``, as eager unpacks them.

In eager each read of ``ctx.saved_tensors`` unpacks every saved tensor: a
``saved_tensors_hooks`` unpack hook runs once per read (twice for a backward that reads it
twice, never for one that does not read it). minihop unpacked exactly once per backward.
Counted against eager, strict and ``fallback="eager"``, over sizes that change.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop

SIZES = (3, 5, 7)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    minihop.reset()


class ReadsTwice(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        x2, _ = ctx.saved_tensors
        return g * w, g * x2


class NeverReads(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * 2 + w

    @staticmethod
    def backward(ctx, g):
        return g * 2, g


class ReadsOnce(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w, x)
        return x * w

    @staticmethod
    def backward(ctx, g):
        w, x = ctx.saved_tensors
        return g * w, g * x


def counted(call: Any, n: int) -> tuple[dict[str, int], torch.Tensor, torch.Tensor]:
    counts = {"pack": 0, "unpack": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        counts["pack"] += 1
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        counts["unpack"] += 1
        return t

    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen, requires_grad=True)
    w = torch.randn(n, generator=gen, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = call(x, w)
        y.sum().backward()
    return counts, x.grad, w.grad


@pytest.mark.parametrize("fallback", ["raise", "eager"])
@pytest.mark.parametrize("fn_cls", [ReadsTwice, NeverReads, ReadsOnce])
def test_unpack_hooks_run_as_in_eager(fn_cls: type, fallback: str) -> None:
    run = minihop.function(fn_cls, fallback=fallback)
    for n in SIZES:
        eager, mine = counted(fn_cls.apply, n), counted(run, n)
        assert mine[0] == eager[0]
        torch.testing.assert_close(mine[1:], eager[1:], rtol=0, atol=0)
    assert run.stats.eager_calls == 0
