"""Python state kept out of sight: random generators, iterators and clocks.

Place in the pipeline: tracer, asked by ``pystate.StateTracker``. A number the user's code
takes from one of these while it is traced (``random.random()``, ``np.random.rand()``,
``next(counter)`` on an ``itertools.count``, ``time.time()``) would be a constant in the
graphs: every call would reuse the traced draw, where eager draws again. pystate finds
changes by comparing attributes and containers, which these objects do not have, so this
module gives it their state as a value to compare (``fingerprint``: a generator's state, an
iterator's position), names the process-wide generators everyone reaches through a library
module (``global_generators``), and watches clock and entropy reads while the user's code
runs (``ClockWatch``). pystate refuses any change (MH106); none is ever replayed.

Invariant: after tracing, every random generator is as it was before (``restore``), so a
refused capture followed by an eager run (``fallback="eager"``) draws what eager would. An
iterator cannot be wound back: the value tracing took from it is gone.
"""

from __future__ import annotations

import functools
import importlib
import pickle
import random
import re
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import SideEffectError
from ..spec import MISSING, Place, StateWrite
from ..library_state import library_module
from ..user_code import served_by_user_code
from .atoms import CONSTANTS, holds_tensor
from .cache_entries import (NOT_FETCHED, called, caching, cached_entry, computed_for_this_call, entry_routes, fetched_entry,
                            made_entry, stale_cache_check, traced_call)
from .effects import held
from .identity import SWAPPED_IN

__all__ = ["ReadWatch", "describe_global", "describe_read", "fingerprint", "refusal", "restore", "setter", "taking",
           "watched"]

# Reads of the clock and of the system's entropy: a value that differs on every call.
_CLOCKS = {"time": ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic",
                    "monotonic_ns", "process_time", "process_time_ns"),
           "os": ("urandom", "getrandom"), "uuid": ("uuid1", "uuid4"),
           # The seed torch's generator was last given: a value, not a draw, but the caller
           # reseeds between calls and no guard keys it, so the capture is single-use.
           "torch": ("initial_seed", "is_inference_mode_enabled"), "torch.cuda": ("initial_seed",)}
