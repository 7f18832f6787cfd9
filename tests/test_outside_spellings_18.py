"""Hostile spellings, round 18 (issue #28, round 23), tried from outside against eager in
strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round:

- a backward traced again for a call that pops forward's memo out of a global dict, then raises
  the user's exception with a message that shows fake values (``Normal``'s validation): the
  trace's pop was kept (a user's error keeps its writes, as eager's do), and fallback's eager
  backward, run for that call, then found the memo gone (``KeyError`` where eager raised
  ``ValueError``). A trace whose exception shows fakes is not eager's exception: its writes are
  put back before eager's backward runs (effects fuzz seed 1209874).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function
from torch.distributions import Distribution, Normal

from eager_modes import matches_eager


@pytest.fixture(autouse=True)
def _validation_restored() -> Any:
    was = Distribution._validate_args
    yield
    Distribution.set_default_validate_args(was)


STASH: dict[str, torch.Tensor] = {}
SCALE = [1.0]


class PopsMemo(Function):
    """forward memoises a tensor in a global dict; backward pops it, then builds a ``Normal``
    whose scale is a global the caller sets (validated where torch's default says so)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["memo"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * STASH.pop("memo") + Normal(g, torch.full_like(g, SCALE[0])).log_prob(g)


def test_backward_pops_memo_then_raises_with_fakes() -> None:
    """Fourth call: validation on and scale -1 (set between forward and ``.backward()``), after
    a third call whose backward found the memo cleared (``KeyError``, eager's too)."""
    def mid(i: int) -> None:
        Distribution.set_default_validate_args(i % 2 == 1)
        SCALE[0] = -1.0 if i >= 2 else 1.0
        if i == 2:
            STASH.clear()

    def reset() -> None:
        STASH.clear()
        SCALE[0] = 1.0
        Distribution.set_default_validate_args(True)
    sizes = [3, 4, 3, 3]
    matches_eager(PopsMemo, lambda i: (torch.linspace(-1.0, 1.0, sizes[i]).add(i).requires_grad_(),),
                  mid=mid, reset=reset, state=lambda: sorted(STASH))
