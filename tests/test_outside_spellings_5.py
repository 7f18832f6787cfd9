"""Red team, round 5 (issue 28: the same classes written differently, tried from outside):
Functions the suite had not met — a distribution whose tensors change in place, an enum held
in a list, a ``functools.cached_property``, a ``WeakKeyDictionary`` memo keyed by the input, a
``random.Random`` global, the environment, a forward hook added between calls, the grad mode
and the deterministic-algorithms flag, a frozen dataclass whose list grows, the default dtype —
× when it changes (between calls, between forward and ``.backward()``).

One differed from eager before this round's fixes: the ``WeakKeyDictionary`` memo (the trace
put an entry keyed by its fake tensor there, replayed on every call; and a refused trace kept
the call's arguments alive in reference cycles, so the caller's tensor outlived eager's,
keeping its entry). Each case runs eagerly and in strict, apply and fallback mode
(``eager_modes.matches_eager``): equal records, or a coded refusal in strict and apply.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import random
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

import eager_modes

CASES: list[tuple[str, type, Callable[[int], tuple[Any, ...]], dict[str, Any]]] = []


def _case(name: str, fn_cls: type, make_args: Callable[[int], tuple[Any, ...]], **options: Any) -> None:
    CASES.append((name, fn_cls, make_args, options))


x3 = lambda i: (torch.arange(1.0, 4.0).requires_grad_(),)  # noqa: E731

# 1 a distribution global whose tensors the caller changes in place
NORMAL = torch.distributions.Normal(torch.tensor(0.0), torch.tensor(1.0))
class LogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return NORMAL.log_prob(x)
    @staticmethod
    def backward(ctx, g):
        return g * NORMAL.scale
def _shift(i):
    with torch.no_grad():
        NORMAL.loc.add_(1.0)
        NORMAL.scale.mul_(2.0)
def _unshift():
    with torch.no_grad():
        NORMAL.loc.fill_(0.0)
        NORMAL.scale.fill_(1.0)
_case("distribution_in_place", LogProb, x3, between=_shift, reset=_unshift)

# 2 ... and rebound
class LogProbRebound(LogProb):
    pass
_case("distribution_rebound", LogProbRebound, x3,
      between=lambda i: setattr(NORMAL, "loc", torch.tensor(float(i))), reset=_unshift)

# 3 an enum held in a list, switched between calls and before backward
class Mode(enum.Enum):
    A = 1
    B = 2
CURRENT = [Mode.A]
class ByMode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2 if CURRENT[0] is Mode.A else 3)
    @staticmethod
    def backward(ctx, g):
        return g * CURRENT[0].value
_case("enum_in_a_list", ByMode, x3, between=lambda i: CURRENT.__setitem__(0, Mode.B if i % 2 else Mode.A),
      mid=lambda i: CURRENT.__setitem__(0, Mode.A if i % 2 else Mode.B), reset=lambda: CURRENT.__setitem__(0, Mode.A))

# 4 a cached_property, its base changed and the cache dropped by the caller
class Doubled:
    def __init__(self):
        self.k = 2.0
    @functools.cached_property
    def double(self):
        return self.k * 2
DOUBLED = Doubled()
class UsesCached(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * DOUBLED.double
    @staticmethod
    def backward(ctx, g):
        return g * DOUBLED.double
def _change_base(i):
    DOUBLED.k = float(i + 1)
    if i == 2:
        DOUBLED.__dict__.pop("double", None)
_case("cached_property", UsesCached, x3, between=_change_base, state=lambda: dict(vars(DOUBLED)),
      reset=lambda: (DOUBLED.__dict__.pop("double", None), setattr(DOUBLED, "k", 2.0)))

# 5 a WeakKeyDictionary memo keyed by the input: an entry per live input
SEEN_INPUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
class KeyedByInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        SEEN_INPUTS[x] = x.shape[0]
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * len(SEEN_INPUTS)
_case("weak_key_memo", KeyedByInput, x3, reset=SEEN_INPUTS.clear)

# 6 a random.Random global drawn from in forward
DRAWS = random.Random(0)
class Draws(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * DRAWS.random()
    @staticmethod
    def backward(ctx, g):
        return g * 2
_case("random_instance", Draws, x3, state=lambda: DRAWS.getstate()[1][:3], reset=lambda: DRAWS.seed(0))

# 7 the environment, changed between calls and before backward
class FromEnv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * float(os.environ.get("MINIHOP_TEST_SCALE", "2"))
    @staticmethod
    def backward(ctx, g):
        return g * float(os.environ.get("MINIHOP_TEST_SCALE", "2"))
_case("environment", FromEnv, x3, between=lambda i: os.environ.__setitem__("MINIHOP_TEST_SCALE", str(i + 1)),
      mid=lambda i: os.environ.__setitem__("MINIHOP_TEST_SCALE", str(i + 5)),
      reset=lambda: os.environ.pop("MINIHOP_TEST_SCALE", None))

# 8 a forward hook added and removed between calls on a module global
LINEAR = torch.nn.Linear(3, 3)
HOOKS: list[Any] = []
class ThroughLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return LINEAR(x)
    @staticmethod
    def backward(ctx, g):
        return g * 2
def _toggle_hook(i):
    for h in HOOKS:
        h.remove()
    HOOKS.clear()
    if i % 2:
        HOOKS.append(LINEAR.register_forward_hook(lambda m, a, out: out * 3))
_case("forward_hook_toggled", ThroughLinear, x3, between=_toggle_hook, reset=lambda: _toggle_hook(0))

# 9 the grad mode read in both phases
class GradMode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2 if torch.is_grad_enabled() else 3)
    @staticmethod
    def backward(ctx, g):
        return g * (2 if torch.is_grad_enabled() else 3)
_case("grad_mode", GradMode, x3)

# 10 the deterministic-algorithms flag, switched between calls
class Deterministic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2 if torch.are_deterministic_algorithms_enabled() else 3)
    @staticmethod
    def backward(ctx, g):
        return g * 2
_case("deterministic_flag", Deterministic, x3, between=lambda i: torch.use_deterministic_algorithms(bool(i % 2)),
      reset=lambda: torch.use_deterministic_algorithms(False))

# 11 a frozen dataclass argument whose list grows between calls and before backward
@dataclasses.dataclass(frozen=True)
class Scales:
    values: list
SCALES = Scales([2.0])
class LastScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        ctx.cfg = cfg
        return x * cfg.values[-1]
    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfg.values[-1], None
_case("frozen_dataclass_list", LastScale, lambda i: (torch.arange(1.0, 4.0).requires_grad_(), SCALES),
      between=lambda i: SCALES.values.append(float(i)), mid=lambda i: SCALES.values.append(10.0 + i),
      reset=lambda: SCALES.values.__setitem__(slice(None), [2.0]))

# 12 the default dtype, switched between calls (what torch.ones makes)
class DefaultDtype(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.ones(3).sum() + torch.zeros(3).to(x.dtype)
    @staticmethod
    def backward(ctx, g):
        return g * torch.ones(()).dtype.itemsize
_case("default_dtype", DefaultDtype, x3,
      between=lambda i: torch.set_default_dtype(torch.float64 if i % 2 else torch.float32),
      state=lambda: str(torch.get_default_dtype()), reset=lambda: torch.set_default_dtype(torch.float32))


@pytest.mark.parametrize(("fn_cls", "make_args", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_eager(fn_cls: type, make_args: Callable[[int], tuple[Any, ...]], options: dict[str, Any]) -> None:
    reset = options.get("reset", lambda: None)
    try:
        eager_modes.matches_eager(fn_cls, make_args, **options)
    finally:
        reset()
