"""What a key left out: a function's names and attributes, a class's names, a library's lists.

Code dispatches on ``act.__name__``, reads a setting kept on a function (``fn.scale``), tells
objects apart by ``type(cfg).__name__``, and asks ``"--debug" in sys.argv``. A function's key
was its identity, code and defaults; a class's, its dict (which holds no ``__name__``); a
library module's names were followed only to functions, classes and constants. Each of these
was read as its captured value after it changed, with no error. Now a function's key holds its
names and, by value, what is set on it (``runtime.function_keys``, ``guards.value_key``); a
class's, its names; a plain container a library module holds and the user's code reads, its
items (``tracer.module_reads.library_binding``). Each case against eager in strict, apply and
fallback mode.
"""

from __future__ import annotations

import sys

import pytest
import torch

import minihop
from eager_modes import matches_eager


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def _act(t):
    return t


class _Config:
    pass


@pytest.fixture(autouse=True)
def _as_written():
    yield
    _act.__name__, _act.__qualname__ = "_act", "_act"
    vars(_act).pop("scale", None)
    _Config.__name__ = _Config.__qualname__ = "_Config"
    while "--minihop-test-flag" in sys.argv:
        sys.argv.remove("--minihop-test-flag")


def test_a_function_passed_in_dispatched_on_by_its_name():
    class Dispatch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fn):
            return x * (3.0 if fn.__name__ == "_act" else 1.0) * len(fn.__qualname__)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def rename(i):
        _act.__name__ = "_act" if i % 2 == 0 else "other"
        _act.__qualname__ = "a" * (1 + i)
    matches_eager(Dispatch, lambda i: (_x(i), _act), between=rename, reset=lambda: rename(0))


def test_a_setting_kept_on_a_function_passed_in():
    _act.scale = 2.0

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fn):
            return fn(x) * fn.scale

        @staticmethod
        def backward(ctx, g):
            return g, None
    matches_eager(Scaled, lambda i: (_x(i), _act), between=lambda i: setattr(_act, "scale", 2.0 + i),
                  reset=lambda: setattr(_act, "scale", 2.0))


def test_a_function_held_in_a_global_gains_a_setting():
    # (its attributes part of its key: one set after the capture is a changed value)
    held = [_act]

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * getattr(held[0], "scale", 1.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def btw(i):
        if i % 2:
            _act.scale = 2.0 + i
        else:
            vars(_act).pop("scale", None)
    matches_eager(Scaled, lambda i: (_x(i),), between=btw, reset=lambda: btw(0))


def test_an_objects_class_told_apart_by_its_name():
    c = _Config()

    class Named(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c):
            return x * (2.0 if type(c).__name__ == "_Config" else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def rename(i):
        _Config.__name__ = "_Config" if i % 2 == 0 else "Other"
    matches_eager(Named, lambda i: (_x(i), c), between=rename, reset=lambda: rename(0))


def test_a_flag_read_from_sys_argv():
    class Flagged(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (3.0 if "--minihop-test-flag" in sys.argv else 2.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def flag(i):
        if i % 2 and "--minihop-test-flag" not in sys.argv:
            sys.argv.append("--minihop-test-flag")
        elif i % 2 == 0 and "--minihop-test-flag" in sys.argv:
            sys.argv.remove("--minihop-test-flag")
    matches_eager(Flagged, lambda i: (_x(i),), between=flag, reset=lambda: flag(0))


def test_a_direct_capture_names_the_changed_function_setting_and_argv():
    _act.scale = 2.0

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fn):
            return fn(x) * fn.scale * (3.0 if "--minihop-test-flag" in sys.argv else 1.0)

        @staticmethod
        def backward(ctx, g):
            return g, None
    x = _x(0)
    cap = minihop.capture(Scaled, x, _act)
    assert "sys.argv read by forward: == [" in str(minihop.explain(Scaled, x, _act))
    _act.scale = 3.0
    with pytest.raises(minihop.GuardMismatchError, match=r"\(fn\), attributes, scale:\n  captured: 2.0\n  found:    3.0"):
        cap(x, _act)
    _act.scale = 2.0
    sys.argv.append("--minihop-test-flag")
    with pytest.raises(minihop.GuardMismatchError, match="sys.argv"):
        cap(x, _act)
