"""The process's own settings, as one more object of the heap watch.

Place in the pipeline: tracer, asked by ``heap.snapshot``. Library functions change settings
that live in the interpreter or in torch, not in any object the code names:
``os.environ["K"] = v``, ``warnings.filterwarnings(...)``, ``sys.setrecursionlimit(n)``,
``torch.set_default_dtype(...)``, ``torch.use_deterministic_algorithms(...)``,
``torch.backends.cudnn.benchmark = True``, ``sys.setprofile(f)``, ``sys.path.append(p)``,
``os.chdir(d)``, ``socket.setdefaulttimeout(t)``, ``locale.setlocale(...)``, numpy's
``np.seterr(...)``/``np.set_printoptions(...)``. Run while tracing, such a change happens once (and a
backward's, while forward is traced), where eager makes it on every call, when that phase runs.
So the heap watch snapshots them all as one object (``state``: setting -> value, compared by
value), and any change is refused (``heap.RULES``: "a process setting changed") after it is put
back (``put_back``): ``fallback="eager"`` then makes it, as eager does.

Reads of these settings are guarded where they are read (``settings.py``, the environment,
the call key's default dtype); this module is about writes.

Invariant: what ``state`` lists, ``put_back`` can restore (a setting without a setter is
listed only if restoring it is never needed: it cannot be changed once set).
"""

from __future__ import annotations

import locale
import logging
import os
import socket
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["LOGGING", "PROCESS", "logging_levels", "put_back", "state"]


class _Process:
    """The one object standing for the process's settings in a snapshot."""

    def __repr__(self) -> str:
        return "the process's settings"


PROCESS = _Process()


def _set_filters(filters: tuple[Any, ...]) -> None:
    warnings.filters[:] = list(filters)
    warnings._filters_mutated()  # type: ignore[attr-defined]


