"""Reads minihop cannot bound: what makes a capture single-use.

Place in the pipeline: tracer, asked by ``pystate.StateTracker``. pystate guards the state the
code it analysed names (chains from globals, cells, arguments, ctx) and keys whole the objects
it hands on (``runtime.guards.value_key``: modules with their training flags and attributes,
user classes with their class attributes, objects with their attributes). What lies outside
that is unknown, and unknown means unsafe: the capture serves the call it was traced for and
no other (strict mode captures again, ``fallback="eager"`` runs eagerly). Two finders:

- **statically**, ``dynamic_lookups``: ``getattr``/``vars``/``operator.attrgetter`` whose
  name is not a constant (which attribute is read is known only at run time), and
  ``globals()`` other than ``globals()["NAME"]`` (the module's whole namespace, read by a
  name no chain names; chains read ``globals()["NAME"]`` as ``NAME``);
- **while tracing**, ``call_watch.CallWatch``: any Python function of the user's (not torch's, the
  standard library's or minihop's) that runs and is not among the code pystate analysed: a
  method of an object passed in, a user module's submodule, a callback handed to library
  code. Installed only where such code can run at all (``may_call_unanalysed``), so that a
  Function of tensors, numbers and torch ops pays nothing for it.

Invariant: a capture is reused only if no reason was found; every reason names what was read
or called and its source line (``explain()`` and the cache's notes show them).
"""

from __future__ import annotations

import builtins
import functools
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import UnsupportedOperationError
from ..library_state import global_module_hooks, own_attr, own_dict
from ..spec import MISSING
from ..user_code import tensor_code, tensor_code_refusal
from .bytecode import instructions
from .call_watch import CallWatch, library_module_name as _library_name
from .chains import Chain, constant_global
from .library import is_library
from .identity import STAND_INS, TENSOR_STATE, IdentityWatch, TypeAsEager, names_identity, refuse_identity_alias
from .userattr import UserAttribute

__all__ = ["constant_getattrs", "dynamic_lookups", "may_call_unanalysed", "nested_codes"]

_LOOKUPS = frozenset({"getattr", "vars", "attrgetter", "methodcaller", "globals"})
_CALLS = frozenset({"CALL", "CALL_FUNCTION", "CALL_FUNCTION_EX", "CALL_KW", "PRECALL"})
_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD", "LOAD_DEREF"})


def nested_codes(code: types.CodeType) -> Iterable[types.CodeType]:
    """``code`` and the code nested in it (comprehensions, lambdas, inner ``def``s): the chain
    finder reads them as part of it, so they are analysed with it."""
    yield code
    for const in code.co_consts:
        if issubclass(type(const), types.CodeType):
            yield from nested_codes(const)


@functools.lru_cache(maxsize=2048)
def dynamic_lookups(code: types.CodeType) -> tuple[tuple[str, int | None], ...]:
    """``(what, line)`` for each ``getattr(obj, name)`` (and ``vars``, ``attrgetter``) in
    ``code`` whose name is not a constant right before the call: the attribute read is chosen
    at run time, so no chain names it. Conservative: a call shape it cannot read counts."""
    found: list[tuple[str, int | None]] = []
    for inner in nested_codes(code):
        ins = instructions(inner)[0]
        line = inner.co_firstlineno
        for i, op in enumerate(ins):
            if op.lineno is not None:
                line = op.lineno
            if op.opname not in _LOADS or op.argval not in _LOOKUPS:
                continue
            if op.argval == "vars" or op.argval == "globals" and not constant_global(ins, i + 1):
                found.append((f"{op.argval}(...)", line))
                continue
            j = i + 1
            while j < len(ins) and ins[j].opname not in _CALLS:
                j += 1
            if not _constant_name(op.argval, ins[i + 1:j], ins[j].arg if j < len(ins) else None):
                found.append((f"{op.argval}(...) with a name chosen at run time", line))
    return tuple(found)


