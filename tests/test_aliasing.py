"""One object reached two ways: an argument that *is* a global, a closure value or another argument.

Arguments are keyed by what they hold (a new list of the same items is the same key) and
places by their value, so neither says that the list passed in is the global the code also
reads: forward's write through one is seen through the other while tracing, and the graphs
bake that in. Found from outside: ``sink.append(y); k = len(SINK)`` called first with ``SINK``
itself, then with a fresh list, gave the first call's ``k`` on every later call, in strict and
fallback mode. The capture now assumes the same sharing, by position, between its argument
objects and every object along the places it read (``runtime/assumptions.py``,
``_alias_assumption``); a call that shares otherwise is another capture.

Each case alternates sharing and not sharing, starting either way, and runs against eager in
strict, apply and fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import pytest
import torch

from eager_modes import matches_eager

SINK: list = []
COUNTS: dict = {"n": 0}


class Box:
    def __init__(self) -> None:
        self.n = 0


BOX = Box()


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1.0, 1.0, 4) + i).requires_grad_()


def _reset() -> None:
    SINK.clear()
    COUNTS["n"] = 0
    BOX.n = 0


@pytest.mark.parametrize("first", ["shared", "apart"])
@pytest.mark.parametrize("how", ["list and global", "dict item and global", "object and closure",
                                 "two arguments"])
def test_sharing_is_assumed(how: str, first: str) -> None:
    closure_box = BOX

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, a, b):
            if how == "list and global":
                a.append(x.detach() * 2)
                k = len(SINK)
            elif how == "dict item and global":
                a["n"] += 1
                k = COUNTS["n"]
            elif how == "object and closure":
                a.n += 1
                k = closure_box.n
            else:
                a.append(1)
                k = len(b)
            return x * 3 + k

        @staticmethod
        def backward(ctx, g):
            return g * 3, None, None

    shared_obj = {"list and global": SINK, "dict item and global": COUNTS, "object and closure": BOX}

    def make_args(i: int) -> tuple:
        shared = (i % 2 == 0) == (first == "shared")
        if how == "two arguments":
            mine: list = []
            return (_x(i), mine, mine if shared else [])
        fresh = {"list and global": [], "dict item and global": {"n": 0}, "object and closure": Box()}[how]
        return (_x(i), shared_obj[how] if shared else fresh, None)

    def between(i: int) -> None:
        _reset()  # the caller starts each call from the same state

    def state():
        return (len(SINK), COUNTS["n"], BOX.n)

    matches_eager(F, make_args, steps=4, between=between, reset=_reset, state=state, refusable=False)
    _reset()
