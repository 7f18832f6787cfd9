"""Process and context settings the code reads through a call: guarded like a global.

Place in the pipeline: tracer, asked by ``pystate`` for each value the code's chains name.
Some state is not an attribute anyone can snapshot but the answer of a call: torch's thread
counts (``torch.get_num_threads()``), a ``contextvars.ContextVar``'s ``.get()`` (the
context-local setting libraries use for "current precision", "current scale") and a
``functools.singledispatch`` function's table (``register`` adds to it in place). A capture bakes
the answer in, so a later call after ``torch.set_num_threads(2)``, ``VAR.set(3.0)`` or
``fn.register(Box)`` would reuse it. Each such read is a place whose value is the call's answer, checked on every call
(and before backward for backward's reads), as ``roots.FLAG_PLACES`` are.

Torch's backend flags are module attributes, read without a call (``torch.backends.mkldnn.enabled``,
``torch.backends.cudnn.benchmark``): torch's modules are otherwise not the user's state, so a chain
into ``torch.backends`` that ends at a plain value is a place too (``backends_place``).

Invariant: a call that reads a setting named here is guarded by the setting's value.
"""

from __future__ import annotations

import contextvars
import logging
import re
import types
from typing import Any

import torch

from ..place import walk_plain
from ..spec import AUTOCAST_DEVICES, MISSING, Place, Root
from .atoms import ATOMS
from .library import is_library, reads_trace_modes
from .process_state import logging_levels
from .roots import place_at, value_place

__all__ = ["backends_place", "setting_place"]

# A library's getter of process state: a public function named as one (``torch.get_num_threads``,
# ``torch.is_warn_always_enabled``, ``torch.get_deterministic_debug_mode``,
# ``sys.getrecursionlimit``, ``gc.isenabled``, ``os.getcwd``) that answers a plain value with no
# argument. Not one list of known settings: any of them (unknown means unsafe).
_GETTER = re.compile(r"^(get|is|are|has)[a-z_]")
# ... but those the call key holds, which autograd or autocast set otherwise inside the
# Function than at the call (a guard comparing them there would never match).
_IN_THE_KEY = frozenset(id(fn) for fn in (
    torch.is_grad_enabled, torch.is_inference_mode_enabled, torch.is_autocast_enabled,
    torch.is_autocast_cache_enabled, torch.get_autocast_dtype, torch.is_autocast_cpu_enabled))
# Methods of a torch.Generator answering its settings (``torch.default_generator.initial_seed()``).
_GENERATOR_READS = ("initial_seed",)


def _getter_place(end: Any) -> Place | None:
    if not issubclass(type(end), (types.FunctionType, types.BuiltinFunctionType)) or id(end) in _IN_THE_KEY \
            or not _GETTER.match(getattr(end, "__name__", "")) or not is_library(end) or reads_trace_modes(end) \
            or issubclass(type(getattr(end, "__self__", None)), (type, torch.Generator, contextvars.ContextVar)):
        return None
    try:
        answer = end()  # (a getter: what the guard asks on every call)
    except Exception:  # it needs arguments, or fails here: not a setting
        return None
    if not (answer is None or issubclass(type(answer), ATOMS)) or issubclass(type(answer), torch.Tensor):
        return None
    module = getattr(end, "__module__", None) or getattr(getattr(end, "__self__", None), "__name__", "")
    return value_place(f"{module}.{end.__name__}()".lstrip("."), lambda args: end())


# ``logging.getLogger(name)`` hands out a process-wide logger, whose level the code may read
# (``getLogger().level``, ``.getEffectiveLevel()``): every logger's level, keyed whole (as the
# environment is), since which logger is asked for is the call's argument.
_LOGGING = value_place("logging's levels (every logger's, and logging.disable)", lambda args: logging_levels(handlers=False))


# ``torch.get_autocast_dtype(device)``: the call key holds it only where autocast is on; off,
# the code may still read it (``if torch.get_autocast_dtype("cpu") == torch.float16``), and
# ``torch.set_autocast_dtype`` changes it between calls. Which device is the call's argument:
# every device's, keyed whole.
_AUTOCAST_DTYPES = value_place("torch.get_autocast_dtype(...) of every device", lambda args: _autocast_dtypes())


def _autocast_dtypes() -> tuple[Any, ...]:
    found = []
    for device in AUTOCAST_DEVICES:
        try:
            found.append(torch.get_autocast_dtype(device))
        except RuntimeError:  # a device type this build does not know
            found.append(None)
    return tuple(found)


def setting_place(end: Any) -> Place | None:
    """The place for ``end`` (what a chain of the code names) when calling it reads a setting."""
    if end is logging.getLogger:
        return _LOGGING
    if end is torch.get_autocast_dtype:
        return _AUTOCAST_DTYPES
    found = _getter_place(end)
    if found is not None:
        return found
    # Only functions and C methods are probed (getattr on any object could run its __getattr__).
    registry = getattr(end, "registry", None) if issubclass(type(end), types.FunctionType) and \
        callable(getattr(end, "dispatch", None)) else None
    if issubclass(type(registry), types.MappingProxyType):  # functools.singledispatch: its table
        return value_place(f"{getattr(end, '__qualname__', 'a singledispatch function')}'s registry",
                           lambda args: tuple(registry.items()))
    var = end.__self__ if issubclass(type(end), types.BuiltinMethodType) else None
    if issubclass(type(var), torch.Generator) and getattr(end, "__name__", "") in _GENERATOR_READS:
        method = getattr(var, end.__name__)
        return value_place(f"a torch.Generator's {end.__name__}()", lambda args: method())
    if issubclass(type(var), contextvars.ContextVar) and getattr(end, "__name__", "") == "get":
        return value_place(f"ContextVar {var.name!r}", lambda args: var.get(MISSING))
    return None


def backends_place(root: Root, value: Any, steps: tuple[tuple[str, Any], ...]) -> Place | None:
    """The place of a flag of ``torch.backends`` that a chain reads (a plain value: a bool, a
    number, a string), from a root holding ``torch`` or one of its backends modules."""
    if not issubclass(type(value), types.ModuleType) or not (value.__name__ + ".").startswith("torch."):
        return None
    inside = value.__name__.startswith("torch.backends")
    for k in range(len(steps)):
        if steps[k][0] != "attr":
            return None
        now = walk_plain(value, steps[:k + 1])
        if issubclass(type(now), types.ModuleType):
            inside = inside or now.__name__.startswith("torch.backends")
        elif inside and k == len(steps) - 1 and (now is None or issubclass(type(now), ATOMS)):
            return place_at(root, steps)
        else:
            return None
    return None
