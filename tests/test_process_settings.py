"""Process-wide settings written by forward or backward through library calls: the environment,
``warnings``' filters, the recursion limit, torch's default dtype, thread count, deterministic
and anomaly modes, a cudnn flag, ``logging.disable``, ``sys.path``, the working directory,
``socket``'s default timeout, the locale, the profile function; and the user's module reached through a
library one (``sys.modules["cfg"].n += 1``).

No chain of the code names where these live, so the heap watch snapshots them as one object
(``tracer/process_state.py``): a change is put back and refused (MH106), and fallback makes it
eagerly. Before, each was made once, while tracing (a backward's while forward was traced),
and never on later calls: silent in strict and fallback mode alike. Each case runs eagerly and
in strict, apply and fallback mode (``eager_modes.matches_eager``); the setting is part of the
recorded state, read after forward and after backward.
"""

from __future__ import annotations

import locale
import logging
import os
import socket
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import eager_modes
import minihop
import minihop.errors


def _function(forward: str, backward: str = "pass") -> type:
    ns: dict[str, Any] = {"torch": torch, "os": os, "sys": sys, "warnings": warnings, "logging": logging,
                          "socket": socket, "locale": locale, "PROFILE": _profile}
    exec(f"""
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        {forward}
        return x * 2

    @staticmethod
    def backward(ctx, g):
        {backward}
        return g * 2
""", ns)
    return ns["F"]


_FILTERS = list(warnings.filters)
_THREADS = torch.get_num_threads()
_LIMIT = sys.getrecursionlimit()
_BENCHMARK = torch.backends.cudnn.benchmark
_PATH = list(sys.path)
_CWD = os.getcwd()
_TIMEOUT = socket.getdefaulttimeout()
_CTYPE = locale.setlocale(locale.LC_CTYPE)
_PROFILER = sys.getprofile()


def _profile(frame: Any, event: str, arg: Any) -> None:
    """A profile function that does nothing (set by the Function under test)."""


def _restore_path() -> None:
    sys.path[:] = _PATH


def _restore_filters() -> None:
    warnings.filters[:] = _FILTERS
    warnings._filters_mutated()  # type: ignore[attr-defined]


# name: (the write, its state, how to undo it)
WRITES: dict[str, tuple[str, Callable[[], Any], Callable[[], Any]]] = {
    "environment": ("os.environ['MINIHOP_T'] = os.environ.get('MINIHOP_T', '') + 'x'",
                    lambda: os.environ.get("MINIHOP_T"), lambda: os.environ.pop("MINIHOP_T", None)),
    "warnings_filter": ("warnings.filterwarnings('ignore', message='minihop-test-%d' % len(warnings.filters))",
                        lambda: len(warnings.filters), _restore_filters),
    "recursion_limit": ("sys.setrecursionlimit(sys.getrecursionlimit() + 1)", sys.getrecursionlimit,
                        lambda: sys.setrecursionlimit(_LIMIT)),
    "default_dtype": ("torch.set_default_dtype(torch.float64)", lambda: str(torch.get_default_dtype()),
                      lambda: torch.set_default_dtype(torch.float32)),
    "threads": ("torch.set_num_threads(1)", torch.get_num_threads, lambda: torch.set_num_threads(_THREADS)),
    "deterministic": ("torch.use_deterministic_algorithms(not torch.are_deterministic_algorithms_enabled())",
                      torch.are_deterministic_algorithms_enabled, lambda: torch.use_deterministic_algorithms(False)),
    "anomaly": ("torch.autograd.set_detect_anomaly(not torch.is_anomaly_enabled())", torch.is_anomaly_enabled,
                lambda: torch.autograd.set_detect_anomaly(False)),
    "cudnn_flag": ("torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark",
                   lambda: torch.backends.cudnn.benchmark, lambda: setattr(torch.backends.cudnn, "benchmark", _BENCHMARK)),
    "logging_disable": ("logging.disable(logging.DEBUG + len(x))", lambda: logging.root.manager.disable,
                        lambda: logging.disable(logging.NOTSET)),
    # Found from outside after the list above (each made once, while tracing, before):
    "sys_path": ("sys.path.append('/minihop-test-%d' % len(sys.path))", lambda: len(sys.path), _restore_path),
    "working_directory": ("os.chdir('/' if os.getcwd() != '/' else os.path.expanduser('~'))", os.getcwd,
                          lambda: os.chdir(_CWD)),
    "socket_timeout": ("socket.setdefaulttimeout((socket.getdefaulttimeout() or 0) + 1.0)",
                       socket.getdefaulttimeout, lambda: socket.setdefaulttimeout(_TIMEOUT)),
    "locale": ("locale.setlocale(locale.LC_CTYPE, 'C' if locale.setlocale(locale.LC_CTYPE) != 'C' else 'C.UTF-8')",
               lambda: locale.setlocale(locale.LC_CTYPE), lambda: locale.setlocale(locale.LC_CTYPE, _CTYPE)),
    "profile_function": ("sys.setprofile(None if sys.getprofile() is PROFILE else PROFILE)",
                         lambda: sys.getprofile() is _profile, lambda: sys.setprofile(_PROFILER)),
}


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("setting", list(WRITES))
def test_a_process_setting_written_matches_eager(setting: str, phase: str) -> None:
    write, state, undo = WRITES[setting]
    fn = _function(write) if phase == "forward" else _function("pass", write)
    try:
        eager_modes.matches_eager(fn, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),), state=state, reset=undo)
    finally:
        undo()


def test_the_users_module_through_sys_modules_matches_eager() -> None:
    """``sys.modules["cfg"].n += 1``: a chain from a library module reaching the user's module
    makes that module a root of its own; the counter is replayed on every call."""
    mod = types.ModuleType("minihop_test_counter")
    mod.n = 0
    sys.modules["minihop_test_counter"] = mod
    try:
        fn = _function("sys.modules['minihop_test_counter'].n += 1", "sys.modules['minihop_test_counter'].n += 10")
        eager_modes.matches_eager(fn, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),),
                                  state=lambda: mod.n, reset=lambda: setattr(mod, "n", 0), refusable=False)
    finally:
        del sys.modules["minihop_test_counter"]


def test_the_default_device_written_in_forward_matches_eager() -> None:
    """(Not through ``matches_eager``: its own bookkeeping would make meta tensors.) Strict
    refuses and leaves the device as it was; fallback leaves it as eager does."""
    fn = _function("torch.set_default_device('meta')")
    x = torch.arange(1.0, 4.0).requires_grad_()
    try:
        fn.apply(x)
        eager = str(torch.get_default_device())
        torch.set_default_device(None)
        # (named by the setter the code calls: held back while traced, tracer/hidden.py)
        with pytest.raises(minihop.errors.SideEffectError, match=r"torch\.set_default_device"):
            minihop.function(fn)(x)
        assert str(torch.get_default_device()) == "cpu"
        with pytest.warns(UserWarning, match="eagerly"):
            minihop.function(fn, fallback="eager")(x)
        assert str(torch.get_default_device()) == eager == "meta"
    finally:
        torch.set_default_device(None)
