"""The watch of the user's Python code that runs while a capture is traced and that no analysis reached.

Place in the pipeline: tracer, installed by ``opaque.Finder.start`` where such code can run at
all (``opaque.may_call_unanalysed``). While installed (``sys.settrace``; a debugger's or
coverage's tracer keeps running), it notes each function of the user's that runs and is not
among the analysed code (what makes the capture single-use, with the line that called it),
keeps what that code could write so that a failed trace puts it back, hands the library code
the call runs to ``library_ran.LibraryRan``, and makes such code's trace eager's for its own
call: the ``type``/``isinstance``/``vars``/``dir`` stand-ins are bound in its globals when it is
called, its text of a tensor is refused, and what ``kinds`` refuses in analysed code is
refused in it (raised when the trace stops: raised from the trace function it would unset
the watch).

Invariant: minihop's own frames are never kept nor given stand-ins; the previous tracer is
put back by ``stop``.
"""

from __future__ import annotations

import collections
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..errors import UnsupportedOperationError
from . import kinds
from ..library_state import own_dict
from ..user_code import library_base, plain_items, plain_pairs
from .identity import SWAPPED_IN, stand_in

__all__ = ["CallWatch", "library_module_name"]


def library_module_name(module: Any) -> bool:
    """Whether a module name is library code for the watches (torch's, minihop's, the
    standard library's but for the modules that run the user's callables: ``functools``,
    ``itertools``, ``copy``, ``pickle``, ``dataclasses``)."""
    top = str(module or "").split(".")[0]
    return top in ("torch", "minihop", "math", "operator", "builtins") or top in sys.stdlib_module_names \
        and top not in ("functools", "itertools", "copy", "pickle", "dataclasses")