# Refused, not single-use: a call under inference_mode is traced outside it (pipeline), so
# even a capture made for that call would read False where eager reads True.
_INFERENCE_READ = "torch.is_inference_mode_enabled"
_SEED_READS = ("torch.initial_seed", "torch.cuda.initial_seed")
# Seeding torch's generators: not a tensor operation, so it would run once, while tracing.
# (torch's and torch.cuda's ``set_rng_state`` are not: they are graph nodes, see recompute.)
_SEEDS = {"torch": ("manual_seed", "seed"),
          "torch.random": ("manual_seed", "seed"),
          "torch.cuda": ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state_all")}
# Messages (``from warnings import warn``, ``from logging import info``): sent once while
# tracing, never by the graphs; refused (messages.MessageWatch sees the module-attribute calls).
_MESSAGES = {"warnings": ("warn", "warn_explicit"),
             "logging": ("debug", "info", "warning", "warn", "error", "exception", "critical", "log")}
_REGISTRARS = {"weakref": ("finalize",)}  # a callback run later (when an object dies): as a setter's


def _numpy_generator(value: Any) -> Any:
    """The object holding a numpy random generator's state, or None for anything else."""
    if not (type(value).__module__ or "").startswith("numpy.random"):
        return None
    holder = getattr(value, "bit_generator", value)  # Generator -> its BitGenerator
    return holder if hasattr(holder, "get_state") or hasattr(holder, "state") else None


def fingerprint(value: Any) -> Any:
    """A comparable copy of the state ``value`` keeps out of its attributes, or None when it
    is not such an object: a ``random.Random``, a numpy generator, an iterator of the
    standard library or a generator."""
    cls = type(value)  # by type: isinstance on a traced tensor would ask its __class__
    if issubclass(cls, random.Random):
        try:
            return value.getstate()
        except NotImplementedError:  # SystemRandom: the OS's entropy, read fresh each time
            return None
    holder = _numpy_generator(value)
    if holder is not None:
        state = holder.get_state(legacy=False) if hasattr(holder, "get_state") else holder.state
        return pickle.dumps(state)
    if cls is types.GeneratorType:
        frame = value.gi_frame
        if frame is None:
            return ()  # finished: it cannot change any more
        return (frame.f_lasti, tuple((k, id(v), v if issubclass(type(v), CONSTANTS) else None)
                                     for k, v in frame.f_locals.items()))
    if cls.__module__ in ("itertools", "builtins") and hasattr(cls, "__next__"):
        try:
            return value.__reduce__()  # (class, args, position): moves as it is advanced
        except Exception:
            return None
    return None


def taking(value: Any) -> str:
    """How code takes a value out of ``value``, for an error: a draw or an iterator's next."""
    if issubclass(type(value), random.Random) or _numpy_generator(value) is not None:
        return "draws from"
    return "takes the next value of"


def restore(value: Any, state: Any) -> None:
    """Put a random generator back to a ``fingerprint`` taken of it (iterators cannot be)."""
    if issubclass(type(value), random.Random):
        value.setstate(state)
        return
    holder = _numpy_generator(value)
    if holder is not None:
        if hasattr(holder, "set_state"):
            holder.set_state(pickle.loads(state))
        else:
            holder.state = pickle.loads(state)


_GLOBAL = {"random": "Python's random module", "numpy": "numpy's global random state"}


def watched(value: Any) -> tuple[str, str] | None:
    """(kind, name) when ``value`` is a clock or entropy read (kind "clock"), a function of
    Python's or numpy's process-wide generator ("random", "numpy": ``random.random``,
    ``np.random.rand`` and the like, bound methods of one generator hidden in the module), or
    one that seeds torch's generators ("seed": ``torch.manual_seed``), one that sends a
    message ("message": ``warnings.warn``, ``logging.info``, bound by any name), or a
    ``functools.lru_cache`` helper ("uncached": its cache would keep the trace's fake tensors
    and hand them to the user's code later, so tracing calls the function it wraps)."""
    if caching(value):
        # An lru_cache'd method (``self.table(n)``) too: its cache is shared by the class; and
        # another library's cache of the same protocol (``cachetools.cached``).
        return ("uncached", getattr(value, "__qualname__", "an lru_cache function"))
    found = _watched_functions(sys.modules.get("numpy.random.mtrand")).get(id(value))
    return found if found is not None or not _setter(value) else ("setter", _named(value))


# A library's setter, called by the user's code (``torch.set_warn_always(True)``,
# ``logger.setLevel(...)``, ``atexit.register(fn)``): it changes the library's state (a callback
# run later too), which no snapshot holds. Not a list of known ones: any function, class or
# library object's method named as a setter or registration (not the builtin ``set``), but those
# minihop models (grad mode, recorded; torch's generator state: graph nodes, see recompute) and
# the objects whose state is watched or keyed otherwise (tensors, modules, generators, ctx).
_SETTER = re.compile(r"^(?:(?:set|enable|disable|use)(?:_|[A-Z])|(?:un)?register(?:_|[A-Z]|$)|add_?\w*hook$)")
_MODELLED = frozenset(id(fn) for fn in (
    torch.set_grad_enabled, torch.enable_grad, torch.autograd.set_grad_enabled, torch.autograd.enable_grad,
    torch.set_rng_state, torch.random.set_rng_state, torch.cuda.set_rng_state))
_OWNED = (torch.Tensor, torch.nn.Module, torch.Generator, random.Random, type, torch.autograd.function.FunctionCtx)


def setter(value: Any) -> bool:
    """Whether calling ``value`` (a partial's function too) is a library's setter."""
    return _setter(value.func if issubclass(type(value), functools.partial) else value)


def _setter(value: Any) -> bool:
    if served_by_user_code(value, "__name__", library_module):
        return False  # (the user's object, answering by its own ``__getattr__``: not a library's setter)
    name = getattr(value, "__name__", None)
    if not issubclass(type(name), str) or not _SETTER.match(name) or id(value) in _MODELLED or not callable(value):
        return False
    owner = getattr(value, "__self__", None)
    if owner is not None and not issubclass(type(owner), types.ModuleType) and (
            issubclass(type(owner), _OWNED) or not library_module(type(owner).__module__ or "")
            or type(owner).__module__.split(".")[0] == "minihop"):
        return False
    module = getattr(value, "__module__", None) or (type(owner).__module__ if owner is not None else None)
    return issubclass(type(module), str) and library_module(module) and module.split(".")[0] != "minihop"


def _named(value: Any) -> str:
    owner = getattr(value, "__self__", None)
    if owner is not None and not issubclass(type(owner), types.ModuleType):
        return f"{type(owner).__qualname__}.{value.__name__}"
    return f"{getattr(value, '__module__', None) or ''}.{value.__name__}".lstrip(".")


@functools.lru_cache(maxsize=2)
def _watched_functions(mtrand: Any) -> dict[int, tuple[str, str]]:
    found: dict[int, tuple[str, str]] = {}
    for kind, table in (("clock", _CLOCKS), ("seed", _SEEDS), ("message", _MESSAGES), ("setter", _REGISTRARS)):
        for module_name, names in table.items():
            module = importlib.import_module(module_name)
            for name in names:
                if hasattr(module, name):
                    found.setdefault(id(getattr(module, name)), (kind, f"{module_name}.{name}"))
    shared = (("random", random, random._inst),  # type: ignore[attr-defined]
              ("numpy", sys.modules.get("numpy.random"), getattr(mtrand, "_rand", None)))
    for kind, module, generator in shared:
        for name in dir(module) if generator is not None else ():
            fn = getattr(module, name)
            if getattr(fn, "__self__", None) is generator:
                found[id(fn)] = (kind, f"{module.__name__}.{name}")
    return found


class ReadWatch:
    """Reads of a clock, the system's entropy or a process-wide random generator while the
    user's code is traced, in the tracing thread.

    ``sites`` are the places the user's code names such a function from (``(holder, name)``:
    the ``time`` module's ``time``, the user's global ``perf_counter``), found in its bytecode;
    each is swapped for a recorder, then put back. A clock read from a library (torch's own
    timers; ``is_user`` says which frames are the user's) is passed through unrecorded; a draw
    is recorded whoever makes it. Python's generator is also compared before and after, which
    finds a draw made where the code does not name it (inside a library function); each
    generator drawn from is put back as it was (``stop``)."""

    def __init__(self, sites: list[tuple[Any, str, Any, str, str]], compare_generator: bool,
                 is_user: Callable[[types.FrameType], bool], name: str = "the Function") -> None:
        self.name = name  # (the Function's, for a refusal raised where the call is made)
        self.reads: list[tuple[str, str, str | None, int, str | None]] = []  # (phase, kind, what, line, where)
        self.phase = "forward"  # pystate moves it on when forward is done
        self.thread = threading.get_ident()
        self.is_user = is_user
        self.swapped: list[tuple[Any, str, Any]] = []
        # lru_cache helpers called: (phase, home, name, what, args, kwargs, where)
        self.cache_calls: list[tuple[str, Any, str, str, tuple[Any, ...], dict[str, Any], str]] = []
        # the tensors they returned, with their version counters then (a write into one: refused)
        self.cache_results: list[tuple[list[torch.Tensor], list[int], str, str]] = []
        self.cache_objects: list[tuple[Any, Any, str, str]] = []  # (the object, what it held, ...)
        self.existed: Callable[[Any], bool] = lambda value: False  # (pystate's: state forward found)
        self.unknown: Callable[[str, str], None] = lambda phase, why: None  # (pystate's: single-use)
        # (the trace's: a tensor of an lru_cache entry, its input name and place)
        self.route: Callable[[torch.Tensor, str, Place], None] | None = None
        self.read: Callable[[Place, str, str], None] = lambda place, phase, where: None  # (pystate's: guarded)
        self.real: dict[int, Any] = {}  # id(recorder) -> the function it stands for
        # Python's generator compared before and after only where the code may draw unseen
        # (its state costs a 625-number copy to read); a named draw saves it when made.
        self.states: dict[str, Any] = {"random": random._inst.getstate()} if compare_generator else {}  # type: ignore[attr-defined]
        for holder, name, fn, kind, what in sites:
            self._swap(holder, name, fn, kind, what)

    def _swap(self, home: Any, name: str, fn: Any, kind: str, what: str) -> None:
        if kind == "uncached":
            # The cache is bypassed so that it never keeps a fake tensor (the user's next call
            # would get it back). A result holding tensors, for plain arguments, is the cache's
            # own entry, read again on every call (cache_entries); any other the graphs compute,
            # and each such call is made again, for real, on every call (``call_writes``).
            unwrapped = functools.partial(fn.__func__.__wrapped__, fn.__self__) \
                if issubclass(type(fn), types.MethodType) else fn.__wrapped__

            def uncached(*args: Any, **kwargs: Any) -> Any:
                where, entry = None, NOT_FETCHED
                if threading.get_ident() == self.thread:
                    frame = sys._getframe(1)
                    where = f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'
                    self.cache_calls.append((self.phase, home, name, what, args, kwargs, where))
                    entry = fetched_entry(fn, args, kwargs) if self.route is not None else NOT_FETCHED
                result, drawn = (None, None) if entry is not NOT_FETCHED and entry is not MISSING else \
                    traced_call(unwrapped, args, kwargs)
                if entry is MISSING:  # (not made yet: traced, and read from the cache where it holds tensors)
                    entry = made_entry(fn, result, drawn, what, where)
                if entry is not NOT_FETCHED:  # (tensors: read from the cache on every call; the call
                    # itself, made again, keeps the cache's counts eager's)
                    routes, values = entry_routes(called(home, name, what), entry, args, kwargs, what)
                    for tensor, input_name, place in routes:
                        self.route(tensor, input_name, place)
                    for place in values:
                        self.read(place, self.phase, where)
                    return entry
                if where is not None:  # whatever it returns: a float is as stale as a tensor
                    if computed_for_this_call(fn, unwrapped, result, drawn, args, kwargs, what, where):
                        self.unknown(self.phase, f"{self.phase} computes a tensor {what} (an lru_cache helper) returns "
                                     f"for a dynamic size or a tensor, whose entry it cannot read ({where})")
                    stale_cache_check(fn, what, where, "tensor" if holds_tensor(result) else "value")
                    if cached_entry(fn, args, kwargs, result, what, where) is not NOT_FETCHED:
                        self.cache_calls.pop()  # (the call eager makes, made: not made again)
                        self.unknown(self.phase, f"{self.phase} reads an object {what} (an lru_cache helper) returned, "
                                     f"which any code may change in place ({where})")
                    returned = [t for t in (result if issubclass(type(result), (tuple, list)) else (result,))
                                if issubclass(type(t), torch.Tensor)]
                    self.cache_results.append((returned, [t._version for t in returned], what, where))
                    if not issubclass(type(result), torch.Tensor) and not self.existed(result):  # (a dict, a list, an object)
                        self.cache_objects.append((result, held(result, 0, self.existed), what, where))
                return result

            self._install(home, name, fn, uncached)
            return

        def read(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self.thread:
                frame = sys._getframe(1)
                if kind not in ("clock", "message", "setter") or self.is_user(frame):
                    if kind not in ("clock", "message", "setter") and kind not in self.states:
                        self.states[kind] = _global_state(kind)
                    self.reads.append((self.phase, kind, what, frame.f_lineno,
                                       f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'))
                    if kind == "message":
                        return None  # refused: eager (the fallback) sends it, once
                    if kind == "setter":  # held back, and refused (also if the user's code catches it)
                        raise refusal(f"{self.name}.{self.phase}", kind, what, frame.f_lineno, self.reads[-1][4])
            return fn(*args, **kwargs)

        self._install(home, name, fn, read)

    def _install(self, home: Any, name: str, fn: Any, stand_in: Any) -> None:
        self.real[id(stand_in)] = fn
        SWAPPED_IN[id(stand_in)] = fn
        own = getattr(fn, "__dict__", None)
        if type(own) is dict:
            # The stand-in shares the function's attributes: ``memo.k = t`` on an lru_cache
            # helper while it is swapped is the user's write to the helper, seen by the heap watch.
            stand_in.__dict__ = own
        if issubclass(type(home), (dict, list)):
            self.swapped.append((home, name, fn))
            home[name] = stand_in
            return
        # What the holder itself stores under the name, not what reading it gives: a class's
        # ``staticmethod`` (reading it unwraps it) or a name it inherits (nothing of its own).
        # ``stop`` puts back exactly that, so the class is left as it was.
        own = getattr(home, "__dict__", None)
        stored = own.get(name, MISSING) if issubclass(type(own), Mapping) else fn
        self.swapped.append((home, name, stored))
        if issubclass(type(stored), staticmethod):
            stand_in = staticmethod(stand_in)
        setattr(home, name, stand_in)  # a cell's ``cell_contents`` too

    def call_writes(self) -> list[StateWrite]:
        """Each lru_cache helper call, made again when the capture runs (``StateWrite`` kind
        "call"; forward's after fwd, backward's when backward runs), through the place the
        code named it by."""
        for returned, versions, what, where in self.cache_results:
            if any(t._version != v for t, v in zip(returned, versions, strict=True)):
                raise SideEffectError(
                    f"The Function writes in place into a tensor {what} (an lru_cache helper) returned.",
                    "Eager's cache keeps that very tensor: each call writes into it again and the "
                    "next call gets it back written; a capture computes the tensor afresh in its "
                    "graphs on every call, so the writes never add up.",
                    "Clone what the cached helper returns before writing into it (table(n).clone()), "
                    "or run it eagerly with minihop.function(F, fallback='eager').", where=where)
        for result, before, what, where in self.cache_objects:
            if held(result, 0, self.existed) != before:
                raise SideEffectError(
                    f"The Function changes an object {what} (an lru_cache helper) returned.",
                    "Eager's cache keeps that very object: each call changes it again and the next "
                    "call gets it back changed; while traced the helper's cache is bypassed, so a "
                    "capture's change is made to a copy no later call sees.",
                    "Keep such state outside the cached helper (or copy what it returns before "
                    "changing it), or run it eagerly with minihop.function(F, fallback='eager').",
                    where=where)
        writes = []
        for phase, home, name, what, args, kwargs, where in self.cache_calls:
            # A size symbol among the arguments is computed from each call's arguments (which
            # backward then needs: its place "uses" them).
            sized = any(issubclass(type(v), (torch.SymInt, torch.SymFloat)) for v in (*args, *kwargs.values()))
            root = called(home, name, what, replay=True)
            place = Place(root, (), root.fetch, needs_args=sized)
            writes.append(StateWrite(place, "call", (args, kwargs), phase, where))
        return writes

    def check_generator(self) -> None:
        """A draw from Python's generator the code does not name (a library function draws):
        found by its state, once per phase."""
        before = self.states.get("random")
        drawn = any(read[1] == "random" for read in self.reads)
        if before is not None and not drawn and random._inst.getstate() != before:  # type: ignore[attr-defined]
            self.reads.append((self.phase, "random", None, 0, None))

    def single_use(self) -> list[tuple[str, str]]:
        """Take out the reads that make a capture single-use rather than refused (the seed
        torch's generator was given: traced as a constant that holds for this call only), each
        as (phase, reason)."""
        taken = [r for r in self.reads if r[1] == "clock" and r[2] in _SEED_READS]
        self.reads = [r for r in self.reads if r not in taken]
        return [(phase, f"{phase} reads {what}() ({where})") for phase, _, what, _, where in taken]

    def real_of(self, value: Any) -> Any:
        """``value``, or the function it stands in for while swapped (a snapshot of the
        user's globals sees the user's own binding, not minihop's)."""
        return self.real.get(id(value), value)

    def stop(self) -> None:
        """Every function back, and each drawn-from generator as it was before tracing drew."""
        for stand_in in self.real:
            SWAPPED_IN.pop(stand_in, None)
        for home, name, fn in reversed(self.swapped):
            if issubclass(type(home), (dict, list)):
                home[name] = fn
            elif fn is MISSING:
                delattr(home, name)  # it was inherited: the holder had none of its own
            else:
                setattr(home, name, fn)
        self.swapped.clear()
        self.check_generator()
        if not any(read[1] == "random" for read in self.reads):
            self.states.pop("random", None)  # not drawn from: nothing to put back
        for kind, state in self.states.items():
            _set_global_state(kind, state)
        self.states.clear()


def refusal(where_in: str, kind: str, what: str | None, line: int, where: str | None) -> SideEffectError:
    """The error for a clock read, a seeding or a library setter called while traced."""
    if kind == "clock":
        return SideEffectError(
            f"{where_in} reads {describe_read(what)} (`{what}`, line {line}).",
            "A capture records tensor operations: the value read while tracing would be a constant "
            "in the graphs, and every call would reuse it where eager reads a new one.",
            "Read it outside the Function and pass it in as an argument, or run it eagerly with "
            "minihop.function(F, fallback='eager').", where=where)
    if kind == "seed":
        return SideEffectError(
            f"{where_in} seeds torch's random generator (`{what}`, line {line}).",
            "A capture records tensor operations, and seeding is none: it would run once, while "
            "tracing, so later calls' random ops would draw other numbers than eager's, which "
            "reseeds on every call.",
            "Seed outside the Function (before each call, if every call needs the same numbers), "
            "pass a torch.Generator seeded outside as an argument, or run it eagerly with "
            "minihop.function(F, fallback='eager').", where=where)
    return SideEffectError(
        f"{where_in} calls `{what}` (line {line}), a library's setter: it changes state of the "
        "library's (a process-wide setting, a logger's level, a callback registered for later: "
        "at exit, when an object dies) that minihop does not model.",
        "A capture records tensor operations: the setting would be made once, while tracing "
        "(it was not: the call was held back), where eager makes it on every call.",
        "Make the setting outside the Function, or run it eagerly with "
        "minihop.function(F, fallback='eager').", where=where)


def describe_read(what: str | None) -> str:
    """What a "clock" read reads, for an error."""
    return "whether inference mode is on" if what == _INFERENCE_READ else "the clock or the system's entropy"


def describe_global(kind: str) -> str:
    """A process-wide generator's name, for an error."""
    return _GLOBAL[kind]


def _global_state(kind: str) -> Any:
    if kind == "random":
        return random._inst.getstate()  # type: ignore[attr-defined]  # the module's getstate is swapped
    if kind == "numpy":
        return sys.modules["numpy.random.mtrand"]._rand.get_state()
    # "seed": torch's CPU generator (its own methods: torch.get_rng_state records a graph node)
    return torch.random.default_generator.get_state()


def _set_global_state(kind: str, state: Any) -> None:
    generator = random._inst if kind == "random" else sys.modules["numpy.random.mtrand"]._rand \
        if kind == "numpy" else torch.random.default_generator  # type: ignore[attr-defined]
    (generator.setstate if kind == "random" else generator.set_state)(state)
