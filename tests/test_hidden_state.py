"""State Python keeps out of sight (``minihop/tracer/hidden.py``): refused, never baked in.

A number a Function takes from a random generator, an iterator or the clock while it is
traced would be a constant in the graphs, and every call would reuse it where eager takes a
new one: a silent wrong answer. Each source is refused (MH106) in forward and in backward;
refusing leaves the generators as they were, so the eager fallback draws what eager draws;
and a Function that does not draw captures as before.
"""

from __future__ import annotations

import itertools
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

import numpy as np
import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import SideEffectError

PYRNG = random.Random(0)
NPRNG = np.random.default_rng(0)
LEGACY = np.random.RandomState(0)
IDS = itertools.count(1)


def _numbers() -> Iterator[int]:
    n = 0
    while True:
        n += 1
        yield n


NUMBERS = _numbers()

# Each source: how the user's code takes a number from it, as Functions in the wild write it.
SOURCES: dict[str, Callable[[], float]] = {
    "random.random": lambda: random.random(),
    "random.uniform bound by name": lambda: _uniform(0.5, 1.5),
    "a random.Random": lambda: PYRNG.gauss(0.0, 1.0),
    "np.random.rand": lambda: float(np.random.rand()),
    "a numpy Generator": lambda: float(NPRNG.random()),
    "a numpy RandomState": lambda: float(LEGACY.uniform()),
    "itertools.count": lambda: float(next(IDS)),
    "a generator": lambda: float(next(NUMBERS)),
    "time.time": lambda: time.time() % 1.0,
    "perf_counter bound by name": lambda: perf_counter() % 1.0,
    "os.urandom": lambda: os.urandom(1)[0] / 255.0,
    "uuid.uuid4": lambda: uuid.uuid4().int % 7 / 7.0,
}
_uniform = random.uniform

MESSAGES = {
    "random.random": r"forward draws from Python's random module",
    "random.uniform bound by name": r"forward draws from Python's random module",
    "a random.Random": r"forward draws from PYRNG",
    "np.random.rand": r"forward draws from numpy's global random state",
    "a numpy Generator": r"forward draws from NPRNG",
    "a numpy RandomState": r"forward draws from LEGACY",
    "itertools.count": r"forward takes the next value of IDS",
    "a generator": r"forward takes the next value of NUMBERS",
    "time.time": r"reads the clock or the system's entropy \(`time.time`",
    "perf_counter bound by name": r"reads the clock or the system's entropy \(`time.perf_counter`",
    "os.urandom": r"reads the clock or the system's entropy \(`os.urandom`",
    "uuid.uuid4": r"reads the clock or the system's entropy \(`uuid.uuid4`",
}