@functools.lru_cache(maxsize=2048)
def constant_getattrs(code: types.CodeType) -> tuple[Chain, ...]:
    """``getattr(NAME, "k")`` or ``getattr(NAME, "k", default)`` (``NAME`` a global or closure variable, ``"k"`` a constant) as
    the chain ``NAME.k`` it reads: where ``NAME`` holds a library module, what the name there
    is bound to is read as ``NAME.k``'s would be (``getattr(torch, "set_warn_always")``)."""
    found: list[Chain] = []
    for inner in nested_codes(code):
        ins = instructions(inner)[0]
        line = inner.co_firstlineno
        for i, op in enumerate(ins):
            line = op.lineno if op.lineno is not None else line
            # (``getattr(NAME, "k", default)`` too, the default one load: the same read)
            if op.opname in _LOADS and op.argval == "getattr" and i + 3 < len(ins) \
                    and ins[i + 1].opname in ("LOAD_GLOBAL", "LOAD_DEREF") and ins[i + 2].opname == "LOAD_CONST" \
                    and issubclass(type(ins[i + 2].argval), str) and (
                        ins[i + 3].opname in _CALLS and ins[i + 3].arg == 2
                        or i + 4 < len(ins) and ins[i + 3].opname in ("LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL")
                        and ins[i + 4].opname in _CALLS and ins[i + 4].arg == 3):
                kind = "global" if ins[i + 1].opname == "LOAD_GLOBAL" else "deref"
                found.append(Chain(kind, ins[i + 1].argval, (("attr", ins[i + 2].argval),), "value", line))
    return tuple(found)


def _constant_name(lookup: str, window: list[Any], argc: int | None) -> bool:
    """Whether the call's name argument(s) are string constants: ``getattr(obj, "k")``,
    ``getattr(obj, "k", <one load>)``, ``attrgetter("a", "b")``."""
    def const(x: Any) -> bool:
        return x.opname == "LOAD_CONST" and issubclass(type(x.argval), str)
    if lookup == "getattr" and argc == 2:
        return bool(window) and const(window[-1])
    if lookup == "getattr" and argc == 3:
        return len(window) >= 2 and const(window[-2]) and window[-1].opname in ("LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL")
    if lookup == "attrgetter" and argc:
        return len(window) >= argc and all(const(x) for x in window[-argc:])
    return False


def _plain(value: Any, depth: int = 0) -> bool:
    """Values through which no user code can run: tensors, numbers, strings, torch's and the
    standard library's functions and modules, and containers of those. A subclass of these
    whose own class defines functions (``__missing__``, ``__getitem__``, ``__mul__``) runs them
    where the code indexes or multiplies it: not plain."""
    if value is None or value is MISSING:
        return True
    if issubclass(type(value), (int, float, complex, str, bytes, torch.Tensor, torch.dtype,
                          torch.device, torch.Size, types.ModuleType)):
        return _no_user_methods(type(value))
    if issubclass(type(value), (tuple, list, frozenset, set)) and depth < 2:
        return _no_user_methods(type(value)) and len(value) < 64 and all(_plain(v, depth + 1) for v in value)
    if issubclass(type(value), dict) and depth < 2:
        return _no_user_methods(type(value)) and len(value) < 64 and \
            all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in dict.items(value))  # (a key's __hash__)
    if issubclass(type(value), (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                          types.MethodDescriptorType, types.WrapperDescriptorType)):
        return True  # C code (``x.sin``, ``len``): a callback it calls is a value of its own
    if issubclass(type(value), (types.FunctionType, type)):
        return _library_name(getattr(value, "__module__", None))
    return False


_BUILTIN_BASES = frozenset({int, float, complex, str, bytes, tuple, list, frozenset, set, dict, bool,
                            torch.Tensor, torch.dtype, torch.device, torch.Size, types.ModuleType})


def _no_user_methods(cls: type) -> bool:
    """Whether no class of ``cls``'s MRO holds a function of the user's (a namedtuple's and an
    enum's generated ones are the library's)."""
    if cls in _BUILTIN_BASES:
        return True
    for c in cls.__mro__:
        if c in _BUILTIN_BASES or c is object or _library_name(c.__module__):
            continue
        for v in own_dict(c).values():
            f = getattr(v, "__func__", getattr(v, "fget", v))
            if callable(f) and not issubclass(type(f), type) and not _library_name(getattr(f, "__module__", None)) \
                    and not str(getattr(f, "__module__", "")).startswith("namedtuple_"):
                return False
    return True


