"""Running one script of calls eagerly and through minihop's three ways of calling, and
comparing their records exactly (test_backward_reads, test_argument_containers_on_ctx)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import minihop

__all__ = ["MODES", "caller", "same"]

MODES = ("strict", "apply", "fallback")


def caller(mode: str, fn: type) -> Callable[..., Any]:
    """``fn``'s apply as ``mode`` calls it: "eager", "strict" (``minihop.function``), "apply"
    (``minihop.apply``) or "fallback" (``minihop.function(fn, fallback="eager")``)."""
    if mode == "eager":
        return fn.apply
    if mode == "strict":
        return minihop.function(fn)
    if mode == "apply":
        return lambda *args: minihop.apply(fn, *args)
    return minihop.function(fn, fallback="eager")


def same(eager: Any, mine: Any, what: str) -> None:
    """Equal records: tensors bit for bit (dtype and shape too), containers item by item."""
    if isinstance(eager, torch.Tensor) or isinstance(mine, torch.Tensor):
        assert isinstance(eager, torch.Tensor) and isinstance(mine, torch.Tensor), (what, eager, mine)
        assert (eager.dtype, eager.shape) == (mine.dtype, mine.shape), (what, eager, mine)
        torch.testing.assert_close(mine, eager, rtol=0, atol=0, msg=what)
    elif isinstance(eager, (tuple, list)):
        assert len(eager) == len(mine), (what, eager, mine)
        for i, (e, m) in enumerate(zip(eager, mine, strict=True)):
            same(e, m, f"{what}[{i}]")
    else:
        assert eager == mine, (what, eager, mine)