class CallWatch:
    """While installed, notes each Python function of the user's that runs and is not in
    ``analysed`` (code objects), with the line that called it (``sys.settrace``: the previous
    tracer, a debugger's or coverage's, keeps running)."""

    def __init__(self, analysed: set[types.CodeType], is_library_frame: Callable[[Any], bool], library: Any,
                 function: str = "", args: tuple[Any, ...] = ()) -> None:
        self.analysed = analysed
        self.function, self.args = function, args
        # What such code asks a traced value that no stand-in answers (``kinds``): refused
        # when the trace stops (raised from a trace function it would unset the watch).
        self.refused: list[Exception] = []
        self.is_library_frame = is_library_frame
        self.found: list[tuple[str, str]] = []  # (what ran, where it was called from)
        self.phase = "forward"
        self.ran_in: set[str] = set()  # the phases in which such code ran
        self.previous = sys.gettrace()
        # The code seen to be analysed or a library's, by id (a code object's hash walks its
        # bytecode: too slow per call event), holding the codes so that no id is reused.
        self.ok: dict[int, types.CodeType] = {}
        self.undo: list[Callable[[], None]] = []  # puts back what unanalysed code could write
        self.backward_from: int | None = None  # where backward's entries in ``undo`` begin
        self.kept: set[Any] = set()  # ids (and (globals, name)) whose state ``undo`` holds
        self.library = library  # ``library_ran.LibraryRan``: the library code the call ran (its names are read)
        # By id (a code object's hash walks its bytecode: too slow per call event), holding
        # the code: library code not yet kept as the call's, and the codes whose callees are.
        self.library_codes: dict[int, types.CodeType] = {}
        self.callers = {id(c) for c in analysed}
        self.noted: dict[int, types.CodeType] = {}  # kept in this phase
        # ``(code, its globals)``, told when code no analysis reached is first called (before
        # its first instruction): ``opaque.Finder`` binds the stand-ins there and watches its
        # ``id``/``hash`` reads
        self.on_unanalysed: Callable[[types.CodeType, dict[str, Any]], None] | None = None
        self.backward_analysed: set[types.CodeType] | None = None  # (None: ``analysed`` in both)
        sys.settrace(self._trace)

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if id(code) not in self.ok:
            library = code not in self.analysed and self.is_library_frame(frame)
            if code in self.analysed or library:
                self.ok[id(code)] = code
                if library:
                    self.library_codes[id(code)] = code
            else:
                self.ran_in.add(self.phase)
                if len(self.found) < 8:
                    caller = frame.f_back
                    where = f'File "{caller.f_code.co_filename}", line {caller.f_lineno}' if caller else "?"
                    what = f"{code.co_qualname} ({code.co_filename}, line {code.co_firstlineno})"
                    if all(w != what for w, _ in self.found):
                        self.found.append((what, where))
            if event == "call" and not library and not frame.f_globals.get("__name__", "").startswith("minihop."):
                # (a library's frame, torch's or sympy's, holds the library's own state: put
                # back, a symbol's assumptions cache lost what it learnt meanwhile; minihop's
                # own frames hold minihop's state, never the user's)
                self._keep(frame)
                if id(code) not in self.ok and self.on_unanalysed is not None:  # (the user's, unanalysed)
                    # (``isinstance(n, int)`` of a symbolic size in a callback no analysis
                    # reached answers as eager's too)
                    self.on_unanalysed(code, frame.f_globals)
                    try:
                        kinds.refuse_class_reads(self.function, self.phase, code, self.args)
                    except UnsupportedOperationError as e:
                        self.refused.append(e)
        if id(code) in self.library_codes:
            back = frame.f_back  # (inline: most library frames are the tracer's, called by its own)
            if back is not None and id(back.f_code) in self.callers and self.library.note(frame, self.phase):
                self.noted[id(code)] = self.library_codes.pop(id(code))
                self.callers.add(id(code))
        previous = self.previous
        return previous(frame, event, arg) if previous is not None else None

    def enter_backward(self) -> None:
        """From now on backward runs: library code kept in forward is kept again where
        backward runs it (backward's reads are checked again when it runs). Code analysed for
        forward only (a helper reached from forward, but from backward past the analysis's
        depth) is unanalysed here: its reads were forward's."""
        self.phase = "backward"
        # What backward's unanalysed code may write is kept anew, apart from forward's: backward
        # is traced again when it runs, so what it wrote while traced now is put back
        # (``opaque.Finder.stop``).
        self.backward_from, self.kept = len(self.undo), set()
        if self.backward_analysed is not None:
            self.analysed = self.backward_analysed
            self.ok = {}
        self.library_codes.update(self.noted)
        self.noted = {}
        self.callers = {id(c) for c in self.analysed}

    def _keep(self, frame: Any) -> None:
        """Before unanalysed code runs: the state it can write that pystate's snapshot may not
        hold (the globals its code names, its arguments' attributes, the lists, dicts and sets
        among them), so that a trace that then fails leaves them as it found them. Eager runs
        the Function after a refused trace (fallback="eager"): a counter this code bumped while
        traced would otherwise be bumped twice."""
        code = frame.f_code
        g = frame.f_globals
        for name in code.co_names:
            if name in g and not name.startswith("__") and not stand_in(g[name]):  # (not minihop's)
                if (id(g), name) not in self.kept:
                    self.kept.add((id(g), name))
                    value = SWAPPED_IN.get(id(g[name]), g[name])  # (the user's, not a watch's stand-in)
                    self.undo.append(functools.partial(g.__setitem__, name, value))
                    self._keep_value(value)
        for name in (*code.co_varnames[:code.co_argcount + code.co_kwonlyargcount], *code.co_freevars):
            self._keep_value(frame.f_locals.get(name))  # (and the cells it closes over: ``died[0] += 1``)

    def _keep_value(self, value: Any, depth: int = 0) -> None:
        """``value``'s state (a container's items, a user object's attributes), and that of
        what it holds, ``_DEPTH`` levels down (``LOG.lines.append``: the list of an object the
        code names): undone in reverse, so the innermost first."""
        if id(value) in self.kept or depth > _DEPTH or len(self.kept) > _MAX_KEPT:
            return
        cls = type(value)
        if issubclass(cls, (list, dict, set, collections.deque)):
            # (a subclass too, the library's ``Counter``/``OrderedDict`` or the user's: copied and
            # put back through its library base's methods, past the user's overrides)
            self.kept.add(id(value))
            base = library_base(cls)
            # (a dict's entries copied with their stored hashes: no key's __hash__ runs; an
            # OrderedDict's in its own order, which its base's update puts back)
            contents = _users((dict(plain_pairs(value)) if issubclass(cls, collections.OrderedDict) else dict.copy(value))
                              if issubclass(cls, dict) else list(plain_items(value)))
            self.undo.append(functools.partial(_refill, value, contents, base))
            if len(contents) <= _WIDE:
                for item in (contents.values() if issubclass(cls, dict) else contents):
                    self._keep_value(item, depth + 1)
        if cls not in (list, dict, set) \
                and not issubclass(cls, (type, types.ModuleType, types.FunctionType, torch.Tensor)) \
                and type(own_dict(value)) is dict \
                and (not library_module_name(cls.__module__) or cls is types.SimpleNamespace):  # (a holder of the user's values)
            self.kept.add(id(value))
            space = own_dict(value)
            held = _users(dict(space))
            self.undo.append(functools.partial(_refill, space, held, dict))
            if len(held) <= _WIDE:
                for item in held.values():
                    self._keep_value(item, depth + 1)

    def stop(self) -> None:
        if sys.gettrace() == self._trace:
            sys.settrace(self.previous)


