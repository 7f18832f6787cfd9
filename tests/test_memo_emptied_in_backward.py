"""A memo forward fills and backward empties (``M["tab"] = t`` in forward, ``M.pop("tab")`` in
backward), as activation-stash and checkpoint-style Functions write it: after each call the
container is as eager leaves it.

Each case runs eagerly and in strict, apply and fallback mode (``eager_modes.matches_eager``),
comparing outputs, every ``.grad`` and the container after every call. (The caller emptying
the stash between forward and backward is still not seen: ``docs/reads.md``, Open.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import eager_modes

STASH: dict[str, torch.Tensor] = {}


class PopsStash(torch.autograd.Function):
    """Forward stashes a tensor in a global dict; backward pops it (eager: the dict ends empty)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * STASH.pop("tab")


class PopsWithDefault(torch.autograd.Function):
    """Backward pops with a default: a caller that emptied the stash first gets the default."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() + 1
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        t = STASH.pop("tab", None)
        return g * 3 if t is None else g * t


class RebindsStash(torch.autograd.Function):
    """Backward replaces what forward stashed: no value to repeat but the traced one (refused)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        t = STASH["tab"]
        STASH["tab"] = t * 0.5
        return g * t


def _args(i: int) -> tuple[torch.Tensor]:
    return (torch.arange(1.0, 4.0 + i % 2).requires_grad_(),)


def _state() -> Any:
    return sorted((k, v.tolist()) for k, v in STASH.items())


@pytest.mark.parametrize("fn_cls", [PopsStash, PopsWithDefault])
def test_memo_emptied_by_backward_matches_eager(fn_cls: type) -> None:
    """The stash is empty after every call, as in eager (was left holding forward's tensor)."""
    eager_modes.matches_eager(fn_cls, _args, state=_state, reset=STASH.clear, refusable=False)


def test_backward_rebinding_the_stash_is_refused_or_matches() -> None:
    """Backward replaces the stashed tensor: strict refuses (MH106) or matches; fallback matches."""
    eager_modes.matches_eager(RebindsStash, _args, state=_state, reset=STASH.clear)
