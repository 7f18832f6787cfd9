"""Warnings a library gives about the user's call, and torch's C++ warnings, while a Function is
traced: shown as eager shows them, on every call, never once and never twice.

- ``torch.nn.functional.upsample`` warns (a Python ``warnings.warn`` whose stacklevel names the
  user's line) on every eager call; a capture gave it once, while tracing, and never again. It
  is the user's message as much as their own ``warnings.warn``: refused (MH106), and fallback
  gives it on every call.
- ``torch.tensor(t)`` warns from C++ on every call, eager's and the graphs' (which call it
  again); the capture's first call gave it twice: the trace's own showing was one more.

Each runs eagerly and in strict, apply and fallback mode (``eager_modes.matches_eager``), whose
records hold each call's warnings.
"""

from __future__ import annotations

from typing import Any

import torch

import eager_modes


class Upsampled(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.upsample(x, scale_factor=2)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g[..., ::2] * 2


class CopiedTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor(x) * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


class UpsampledInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.upsample(g, scale_factor=2)[..., ::2] * 2


def test_a_library_warning_about_the_users_call_matches_eager() -> None:
    eager_modes.matches_eager(Upsampled, lambda i: (torch.ones(1, 1, 2 + i % 2, requires_grad=True),))


def test_a_library_warning_in_backward_matches_eager() -> None:
    eager_modes.matches_eager(UpsampledInBackward, lambda i: (torch.ones(1, 1, 2, requires_grad=True),))


def test_a_cpp_warning_is_shown_once_per_call() -> None:
    eager_modes.matches_eager(CopiedTensor, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),), refusable=False)
