"""A store through a user property's setter inside a Function, against eager.

Found by the effects fuzzer (kind ``property_setter``): ``PS.value = int(x.shape[0])`` where
``value`` is a property whose setter appends to a history list. Before tracing, pystate puts a
marker into attributes the code only stores to; through a property that marker ran the
user's setter, so ``<minihop: not stored yet>`` was appended to the user's list and stayed
there (strict and fallback, no error). Such attributes are no longer marked: the setter runs
only inside the trace, where it is the user's code minihop did not analyse. Each case runs 3
calls eagerly, strict and fallback on fresh state (``tests/fuzz/oracle_effects.py``), sizes
changing between calls; the state is also changed between calls by the caller.

Reading the property to mark it ran its getter too: ``self.history[-1]`` on an empty list
raised ``IndexError`` out of the tracker after other attributes had been marked, so a plain
``stats.last = 2.5`` in the same backward showed ``<minihop: not stored yet>`` between forward
and ``.backward()`` (``test_a_property_getter_that_raises_leaves_no_marker``).
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "fuzz"))

from oracle_effects import compare  # noqa: E402


class History:
    def __init__(self) -> None:
        self.history: list[int] = []

    @property
    def value(self) -> int:
        return self.history[-1]

    @value.setter
    def value(self, v: int) -> None:
        self.history.append(v)


class Stored:
    def __init__(self) -> None:
        self._v = 0

    @property
    def value(self) -> int:
        return self._v

    @value.setter
    def value(self, v: int) -> None:
        self._v = v


def _make(holder_cls: type, phase: str):
    def make():
        ps = holder_cls()

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if phase == "forward":
                    ps.value = int(x.shape[0])
                return x * 2

            @staticmethod
            def backward(ctx, g):
                if phase == "backward":
                    ps.value = int(g.shape[0]) + 10
                return g * 2

        sizes = [3, 4, 3]

        def args(i):
            if isinstance(ps, Stored):
                ps._v = -i  # the caller changes what the setter writes, between calls
            return (torch.randn(sizes[i], generator=torch.Generator().manual_seed(i)).requires_grad_(),)

        def state():
            return list(ps.history) if isinstance(ps, History) else ps._v
        return Fn, args, state
    return make


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("holder_cls", [History, Stored])
def test_store_through_a_property_setter_matches_eager(holder_cls: type, phase: str) -> None:
    verdicts = compare(_make(holder_cls, phase))
    assert verdicts["fallback"] == "same", verdicts
    assert verdicts["strict"] == "same" or verdicts["strict"].startswith("refused"), verdicts


class Plain:
    def __init__(self) -> None:
        self.steps, self.last = 0, None


@pytest.mark.parametrize("sizes", [(3, 3, 3), (3, 4, 3)])
def test_a_property_getter_that_raises_leaves_no_marker(sizes: tuple[int, ...]) -> None:
    def make():
        stats, ps = Plain(), History()  # History.value's getter raises while history is empty

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                stats.steps += 2
                stats.last = 2.5
                ps.value = int(g.shape[0])
                return g * 2

        def args(i):
            return (torch.randn(sizes[i], generator=torch.Generator().manual_seed(i)).requires_grad_(),)

        def state():
            return (stats.steps, repr(stats.last), list(ps.history))
        return Fn, args, state
    verdicts = compare(make)
    assert verdicts["fallback"] == "same", verdicts
    assert verdicts["strict"] == "same" or verdicts["strict"].startswith("refused"), verdicts