def may_call_unanalysed(values: Iterable[Any]) -> bool:
    """Whether any of ``values`` (the arguments, and what the code's chains reach) could run
    Python code of the user's that was not analysed. A tensor can, where the user's function
    was set on ``torch.Tensor`` (``torch.Tensor.double_it = ...``, ``torch.Tensor.__add__ =
    traced_add``): a method call on any tensor runs it. So can a module's call, where a hook is
    registered for every module (``register_module_forward_hook``)."""
    return not all(_plain(v) for v in values) or tensor_patched() or any(global_module_hooks())


def runs_library_python(values: Iterable[Any]) -> bool:
    """Whether any of ``values`` is a library's Python function or class (``F.softmax``,
    ``torch.distributions.Normal``): calling it runs library code whose names and constants
    the capture reads (``library_ran``: ``Distribution._validate_args``), seen only by the watch."""
    return any(issubclass(type(v), (types.FunctionType, type)) and is_library(v)
               and str(own_attr(v, "__module__") or "").split(".")[0] not in ("builtins", "minihop")
               and own_attr(v, "__module__") != "torch._C" for v in values)


def tensor_patched() -> bool:
    """Whether ``torch.Tensor`` holds a function that is not torch's (or the standard
    library's): the user's, set on the class. (Asked per capture: answered again only where
    the class's attributes are other objects than last time.)"""
    values = tuple(vars(torch.Tensor).values())
    last, answer = _PATCHED
    if len(last) == len(values) and all(a is b for a, b in zip(last, values, strict=True)):
        return answer
    answer = any(issubclass(type(v), (types.FunctionType, staticmethod, classmethod, property))
                 and not _library_name(getattr(getattr(v, "__func__", getattr(v, "fget", v)), "__module__", None))
                 for v in values)
    _PATCHED[:] = [values, answer]  # (holding the values: no id in it is reused)
    return answer


_PATCHED: list[Any] = [(), False]


def entry_points(value: Any) -> list[tuple[Any, Any]]:
    """``(function, self or None)`` for the user code a value runs when the analysed code
    calls it, so that it is analysed too: another Function's ``apply`` (its forward, setup
    and backward), the ``forward`` of each user submodule of an ``nn.Module``, a user
    object's ``__call__``, a bound method's function."""
    found: list[tuple[Any, Any]] = []
    # Only a method has a __self__; probing any object would run a user __getattr__ (userattr).
    owner = value.__self__ if issubclass(type(value), (types.MethodType, types.BuiltinMethodType)) else None
    owner = getattr(owner, "fn_cls", owner)  # @minihop.captured's apply: its CapturedFunction's
    if issubclass(type(value), type) and issubclass(value, torch.autograd.Function):
        owner = value  # minihop.apply(Inner, x), Inner.apply(x)
    if issubclass(type(owner), type) and issubclass(owner, torch.autograd.Function):
        for name in ("forward", "setup_context", "backward", "vjp"):
            fn = getattr(owner, name, None)
            if issubclass(type(fn), types.FunctionType) and not _library_name(fn.__module__):
                found.append((fn, None))
    elif issubclass(type(value), types.MethodType) and issubclass(type(value.__func__), types.FunctionType) \
            and not _library_name(value.__func__.__module__):
        found.append((value.__func__, owner))
    elif issubclass(type(value), functools.partial):
        found += entry_points(value.func) if not issubclass(type(value.func), types.FunctionType) else \
            [(value.func, None)] if not _library_name(value.func.__module__) else []
    elif issubclass(type(value), type) and not _library_name(value.__module__):
        # A user class called to make an object (an output ``Box(...)``, a dataclass, a
        # namedtuple): its constructors run.
        found += [(fn, None) for fn in (getattr(own_dict(value).get(k), "__func__", own_dict(value).get(k))
                                        for k in ("__init__", "__new__")) if issubclass(type(fn), types.FunctionType)]
    elif issubclass(type(value), torch.nn.Module):
        for module in value.modules():
            fn = getattr(type(module), "forward", None)
            if issubclass(type(fn), types.FunctionType) and not _library_name(fn.__module__):
                found.append((fn, module))
    elif not issubclass(type(value), type) and not _library_name(type(value).__module__):
        fn = getattr(type(value), "__call__", None)
        if issubclass(type(fn), types.FunctionType):
            found.append((fn, value))
    return found


