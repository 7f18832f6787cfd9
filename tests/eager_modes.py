"""Running one script of calls eagerly and through minihop's three ways of calling, and
comparing their records exactly (test_backward_reads, test_argument_containers_on_ctx)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import minihop

__all__ = ["MODES", "caller", "normalized", "same", "same_normalized"]

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


def normalized(v: Any) -> Any:
    """A comparable copy of a recorded value (tensors with their properties, floats by bits)."""
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), v.dtype, v.requires_grad, v.detach().clone())
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(normalized(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((repr(k), normalized(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def same_normalized(a: Any, b: Any) -> bool:
    """Whether two ``normalized`` records agree (tensors to float tolerance)."""
    if isinstance(a, tuple) and a[:1] == ("T",):
        if not (isinstance(b, tuple) and b[:1] == ("T",) and a[1:4] == b[1:4]):
            return False
        return bool(torch.allclose(a[4], b[4], rtol=1e-5, atol=1e-6, equal_nan=True))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_normalized(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
