"""Small Functions several test files use as they are (import from here rather than repeat them)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MySin"]


class MySin(torch.autograd.Function):
    """sin(x), saving its input; backward grad * cos(x)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x.cos()