def _backend_flag(module: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    return (lambda: getattr(module, name)), (lambda v: setattr(module, name, v))


_SETTINGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
    "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
    # (cpu is torch's own default: put back as None, with no device mode left pushed)
    "torch.get_default_device()": (torch.get_default_device,
                                   lambda v: torch.set_default_device(None if v == torch.device("cpu") else v)),
    "torch.are_deterministic_algorithms_enabled()": (
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "torch.is_anomaly_enabled()": (
        lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        lambda v: torch.autograd.set_detect_anomaly(v[0], check_nan=v[1])),
    "torch.get_float32_matmul_precision()": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "torch.backends.cudnn.benchmark": _backend_flag(torch.backends.cudnn, "benchmark"),
    "torch.backends.cudnn.deterministic": _backend_flag(torch.backends.cudnn, "deterministic"),
    "torch.backends.cudnn.enabled": _backend_flag(torch.backends.cudnn, "enabled"),
    "torch.backends.cudnn.allow_tf32": _backend_flag(torch.backends.cudnn, "allow_tf32"),
    "torch.backends.cuda.matmul.allow_tf32": _backend_flag(torch.backends.cuda.matmul, "allow_tf32"),
    "torch.backends.mkldnn.enabled": _backend_flag(torch.backends.mkldnn, "enabled"),
    "sys.getrecursionlimit()": (sys.getrecursionlimit, sys.setrecursionlimit),
    "sys.getswitchinterval()": (sys.getswitchinterval, sys.setswitchinterval),
    "warnings.filters": (lambda: tuple(warnings.filters), _set_filters),
    "logging.disable()": (lambda: logging.root.manager.disable, logging.disable),
    "sys.getprofile()": (sys.getprofile, sys.setprofile),
    "sys.path": (lambda: tuple(sys.path), lambda v: sys.path.__setitem__(slice(None), list(v))),
    "os.getcwd()": (os.getcwd, os.chdir),
    "socket.getdefaulttimeout()": (socket.getdefaulttimeout, socket.setdefaulttimeout),
    "locale.setlocale(locale.LC_ALL)": (lambda: locale.setlocale(locale.LC_ALL, None),
                                        lambda v: locale.setlocale(locale.LC_ALL, v)),
}


def _numpy(get: Callable[[Any], Any], set_: Callable[[Any, Any], None]) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """A numpy setting (its error handling, print options, buffer size), where numpy is
    imported: read without importing it."""
    def getter() -> Any:
        np = sys.modules.get("numpy")
        return None if np is None else get(np)

    def setter(value: Any) -> None:
        np = sys.modules.get("numpy")
        if np is not None and value is not None:
            set_(np, value)
    return getter, setter


_SETTINGS["numpy.geterr()"] = _numpy(lambda np: tuple(sorted(np.geterr().items())), lambda np, v: np.seterr(**dict(v)))
_SETTINGS["numpy.get_printoptions()"] = _numpy(lambda np: tuple(sorted(np.get_printoptions().items())),
                                               lambda np, v: np.set_printoptions(**dict(v)))
_SETTINGS["numpy.getbufsize()"] = _numpy(lambda np: np.getbufsize(), lambda np, v: np.setbufsize(v))


def _environ() -> dict[Any, Any]:
    return dict(getattr(os.environ, "_data", os.environ))  # the raw entries: no decoding per snapshot


def _set_environ(old: dict[Any, Any]) -> None:
    now = _environ()
    for key in {*now, *old}:
        if now.get(key) != old.get(key):
            name = os.fsdecode(key) if issubclass(type(key), bytes) else key
            if key in old:
                os.environ[name] = os.fsdecode(old[key]) if issubclass(type(old[key]), bytes) else old[key]
            else:
                os.environ.pop(name, None)


_SETTINGS["os.environ"] = (_environ, _set_environ)


def logging_levels(handlers: bool = True) -> tuple[Any, ...]:
    """Every logger's level, ``disabled`` and ``propagate`` flags, handlers and filters, every
    handler's level, and ``logging.disable``'s level: what decides which messages are sent and
    where, set by anyone (``log.level = 10``, ``log.disabled = True``, ``log.addHandler(h)``; a
    logger's own caches are not part of it). Without ``handlers``: the levels and flags only
    (what a read of whether a logger logs depends on). (Few objects made per logger: a
    program may hold thousands, and a capture snapshots them several times.)"""
    manager = logging.Logger.manager
    loggers = [("", logging.root), *((n, lg) for n, lg in list(manager.loggerDict.items()) if issubclass(type(lg), logging.Logger))]
    if not handlers:
        return (manager.disable, *((n, lg.level, lg.disabled, lg.propagate) for n, lg in loggers))
    return (manager.disable, tuple(h.level for _, lg in loggers for h in lg.handlers),
            *((n, lg.level, lg.disabled, lg.propagate, tuple(lg.handlers), tuple(lg.filters)) for n, lg in loggers))


def _set_logging_levels(old: tuple[Any, ...]) -> None:
    """Put back only what differs (``setLevel`` empties every logger's cache: once per logger
    would be quadratic in the number of loggers), the caches emptied once."""
    manager = logging.Logger.manager
    if manager.disable != old[0]:
        logging.disable(old[0])
    now = {entry[0]: entry for entry in logging_levels()[2:]}
    levels = False
    for entry in old[2:]:
        if now.get(entry[0]) == entry:
            continue
        name, level, disabled, propagate, handlers, filters = entry
        lg = logging.getLogger(name or None)
        levels = levels or lg.level != level
        lg.level, lg.disabled, lg.propagate = level, disabled, propagate
        lg.handlers[:], lg.filters[:] = list(handlers), list(filters)
    for h, h_level in zip((h for entry in old[2:] for h in entry[4]), old[1]):
        if h.level != h_level:
            h.setLevel(h_level)
    if levels:
        manager._clear_cache()  # type: ignore[attr-defined]


LOGGING = "logging's levels and handlers"  # (snapshotted only where the code reaches logging: ``state``)
_SETTINGS[LOGGING] = (logging_levels, _set_logging_levels)


def state(logging_too: bool = False) -> dict[str, Any]:
    """Every setting's value now (the environment as one: ``os.environ``); every logger's
    level only where asked (code that reaches ``logging`` or a logger: walking them all costs
    a capture more than the rest together)."""
    return {name: get() for name, (get, _) in _SETTINGS.items() if logging_too or name != LOGGING}


def put_back(name: str, value: Any) -> None:
    """Give setting ``name`` its value ``value`` again."""
    _SETTINGS[name][1](value)
