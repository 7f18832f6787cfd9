"""A library's state written by the user's code in forward or backward, through a setter or a list.

``torch.set_warn_always(...)``, ``torch.set_printoptions(...)``, ``logger.setLevel(...)``
called in forward changed the library's state once, while tracing, where eager changes it on
every call; ``sys.argv.append(...)`` likewise. Process settings were a list
(``tracer/process_state.py``); these were not on it. Now any library function, class or
library object's method named as a setter that the user's code calls is held back while
traced and refused (MH106; ``fallback="eager"`` makes it, as eager does), but those minihop
models (grad mode, torch's generator state); and a plain container a library module holds that
the code reaches is watched as the user's containers are (its appends replayed). Each case
against eager in strict, apply and fallback mode, with the library's state after every call.
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch

import minihop
from eager_modes import matches_eager


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


_LOGGER = logging.getLogger("minihop.test_library_setters")


def _setting_in_forward(call):
    class Sets(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            call()
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g
    return Sets


_SETTERS = {
    "torch.set_warn_always": (lambda: torch.set_warn_always(not torch.is_warn_always_enabled()),
                              torch.is_warn_always_enabled, lambda: torch.set_warn_always(False)),
    "torch.set_printoptions": (lambda: torch.set_printoptions(precision=torch._tensor_str.PRINT_OPTS.precision + 1),
                               lambda: torch._tensor_str.PRINT_OPTS.precision, lambda: torch.set_printoptions(precision=4)),
    "Logger.setLevel": (lambda: _LOGGER.setLevel(_LOGGER.level + 1), lambda: _LOGGER.level, lambda: _LOGGER.setLevel(0)),
}


@pytest.mark.parametrize("setter", sorted(_SETTERS))
def test_a_library_setter_called_in_forward_is_made_on_every_call(setter):
    call, state, reset = _SETTERS[setter]
    try:
        matches_eager(_setting_in_forward(call), lambda i: (_x(i),), reset=reset, state=state)
    finally:
        reset()


def test_a_setter_in_strict_mode_is_refused_and_leaves_the_setting_alone():
    before = torch.is_warn_always_enabled()
    with pytest.raises(minihop.SideEffectError, match=r"calls `torch.set_warn_always` .*a library's setter"):
        minihop.capture(_setting_in_forward(lambda: torch.set_warn_always(not before)), _x(0))
    assert torch.is_warn_always_enabled() is before


def test_a_setter_the_users_code_catches_is_refused_all_the_same():
    def quietly():
        try:
            torch.set_warn_always(True)
        except Exception:
            pass
    try:
        with pytest.raises(minihop.SideEffectError, match="torch.set_warn_always"):
            minihop.capture(_setting_in_forward(quietly), _x(0))
    finally:
        torch.set_warn_always(False)


def test_what_minihop_models_and_the_users_own_setters_are_captured():
    scale = [2.0]

    def set_scale(v):  # (the user's: its write is the heap watch's)
        scale[0] = v

    class Modelled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            set_scale(2.0)
            with torch.set_grad_enabled(True):
                return x * scale[0]

        @staticmethod
        def backward(ctx, g):
            return g * 2
    matches_eager(Modelled, lambda i: (_x(i),), refusable=False)


def test_a_list_a_library_module_holds_appended_to_in_forward():
    flag = "--minihop-test-appended"

    def clear():
        sys.argv[:] = [a for a in sys.argv if a != flag]

    class Appends(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            sys.argv.append(flag)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g
    try:
        matches_eager(Appends, lambda i: (_x(i),), reset=clear, state=lambda: sys.argv.count(flag))
    finally:
        clear()


_HELD = {"setters": [torch.set_warn_always]}


@pytest.mark.parametrize("reach", ["an item", "an argument", "a partial", "getattr with a constant name"])
def test_a_setter_reached_other_ways_is_made_on_every_call(reach):
    # (held back where it can be swapped: getattr(torch, "k") reads as torch.k; else the
    # capture is single-use, its trace making the setting once for its own call)
    import functools
    flip = {"an item": lambda fn: _HELD["setters"][0](not torch.is_warn_always_enabled()),
            "an argument": lambda fn: fn(not torch.is_warn_always_enabled()),
            "a partial": lambda fn: functools.partial(torch.set_warn_always)(not torch.is_warn_always_enabled()),
            "getattr with a constant name": lambda fn: getattr(torch, "set_warn_always")(not torch.is_warn_always_enabled())}[reach]

    class Flips(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fn):
            flip(fn)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g, None
    try:
        matches_eager(Flips, lambda i: (_x(i), torch.set_warn_always), reset=lambda: torch.set_warn_always(False),
                      state=torch.is_warn_always_enabled)
    finally:
        torch.set_warn_always(False)


def test_a_library_function_read_through_getattr_with_a_constant_name_is_guarded():
    import torch.nn.functional as F
    real = F.softsign

    class Act(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return getattr(F, "softsign")(x)

        @staticmethod
        def backward(ctx, g):
            return g
    try:
        matches_eager(Act, lambda i: (_x(i),), between=lambda i: setattr(F, "softsign", torch.tanh if i % 2 else real),
                      reset=lambda: setattr(F, "softsign", real), refusable=False)
    finally:
        F.softsign = real


def test_a_loggers_attributes_set_in_forward_are_made_on_every_call():
    # (``log.disabled = ...``, ``logging.root.level = ...``: not a setter's call, an attribute
    # written; every logger's level is one of the process's settings, tracer/process_state.py)
    level = logging.root.level

    class Toggles(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            _LOGGER.disabled = not _LOGGER.disabled
            logging.root.level = logging.root.level + 1
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    def reset():
        _LOGGER.disabled = False
        logging.root.setLevel(level)
    try:
        matches_eager(Toggles, lambda i: (_x(i),), reset=reset, state=lambda: (_LOGGER.disabled, logging.root.level))
    finally:
        reset()
