"""Names the code finds in builtins, and the user's module found through ``sys.modules``.

``len(v)`` finds ``len`` in builtins only while the code's module defines no global ``len``,
and finds whatever ``builtins.len`` holds: a capture that read neither kept calling the
captured one after ``len = my_len`` or ``builtins.max = ...`` (silently, strict and apply).
``sys.modules["mod"].S[0]`` read the user's module through a library one: the module was
watched, but the value read below it was not guarded; ``sys.modules[__name__]`` reaches a
module by a computed name, which no place bounds: that capture is single-use. Each case
against eager in strict, apply and fallback mode.
"""

from __future__ import annotations

import builtins
import sys

import torch

import minihop
from eager_modes import matches_eager

SCALES = [2.0]


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def _between(i: int) -> None:
    SCALES[0] = 2.0 + i


def _reset() -> None:
    SCALES[0] = 2.0


class Counted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, items):
        return x * len(items) * max(1.0, 2.0)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_a_global_defined_after_the_capture_shadows_a_builtin():
    def between(i):
        if i == 2:
            globals()["len"] = lambda v: 7
    try:
        matches_eager(Counted, lambda i: (_x(i), [1, 2]), between=between,
                      reset=lambda: globals().pop("len", None), refusable=False)
    finally:
        globals().pop("len", None)


def test_builtins_patched_after_the_capture():
    real_max = builtins.max

    def patched(*args, **kwargs):
        return 7.0 if args == (1.0, 2.0) else real_max(*args, **kwargs)

    def between(i):
        if i == 2:
            builtins.max = patched
    try:
        matches_eager(Counted, lambda i: (_x(i), [1, 2]), between=between,
                      reset=lambda: setattr(builtins, "max", real_max), refusable=False)
    finally:
        builtins.max = real_max


def test_builtin_names_are_one_identity_record():
    x = _x(0)
    text = str(minihop.explain(Counted, x, [1, 2]))
    assert "builtins.len is builtins.len" in text and "len is nothing" in text


class ByModuleName(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * sys.modules["test_builtin_names"].SCALES[0]

    @staticmethod
    def backward(ctx, g):
        return g * sys.modules["test_builtin_names"].SCALES[0]


class ByComputedName(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * sys.modules[__name__].SCALES[0]

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_value_read_through_sys_modules_by_name():
    assert __name__ == "test_builtin_names"  # (as pytest imports this file: the name read above)
    matches_eager(ByModuleName, lambda i: (_x(i),), between=_between, mid=lambda i: SCALES.__setitem__(0, 7.0 - i),
                  reset=_reset, refusable=False)


def test_sys_modules_by_a_computed_name_is_single_use():
    matches_eager(ByComputedName, lambda i: (_x(i),), between=_between, reset=_reset)
    x = _x(0)
    text = str(minihop.explain(ByComputedName, x))
    assert "single-use" in text and "sys.modules by a computed name" in text


class PowInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * (lambda: pow(2.0, 1))()


def _shadow_pow(v: float) -> None:
    # A fresh function each time: the one a backward was traced with is freed when the next
    # replaces it, and CPython may give the new one its id.
    globals().pop("pow", None) if v > 1 else globals().__setitem__("pow", lambda a, b, v=v: v)


def test_a_builtin_shadowed_before_backward_by_a_new_function_each_call():
    # (found by the reads fuzz run, seed 284034: backward's variants were keyed by the id of
    # what the name held, and a later function with a reused id ran the earlier's bwd)
    steps = [(3.0, 0.5), (3.0, 0.5), (3.0, 0.0), (0.0, 2.0)]
    try:
        matches_eager(PowInBackward, lambda i: (_x(i),), steps=len(steps),
                      between=lambda i: _shadow_pow(steps[i][0]), mid=lambda i: _shadow_pow(steps[i][1]),
                      reset=lambda: _shadow_pow(3.0), refusable=False)
    finally:
        _shadow_pow(3.0)
