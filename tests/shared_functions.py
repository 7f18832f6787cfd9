"""Small Functions several test files use as they are (import from here rather than repeat them)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Add", "MatMul", "MeanRows", "MySin"]


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


class Add(torch.autograd.Function):
    """The seed's test_rewired_bwd_output Function: two inputs, two outputs, bwd rewired."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.sin(x)
        b = torch.cos(y)
        result = a * b
        ctx.save_for_backward(a, x, result)
        return result, a + b

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor, grad_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (a, x, result) = ctx.saved_tensors
        return a * grad_b * 2 + x, result + grad_a * 3


class MatMul(torch.autograd.Function):
    """x @ w, saving both."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return g @ w.t(), x.t() @ g


class MeanRows(torch.autograd.Function):
    """Keeps a size on ctx (``ctx.n = x.shape[0]``) for backward (expand, divide)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[0]
        return x.sum(0) / x.shape[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.expand(ctx.n, g.shape[0]) / ctx.n