# How far below a value the code names its state is kept (``_keep_value``), and up to how
# many entries a container's or an object's are followed there.
_DEPTH, _WIDE, _MAX_KEPT = 8, 64, 4096


def _users(contents: Any) -> Any:
    """``contents`` with the user's own function where a watch's stand-in is (an lru_cache
    helper swapped in a dict or on an object while traced): what an undo puts back."""
    if not SWAPPED_IN or not any(id(v) in SWAPPED_IN for v in (contents.values() if type(contents) is dict else contents)):
        return contents  # (rebuilding a dict hashes its keys: a key's ``__hash__`` may be the user's)
    if type(contents) is dict:
        return {k: SWAPPED_IN.get(id(v), v) for k, v in contents.items()}
    return [SWAPPED_IN.get(id(v), v) for v in contents]


def _refill(container: Any, contents: Any, base: type) -> None:
    """Put ``contents`` back into ``container`` through ``base``'s methods (its library base:
    ``dict``'s own on an ``OrderedDict`` would leave its order list behind)."""
    if issubclass(base, dict) and base.__len__(container) == len(contents) and all(
            a is c and b is d for (a, b), (c, d) in zip(base.items(container), contents.items())):
        return  # unchanged (and refilling would hash its keys again: a key's __hash__ may be the user's)
    base.clear(container)
    if issubclass(base, dict):
        base.update(container, {k: v for k, v in contents.items() if not stand_in(v)})
    elif issubclass(base, set):
        base.update(container, contents)
    else:
        base.extend(container, contents)


# torch's ops written in C: below them run only torch's dispatch and its fake kernels (never the
# call's own code, nor the user's: but ``apply_``/``map_``, which call a Python function).
C_CODE = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
          types.MethodWrapperType)
_CALLS_BACK = frozenset({"apply_", "map_", "map2_"})


def pause(func: Any) -> Any:
    """Pause a call watch while the recorder handles op ``func``: recording it and its fake
    tensors' dispatch are thousands of Python frames that are not the call's (watched, a
    capture's trace took twice as long). The recorder watches again what runs the call's code
    (``resume``: a library's Python function run on fakes, a special row). Returns the watch
    paused, or None (none is on, another tracer is chained to it, ``func`` calls back)."""
    watch = sys.gettrace()
    if watch is None or getattr(func, "__name__", None) in _CALLS_BACK or not _alone(watch):
        return None
    sys.settrace(None)
    return watch


def resume(watch: Any) -> Any:
    """The paused ``watch`` on again (None: nothing to do); what ``pause_again`` takes."""
    if watch is not None:
        sys.settrace(watch)
    return watch


def pause_again(watch: Any) -> None:
    if watch is not None:
        sys.settrace(None)


def _alone(watch: Any) -> bool:
    """Whether ``watch`` is a CallWatch's with no tracer of another (a debugger's) chained to it."""
    owner = getattr(watch, "__self__", None)
    return issubclass(type(owner), CallWatch) and owner.previous is None


class UnwatchedFakeMode(FakeTensorMode):
    """The trace's fake tensor mode: torch's own ops (``aten``, ``prims``) are dispatched with a
    call watch paused, as the recorder's handling of an op is (``pause``: a library function's
    body, run on fakes, dispatches its ops here). An op of a library the user registered, whose
    fake kernel is the user's Python code, stays watched."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        watch = sys.gettrace()
        if watch is None or getattr(func, "namespace", None) not in _TORCH_OPS or not _alone(watch):
            return super().__torch_dispatch__(func, types, args, kwargs or {})
        sys.settrace(None)
        try:
            return super().__torch_dispatch__(func, types, args, kwargs or {})
        finally:
            sys.settrace(watch)


_TORCH_OPS = frozenset({"aten", "prims", "prim"})
