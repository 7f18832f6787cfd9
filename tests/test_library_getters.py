"""Process state a library answers through a getter or an object of its own.

torch was trusted whole: a call of its Python-level getters (``torch.is_warn_always_enabled()``,
``torch.get_deterministic_debug_mode()``) answered a value the capture kept, and a flag read
through one of its objects (``torch.backends.cuda.matmul.allow_tf32``) or logging's
(``logging.root.level``, ``logging.getLogger().level``) was not followed: each read as the
captured value after it changed, with no error. Settings were a list of known getters. Now any
library function named as a getter that answers a plain value with no argument is a setting
(``tracer.settings``: its answer checked on every call), as is what a chain reads through a
library's objects (``module_reads.library_binding``), and ``logging.getLogger`` reads every
logger's level. Each case against eager in strict, apply and fallback mode.
"""

from __future__ import annotations

import gc
import logging

import pytest
import torch

from eager_modes import matches_eager


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def _branching_on(read):
    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (3.0 if read() else 2.0)

        @staticmethod
        def backward(ctx, g):
            return g
    return Branch


_LOGGER = logging.getLogger("minihop.test_library_getters")
_FLAGS = {
    "torch.is_warn_always_enabled()": (lambda: torch.is_warn_always_enabled(), torch.set_warn_always, False),
    "torch.get_deterministic_debug_mode()": (lambda: torch.get_deterministic_debug_mode() > 0,
                                             lambda on: torch.set_deterministic_debug_mode(1 if on else 0), False),
    "gc.isenabled()": (lambda: gc.isenabled(), lambda on: gc.enable() if on else gc.disable(), True),
    "torch.backends.cuda.matmul.allow_tf32": (lambda: torch.backends.cuda.matmul.allow_tf32,
                                              lambda on: setattr(torch.backends.cuda.matmul, "allow_tf32", on), False),
    "logging.root.level": (lambda: logging.root.level <= logging.DEBUG,
                           lambda on: logging.root.setLevel(logging.DEBUG if on else logging.WARNING), False),
    "logging.getLogger(name).level": (lambda: logging.getLogger("minihop.test_library_getters").level == logging.DEBUG,
                                      lambda on: _LOGGER.setLevel(logging.DEBUG if on else logging.NOTSET), False),
}


@pytest.mark.parametrize("read", sorted(_FLAGS))
def test_a_setting_read_through_a_library_changed_between_calls(read):
    get, put, start = _FLAGS[read]
    was = get()
    try:
        matches_eager(_branching_on(get), lambda i: (_x(i),), between=lambda i: put(bool(i % 2) != start),
                      reset=lambda: put(start), refusable=False)
    finally:
        put(was)


def test_a_getter_read_in_backward_changed_before_backward():
    class Late(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (3.0 if torch.is_warn_always_enabled() else 1.0)
    try:
        matches_eager(Late, lambda i: (_x(i),), mid=lambda i: torch.set_warn_always(i % 2 == 1),
                      reset=lambda: torch.set_warn_always(False), refusable=False)
    finally:
        torch.set_warn_always(False)
