"""Writes to an ``nn.Module``'s plain attributes inside a Function, against eager.

Found by the effects fuzzer (kind ``module_attr``): a user module held in a closure or global
whose forward or backward does ``stats.steps += 1`` or ``stats.last = 2.5``. The heap watch
left every ``nn.Module`` out, so the trace's write stayed made once, at capture, and was never
replayed: strict and ``fallback="eager"`` both gave a wrong count with no error. A module's
plain attributes (its ``__dict__`` without the underscore bookkeeping) and its submodules'
are now watched like any object's. Each case runs 3 calls eagerly, strict and fallback on
fresh state (``tests/fuzz/oracle_effects.py``).
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "fuzz"))

from oracle_effects import compare  # noqa: E402


class Stats(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.steps, self.last = 0, None
        self.inner = torch.nn.Sequential(torch.nn.Identity())
        self.inner[0].seen = 0


def _make(phase: str, write: str):
    def make():
        stats = Stats()

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if phase == "forward":
                    exec(write, {"stats": stats})
                return x * 2

            @staticmethod
            def backward(ctx, g):
                if phase == "backward":
                    exec(write, {"stats": stats})
                return g * 2

        def args(i):
            return (torch.randn(3, generator=torch.Generator().manual_seed(i)).requires_grad_(),)

        def state():
            return (stats.steps, stats.last, stats.training, stats.inner[0].seen, stats.inner.training)
        return Fn, args, state
    return make


def _direct(phase: str):
    # The same writes as source (not exec): the way a user writes them.
    def make():
        stats = Stats()

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if phase == "forward":
                    stats.steps += 1
                    stats.last = 2.5
                    stats.inner[0].seen += 2
                return x * 2

            @staticmethod
            def backward(ctx, g):
                if phase == "backward":
                    stats.steps += 1
                    stats.last = "b"
                    stats.inner[0].seen += 2
                return g * 2

        def args(i):
            return (torch.randn(3, generator=torch.Generator().manual_seed(i)).requires_grad_(),)

        def state():
            return (stats.steps, stats.last, stats.inner[0].seen)
        return Fn, args, state
    return make


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_module_attribute_counter_and_set_match_eager(phase: str) -> None:
    assert compare(_direct(phase)) == {"strict": "same", "fallback": "same"}


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_module_eval_inside_the_function_matches_eager(phase: str) -> None:
    verdicts = compare(_make(phase, "stats.train(not stats.training)"))
    assert verdicts["fallback"] == "same", verdicts
    assert verdicts["strict"] == "same" or verdicts["strict"].startswith("refused"), verdicts