class GetattrWatch:
    """``getattr`` (the builtin) while the analysed code that names it with a run-time name is
    traced: a lookup on an argument (keyed whole, name and all) or a plain value is bounded;
    any other object's attribute chosen at run time is not, and is noted with its line."""

    def __init__(self, codes: set[types.CodeType], keyed: tuple[Any, ...]) -> None:
        self.builtins = builtins
        self.real = builtins.getattr
        self.codes = codes
        self.keyed = {id(a) for a in keyed}
        self.found: list[str] = []
        self.thread = threading.get_ident()
        builtins.getattr = self

    def __call__(self, obj: Any, name: str, *default: Any) -> Any:
        frame = sys._getframe(1)
        if frame.f_code in self.codes and self.thread == threading.get_ident():
            # (a tensor the trace made, or an argument's, whose key holds its attributes; a
            # tensor from elsewhere, a global's, is keyed without them)
            bounded = (issubclass(type(obj), FakeTensor) and name not in TENSOR_STATE) or id(obj) in self.keyed \
                or _plain(obj) and not issubclass(type(obj), (types.ModuleType, type, torch.Tensor))
            if not bounded and len(self.found) < 8:
                self.found.append(f"getattr({type(obj).__name__} object, {name!r}) with a name chosen at run time "
                                  f'(File "{frame.f_code.co_filename}", line {frame.f_lineno})')
        return self.real(obj, name, *default)

    def stop(self) -> None:
        if self.builtins.getattr is self:
            self.builtins.getattr = self.real


def library_frame(frame: Any, library_module: Callable[[str], bool]) -> bool:
    """Whether a running frame is library code (generated code of no loaded module, as
    ``namedtuple``'s or torch's ``exec``'d helpers, is its caller's)."""
    for _ in range(8):  # generated code called by generated code (minihop's guards): go up
        name = frame.f_globals.get("__name__")
        if not ((name is None or name not in sys.modules) and frame.f_code.co_filename.startswith("<")) \
                or frame.f_back is None:
            break
        frame = frame.f_back
    return library_module(name or "")


