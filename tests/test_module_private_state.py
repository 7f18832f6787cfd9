"""An ``nn.Module``'s own attributes with a leading underscore are its state like any other.

Users keep counters, scales and flags on their modules as ``self._calls``, ``self._scale``,
``self._frozen``; torch's own modules keep theirs the same way (``Conv2d``'s
``_reversed_padding_repeated_twice``, ``MultiheadAttention``'s ``_qkv_same_embed_dim``). Only
nn.Module's bookkeeping (the parameter, buffer, submodule and hook dicts) is not: found as a
bug where the guards and the heap watch skipped every name starting with ``_`` — a module
argument's ``m._scale`` changed between calls reused the capture's old value, and
``m._calls += 1`` was made once, silently, in every mode.

Each case is a Function written as a user writes it, run against eager in strict, apply and
fallback mode (``eager_modes.matches_eager``): values, every ``.grad``, and the module's state
after each call.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import minihop
from eager_modes import matches_eager


class Scaler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._scale = 2.0
        self._calls = 0
        self._frozen = False
        self._seen: list[int] = []


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Scaler()


def _x(i: int) -> torch.Tensor:
    return (torch.arange(6.0).reshape(2, 3) / 7 + i).requires_grad_()


# How the Function reaches the module: as an argument, a submodule of an argument, a global,
# a closure value.
HOLDERS = ("arg", "submodule", "global", "closure")
# What it does with a private attribute: reads it in forward or in backward (through ctx),
# branches on it, counts calls in it, appends to a private list.
USES = ("read_fwd", "read_bwd", "branch", "count_fwd", "count_bwd", "append")
# What the caller changes: between calls, between forward and backward, nothing.
CHANGES = ("between", "mid", "none")

GLOBAL_MOD: Scaler = Scaler()


def _make(holder: str, use: str) -> tuple[type, callable, callable]:
    box = {"mod": Scaler() if holder != "submodule" else Outer()}
    closure_mod = box["mod"]

    def module_of(arg: torch.nn.Module | None) -> Scaler:
        if holder == "arg":
            return arg
        if holder == "submodule":
            return arg.inner
        if holder == "global":
            return GLOBAL_MOD
        return closure_mod

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            mod = module_of(m)
            ctx.mod = mod
            if use == "read_fwd":
                return x * mod._scale
            if use == "branch":
                return x.sin() if mod._frozen else x.cos()
            if use == "count_fwd":
                mod._calls += 1
            if use == "append":
                mod._seen.append(1)
            return x * 3.0

        @staticmethod
        def backward(ctx, g):
            mod = ctx.mod
            if use == "read_bwd":
                return g * mod._scale, None
            if use == "count_bwd":
                mod._calls += 1
            if use == "branch":
                return g, None
            return g * (1.0 if use == "read_fwd" else 3.0), None

    def target() -> Scaler:
        if holder in ("arg", "closure"):
            return closure_mod
        if holder == "submodule":
            return closure_mod.inner
        return GLOBAL_MOD

    def make_args(i: int) -> tuple:
        return (_x(i), closure_mod if holder in ("arg", "submodule") else None)

    return F, make_args, target


def _reset_global() -> None:
    GLOBAL_MOD.__init__()


@pytest.mark.parametrize("holder,use,change", list(itertools.product(HOLDERS, USES, CHANGES)))
def test_private_attribute(holder: str, use: str, change: str) -> None:
    F, make_args, target = _make(holder, use)

    def reset() -> None:
        _reset_global()
        mod = target()
        mod._scale, mod._calls, mod._frozen, mod._seen = 2.0, 0, False, []

    def flip(i: int) -> None:
        mod = target()
        mod._scale = 2.0 + i
        mod._frozen = i % 2 == 1

    def state() -> tuple:
        mod = target()
        return (mod._scale, mod._calls, mod._frozen, list(mod._seen))

    matches_eager(F, make_args, steps=4, reset=reset, state=state,
                  between=flip if change == "between" else (lambda i: None),
                  mid=flip if change == "mid" else (lambda i: None), refusable=False)


def test_private_scale_changed_between_calls_is_a_miss() -> None:
    """The bug's own case, checked directly: the second call sees the new ``_scale``."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return x * m._scale

        @staticmethod
        def backward(ctx, g):
            return g, None

    m = Scaler()
    f = minihop.function(F)
    x = torch.ones(3)
    assert f(x, m).tolist() == [2.0, 2.0, 2.0]
    m._scale = 5.0
    assert f(x, m).tolist() == [5.0, 5.0, 5.0]


@pytest.mark.parametrize("make", [lambda: torch.nn.Conv2d(1, 2, 3, padding=1),
                                  lambda: torch.nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")],
                         ids=["zeros", "reflect"])
def test_torch_module_private_state(make) -> None:
    """A torch module whose forward reads its own private attribute (``Conv2d`` with a padding
    mode reads ``_reversed_padding_repeated_twice``): called inside forward, as eager."""
    conv = make()

    class ConvFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c):
            ctx.save_for_backward(x)
            return c(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g.sum() * torch.ones_like(x), None

    def between(i: int) -> None:
        if i == 2:  # the padding torch's forward reads, changed as a user could
            conv._reversed_padding_repeated_twice = [0, 0, 0, 0] if conv.padding_mode == "zeros" else [1, 1, 1, 1]

    def make_args(i: int) -> tuple:
        return (torch.randn(1, 1, 5, 5, generator=torch.Generator().manual_seed(i)).requires_grad_(), conv)

    matches_eager(ConvFn, make_args, steps=3, between=between, refusable=True)


def test_explain_shows_a_modules_training_flag_once() -> None:
    """The module argument's guard line names ``training`` once (its attributes, which include
    ``training`` since every attribute is keyed, printed it a second time)."""

    class Dropped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, drop):
            return drop(x) * 1.0

        @staticmethod
        def backward(ctx, g):
            return g, None

    report = minihop.explain(Dropped, torch.ones(3, requires_grad=True), torch.nn.Dropout(0.3).eval(),
                             print_report=False)
    line = next(g for g in report.guards if g.startswith("drop:"))
    assert "Dropout (training=False, p=0.3, inplace=False)" in line, line