def scaled_by(source: Callable[[], float], in_backward: bool = False) -> type:
    """A Function scaling its input by a number from ``source``, in forward or backward."""

    class Scaled(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            if in_backward:
                return x.clone()
            ctx.k = source()
            return x * ctx.k

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * (source() if in_backward else ctx.k)

    return Scaled


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_draw_in_forward_is_refused(name: str) -> None:
    """Each source read in forward is MH106, naming what was read."""
    with pytest.raises(SideEffectError, match=MESSAGES[name]) as info:
        minihop.capture(scaled_by(SOURCES[name]), torch.randn(3, requires_grad=True))
    assert "[MH106]" in str(info.value) and "fallback='eager'" in str(info.value)


@pytest.mark.parametrize("name", ["random.random", "a numpy Generator", "itertools.count", "time.time"])
def test_a_draw_in_backward_is_refused(name: str) -> None:
    """Backward is traced at capture time too: its draws are refused the same way. (An
    iterator is refused before the trace, where the code names it: ``source`` is named in
    forward's code too.)"""
    phase = r"(backward|forward)" if name == "itertools.count" else "backward"
    with pytest.raises(SideEffectError, match=rf"\[MH106\] .*Scaled\.{phase} (draws|takes|reads)"):
        minihop.capture(scaled_by(SOURCES[name], in_backward=True), torch.randn(3, requires_grad=True))


def test_refusal_leaves_the_generators_as_they_were() -> None:
    """Python's, numpy's global and a user's generators hold the state they had before."""
    before = (random.getstate(), np.random.get_state()[1].copy(), PYRNG.getstate(),
              NPRNG.bit_generator.state)
    for name in ("random.random", "np.random.rand", "a random.Random", "a numpy Generator"):
        with pytest.raises(SideEffectError):
            minihop.capture(scaled_by(SOURCES[name]), torch.randn(3, requires_grad=True))
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all()
    assert PYRNG.getstate() == before[2] and NPRNG.bit_generator.state == before[3]


def test_clocks_are_put_back() -> None:
    """The clock reads minihop watches while tracing are the real functions again after."""
    originals = (time.time, time.perf_counter, os.urandom, uuid.uuid4, globals()["perf_counter"])
    with pytest.raises(SideEffectError):
        minihop.capture(scaled_by(SOURCES["perf_counter bound by name"]), torch.randn(3, requires_grad=True))
    minihop.capture(scaled_by(lambda: 2.0), torch.randn(3, requires_grad=True))
    assert (time.time, time.perf_counter, os.urandom, uuid.uuid4, globals()["perf_counter"]) == originals


def test_eager_fallback_draws_what_eager_draws() -> None:
    """With ``fallback="eager"`` every call draws anew, the same numbers as eager's calls."""
    fn_cls = scaled_by(SOURCES["random.random"])

    def run(apply: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        random.seed(7)
        out = []
        for _ in range(3):
            x = torch.ones(2, requires_grad=True)
            y = apply(x)
            y.sum().backward()
            out += [y.detach(), x.grad]
        return out

    eager = run(fn_cls.apply)
    with pytest.warns(UserWarning, match="MH106"):
        fallen_back = run(minihop.function(fn_cls, fallback="eager").apply)
    for a, b in zip(eager, fallen_back, strict=True):
        torch.testing.assert_close(a, b)
    assert len({float(t[0]) for t in eager[::2]}) == 3  # eager's three draws differ


def test_a_function_that_does_not_draw_is_captured() -> None:
    """Naming a generator is not drawing from it: a branch not taken captures as before."""

    class MaybeNoisy(Function):
        noisy = False

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            scale = random.random() if MaybeNoisy.noisy else 2.0
            ctx.scale = scale
            return x * scale

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * ctx.scale

    from minihop.testing import assert_matches_eager

    assert_matches_eager(MaybeNoisy, torch.randn(3, requires_grad=True))


NOISE = {"uniform": random.random}


def test_a_draw_the_code_does_not_name_is_found_by_the_generators_state() -> None:
    """Python's generator is compared before and after each phase: a draw through a table
    (or inside a library function) is refused too, and the generator put back."""
    before = random.getstate()
    with pytest.raises(SideEffectError, match=r"forward draws from Python's random module \(in a function it calls\)"):
        minihop.capture(scaled_by(lambda: NOISE["uniform"]()), torch.randn(3, requires_grad=True))
    with pytest.raises(SideEffectError, match=r"backward draws from Python's random module \(in a function it calls\)"):
        minihop.capture(scaled_by(lambda: NOISE["uniform"](), in_backward=True), torch.randn(3, requires_grad=True))
    assert random.getstate() == before


class Reseeded(Function):
    """Seeds torch in forward, then draws: eager gives the same noise on every call."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(1)
        return x + torch.rand_like(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


def test_seeding_torch_is_refused_and_undone() -> None:
    """``torch.manual_seed`` is no tensor op: refused (MH106), torch's generator put back."""
    x = torch.randn(3, requires_grad=True)
    before = torch.get_rng_state()
    with pytest.raises(SideEffectError, match=r"Reseeded\.forward seeds torch's random generator "
                                              r"\(`torch\.manual_seed`, line \d+\)"):
        minihop.capture(Reseeded, x)
    assert torch.equal(torch.get_rng_state(), before)
    with pytest.warns(UserWarning, match="MH106"):
        fn = minihop.function(Reseeded, fallback="eager")
        first, second = (fn.apply(torch.zeros(3, requires_grad=True)) for _ in range(2))
    torch.testing.assert_close(first, second)  # reseeded on every call, as eager does
    torch.testing.assert_close(first, Reseeded.apply(torch.zeros(3)))