class Finder:
    """One capture's reasons to be single-use: the static ones as pystate reads the code
    (``note_code``, ``note_chain``), the dynamic ones while the code is traced (``start``/``stop``)."""

    def __init__(self, function: str, library_module: Callable[[str], bool]) -> None:
        self.function = function
        self.library_module = library_module
        self.reasons: list[str] = []
        self.reachable: list[Any] = []  # what the code's chains reach (may it run unanalysed code?)
        self.lookups: set[types.CodeType] = set()  # code calling getattr with a run-time name
        self.calls: CallWatch | None = None
        self.getattrs: GetattrWatch | None = None
        self.identity: IdentityWatch | None = None
        self.types: TypeAsEager | None = None
        self.refused: list[UnsupportedOperationError] = []
        self.undo: list[Callable[[], None]] = []  # CallWatch's, for a trace that fails
        # Whether a reason is backward's (code it ran, a library call it makes, a getattr it
        # does): what that reads may change before ``.backward()`` (see pystate.finish).
        self.backward_unknown = False
        self.again = False  # a backward traced again for its call (``backward.py``): its writes are the call's
        self._forward_found: tuple[int, int, int] | None = None  # counts when forward ended

    def unknown(self, phase: str, reason: str) -> None:
        """A reason the capture is single-use, found in ``phase``'s code."""
        self.reasons.append(reason)
        self.backward_unknown |= phase == "backward"

    def note_code(self, phase: str, code: types.CodeType) -> None:
        for what, line in dynamic_lookups(code):
            # getattr is judged where it runs (GetattrWatch); vars and attrgetter here.
            (self.lookups.add(code) if what.startswith("getattr") else
             self.unknown(phase, f'{phase} calls {what} (File "{code.co_filename}", line {line})'))

    def note_chain(self, phase: str, code: types.CodeType, chain: Any, value: Any, end: Any, on_args: bool) -> None:
        """A chain the code reads, from ``value`` (its root's) to ``end``."""
        self.reachable.append(end)
        if issubclass(type(end), UserAttribute):  # code pystate did not run (see userattr)
            self.unknown(phase, f'{phase} reads {end.name}, computed by {end.what}, code minihop did not '
                                f'analyse (File "{code.co_filename}", line {chain.line})')
        refuse_identity_alias(self.function, phase, chain, end, f'File "{code.co_filename}", line {chain.line}')
        torch_code = None if on_args else tensor_code(end, 0) or tensor_code(value, 0)  # (``W.sum()``: its root)
        if torch_code is not None:
            raise tensor_code_refusal(f"{self.function}.{phase} reads {chain.root}, which is or holds", torch_code,
                                      f'File "{code.co_filename}", line {chain.line}')

    def start(self, codes: set[types.CodeType], args: tuple[Any, ...],
              namespaces: dict[types.CodeType, dict[str, Any]], library: Any,
              backward_codes: set[types.CodeType] | None = None) -> None:
        """``library``: where the CallWatch keeps the library code the call runs
        (``library_ran.LibraryRan``; required: the watch hands it every library frame it keeps).
        ``backward_codes``: the codes analysed for backward (others run there are unanalysed)."""
        if may_call_unanalysed([*args, *self.reachable]) or runs_library_python([*args, *self.reachable]):
            self.calls = CallWatch({c for code in codes for c in nested_codes(code)},
                                   lambda frame: library_frame(frame, self.library_module), library,
                                   self.function, args)
            if backward_codes is not None:
                # (with the code nested in forward's: a lambda or inner def forward makes and
                # backward calls has its reads analysed as backward's too: ``Chain.deferred``)
                self.calls.backward_analysed = {c for code in backward_codes for c in nested_codes(code)} | \
                    {c for code in codes for c in nested_codes(code) if c is not code}
        if self.lookups:
            self.getattrs = GetattrWatch({c for code in self.lookups for c in nested_codes(code)}, args)
        naming = {c for code in codes if names_identity(code) - STAND_INS.keys() for c in nested_codes(code)}
        if naming:
            self.identity = IdentityWatch(naming, self.function)
        self.types = TypeAsEager(((g, names_identity(code)) for code, g in (namespaces or {}).items()),
                                 {c for code in codes for c in nested_codes(code)}, self.function)
        if self.calls is not None:
            self.calls.on_unanalysed = self._unanalysed

    def _unanalysed(self, code: types.CodeType, g: dict[str, Any]) -> None:
        """Code no analysis reached is called while traced: its names stand in as analysed
        code's do, and its ``id``/``hash`` of a traced tensor is refused."""
        if self.types is not None:
            self.types.unanalysed(code, g)
        if names_identity(code) & {"id", "hash"}:
            if self.identity is None:
                self.identity = IdentityWatch({code}, self.function)
            self.identity.codes.add(code)

    def put_back(self) -> None:
        """A trace that failed: what unanalysed code may have written, as it was (newest first)."""
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()

    def forward_done(self) -> None:
        """What is found from now on (code run, a getattr, an identity read, a tensor with no
        route), backward's tracing found."""
        self._forward_found = (len(self.reasons), len(self.getattrs.found) if self.getattrs else 0,
                               len(self.identity.found) if self.identity else 0)
        if self.calls is not None:
            self.calls.enter_backward()

    def stop(self) -> None:
        if self._forward_found is not None:
            now = (len(self.reasons), len(self.getattrs.found) if self.getattrs else 0,
                   len(self.identity.found) if self.identity else 0)
            self.backward_unknown |= now != self._forward_found
            self._forward_found = None
        if self.calls is not None:
            self.backward_unknown |= "backward" in self.calls.ran_in
            self.calls.stop()
            undo, start = self.calls.undo, self.calls.backward_from
            if "backward" in self.calls.ran_in and start is not None and not self.again:
                # Backward is traced again when it runs (``pystate.finish``), as eager's runs
                # then: what its unanalysed code wrote while traced now is put back.
                for entry in reversed(undo[start:]):
                    entry()
                undo = undo[:start]
            self.undo += undo
            self.reasons += [f"runs {what}, code minihop did not analyse ({where})" for what, where in self.calls.found]
            self.refused += self.calls.refused
            self.calls = None
        if self.getattrs is not None:
            self.getattrs.stop()
            self.reasons += self.getattrs.found
            self.getattrs = None
        if self.types is not None:
            self.types.stop()
        if self.identity is not None:
            self.identity.stop()
            self.reasons += [f"{self.function} {found}" for found in self.identity.found]
            self.refused += self.identity.refused
            self.identity = None

    def refuse(self) -> None:
        """An identity read the trace cannot answer as eager (``identity``), even where the
        user's code caught the error: raised."""
        if self.refused:
            raise self.refused[0]

    def single_use(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.reasons))
