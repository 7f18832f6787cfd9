"""Python state a user's Function reads and writes: found, guarded, replayed or refused.

Place in the pipeline: tracer. A capture replays tensor operations only, so everything the
user's ``forward``/``setup_context``/``backward`` do with ordinary Python values outside their
arguments' tensors must be handled here, or the capture would silently disagree with eager:

- **Reads** (a class attribute ``MyFn.scale``, a module global, a closure cell, an attribute
  of an object reached from them or from ``ctx``, an attribute of a user module) are found in
  the bytecode of the three methods and of the user's helper functions they reach
  (``LOAD_GLOBAL``/``LOAD_DEREF``/``LOAD_FAST`` followed by ``LOAD_ATTR``/constant subscripts),
  and each becomes a ``StateRead``: the capture is valid only while its value is unchanged
  (checked on every call, and again when backward runs for backward's reads). Reading more
  than the code will read only costs a recapture; reading less would be a stale answer.
  Values in arguments themselves are already in the call key (``runtime.guards``).
- **Writes** are judged by what runs, not by what is written: the Python state reachable
  from those same roots (and from the arguments) is snapshotted before tracing and compared
  after forward and after backward. A counter incremented (``+=``), a list extended with
  Python values, an attribute or item set to a constant becomes a ``StateWrite``, replayed on
  every call (the trace's own writes are undone, so capture leaves Python state as it found
  it). Any other write, and any ``print`` that runs, is a ``SideEffectError`` naming the place
  and the source line (or, with ``fallback="eager"``, an eager run).

Invariant: after ``StateTracker.finish`` the Python state is as it was before tracing, and
every difference tracing made is either in ``PythonState.writes`` or was raised as an error.
"""

from __future__ import annotations

import builtins
import collections
import copy
import dataclasses
import functools
import inspect
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import SideEffectError
from ..spec import MISSING, Place, PythonState, StateRead, StateWrite
from ..structure import argname, attributes
from . import collectives, effects, hidden, opaque
from .iterators import refuse_iterator_read
from .settings import setting_place
from .userattr import UserAttribute, served_by_user_code
from .chains import Chain, CodeFacts, code_facts
from .names import code_of

__all__ = ["StateTracker", "arg_masks", "is_library"]

_ATOMS = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device,
          torch.Size)
_MAX_OBJECTS = 2000  # a snapshot walks at most this many objects ...
_MAX_DEPTH = 6       # ... and this deep below its roots


# -- which objects are the user's ---------------------------------------------------------

_LIBRARY_PACKAGES = frozenset({"torch", "minihop", "numpy", "sympy", "typing_extensions",
                               "functorch", "builtins", "_pytest", "pytest", "pluggy",
                               *sys.stdlib_module_names})
_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})


@functools.lru_cache(maxsize=4096)
def _library_module(name: str) -> bool:
    top = name.split(".")[0]
    if top in _LIBRARY_PACKAGES:
        return True
    module = sys.modules.get(top)
    file = getattr(module, "__file__", None) or ""
    return bool(file) and file.startswith(_INSTALLED)


def is_library(value: Any) -> bool:
    """Whether ``value`` (a module, function or class) belongs to torch, the standard library,
    minihop or the test runner: its module state is not the user's to change, so chains
    through it are neither guarded nor watched. (Functions the user's code reaches through
    its own globals are analysed wherever they are defined.)"""
    if isinstance(value, types.ModuleType):
        name = value.__name__
    else:
        name = getattr(value, "__module__", None) or ""
    return _library_module(name) if isinstance(name, str) else False


def _is_user_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType) and not is_library(value)


# -- reads --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Root:
    """A chain's start, resolved: how to find it on a call, and its name."""

    description: str
    fetch: Callable[[tuple[Any, ...]], Any]
    uses_args: bool
    # Where the root itself is stored: ("globals", the globals dict, name) or ("cell", cell).
    home: tuple[Any, ...] | None = None


def _function(fn: Any) -> Any:
    return inspect.unwrap(getattr(fn, "__func__", fn))


def _resolve_root(fn: Any, chain: Chain, params: dict[str, Any], passed: int | None = None) -> _Root | None:
    """Where ``chain``'s root lives, for ``fn``'s code: a global, a closure cell, or one of
    the call's arguments (``params``: parameter name -> argument index, or "ctx"); a
    parameter past the ``passed`` arguments is its default, state like a global."""
    fn = _function(fn)
    code = fn.__code__
    if chain.root_kind == "global":
        g = fn.__globals__
        name = chain.root
        if name not in g and hasattr(builtins, name):
            return None  # a builtin (len, print, ...): not the user's state
        return _Root(name, lambda args, g=g, n=name: g.get(n, MISSING), False, ("globals", g, name))
    if chain.root_kind == "deref":
        if chain.root not in code.co_freevars:
            return None  # a local captured by an inner function
        cell = fn.__closure__[code.co_freevars.index(chain.root)]
        return _Root(chain.root, lambda args, c=cell: _cell_value(c), False, ("cell", cell))
    where = params.get(chain.root)
    if isinstance(where, _Bound) and chain.root not in code_facts(code).reassigned:
        return _Root(where.description, lambda args, o=where.obj: o, False)
    if isinstance(where, int) and chain.root not in code_facts(code).reassigned:
        # A parameter left out of the call holds its default: the same object every call
        # (``cache=[]``), state like a global's.
        default = _default_of(fn, chain.root)
        if passed is not None and where >= passed and default is not MISSING:
            # Not in the call key (no argument was passed for it): read and written as state.
            return _Root(f"{fn.__name__}'s default {chain.root}", lambda args, d=default: d, False)
        return _Root(chain.root, lambda args, i=where, d=default: args[i] if i < len(args) else d, True)
    return None


def _default_of(fn: Any, name: str) -> Any:
    """Parameter ``name``'s default value in ``fn``, or MISSING (read off the code: a
    signature object per chain costs more than the rest of the analysis)."""
    code = fn.__code__
    positional = code.co_varnames[:code.co_argcount]
    if name in positional:
        defaults = fn.__defaults__ or ()
        i = positional.index(name) - (len(positional) - len(defaults))
        return defaults[i] if i >= 0 else MISSING
    return (fn.__kwdefaults__ or {}).get(name, MISSING)


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return MISSING


def _walk(value: Any, steps: tuple[tuple[str, Any], ...], analysing: bool = True) -> Any:
    """The value at ``steps`` from ``value``. ``analysing``: stop at a step computed by user
    code (userattr); guards (``analysing=False``) walk chains analysis found free of them."""
    for kind, key in steps:
        if value is MISSING:
            return MISSING
        if kind == "attr":
            if isinstance(value, torch.Tensor) and key not in value.__dict__:
                return MISSING  # a tensor's own attributes are its properties, keyed elsewhere
            what = served_by_user_code(value, key, _library_module) if analysing else None
            if what is not None:  # never run the user's getter here (see userattr)
                return UserAttribute(value, key, what)
            try:
                value = getattr(value, key)
            except Exception:
                return MISSING
        else:
            try:
                value = value[key]
            except Exception:
                return MISSING
    return value


def _place(root: _Root, steps: tuple[tuple[str, Any], ...], analysing: bool = False) -> Place:
    """The place at ``root.steps`` (its owner found anew on every call)."""
    text = root.description + "".join(f".{k}" if kind == "attr" else f"[{k!r}]" for kind, k in steps)
    if not steps:
        return Place(text, lambda args, r=root: _RootBox(r.fetch(args)), ("attr", "value"), root.uses_args,
                     root.fetch)
    owner_steps = steps[:-1]
    return Place(text, lambda args, r=root, s=owner_steps, a=analysing: _walk(r.fetch(args), s, a), steps[-1],
                 root.uses_args, lambda args, f=root.fetch, s=steps, a=analysing: _walk(f(args), s, a))


def _reads_environment(value: Any, steps: tuple[tuple[str, Any], ...]) -> bool:
    """``os.environ[...]``, ``os.environ.get``, ``os.getenv`` (or those bound by name): the
    environment is a read like any global, guarded whole (it is small, and which key the code
    reads is an argument the bytecode chain does not hold)."""
    if value is os:
        return bool(steps) and steps[0] == ("attr", "environ") or steps[:1] == (("attr", "getenv"),)
    return value is os.environ or value is os.getenv


def _environment(args: tuple[Any, ...]) -> dict[Any, Any]:
    return dict(getattr(os.environ, "_data", os.environ))  # the raw bytes: no decoding per call


_ENVIRONMENT = Place("the environment (os.environ)", lambda args: _RootBox(_environment(args)),
                     ("attr", "value"), False, _environment)


@dataclasses.dataclass(frozen=True)
class _Bound:
    """A method's first parameter, bound to the user's object or class it was called on."""

    obj: Any
    description: str


# Library packages whose functions never draw from Python's random generator.
_NEVER_DRAW = frozenset({"torch", "math", "operator", "builtins", "functools", "itertools", "typing",
                         "minihop", "numbers", "cmath", "_operator"})


def _flag_place(fn: Callable[[], Any]) -> Place:
    return Place(f"torch.{fn.__name__}()", lambda args: _RootBox(fn()), ("attr", "value"), False,
                 lambda args: fn())


# Settings that read the same inside forward/backward as at the call (grad mode does not:
# autograd turns it off there, so it is not one of them).
_FLAG_PLACES = {id(fn): _flag_place(fn) for fn in (
    torch.get_default_dtype, torch.are_deterministic_algorithms_enabled,
    torch.is_deterministic_algorithms_warn_only_enabled, torch.get_float32_matmul_precision,
    torch.is_anomaly_enabled, torch.is_anomaly_check_nan_enabled)}


class _RootBox:
    """A root value seen as a place (its ``value`` attribute), for reads of a whole global."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _guarded_value(value: Any) -> bool:
    """All but Python modules and tensors (lifted inputs); a module keyed whole (value_key)."""
    return value is MISSING or not isinstance(value, (types.ModuleType, torch.Tensor))


def _params(fn: Any, method: str, uses_setup: bool) -> dict[str, Any]:
    """Parameter name -> argument index (or "ctx") for one of the user's methods."""
    code = code_of(fn)
    if code is None:
        return {}
    names = code.co_varnames[:code.co_argcount]
    if method == "forward":
        offset = 0 if uses_setup else 1
        found: dict[str, Any] = {n: i - offset for i, n in enumerate(names) if i >= offset}
        if not uses_setup and names:
            found[names[0]] = "ctx"
        return found
    return {names[0]: "ctx"} if names else {}


def _analysed(methods: tuple[tuple[str, Any, dict[str, Any]], ...]) -> Iterator[tuple[str, Any, CodeFacts, dict[str, Any]]]:
    """Each method, and each user helper function it reaches through globals or closures
    (their parameters are not the Function's arguments), with its code's facts."""
    seen: set[int] = set()
    todo = [(phase, fn, params, 0) for phase, fn, params in methods]
    while todo:
        phase, fn, params, depth = todo.pop(0)
        code = code_of(fn)
        if code is None or (id(code), phase) in seen:
            continue
        seen.add((id(code), phase))  # type: ignore[arg-type]
        facts = code_facts(code)
        fn = _function(fn)
        yield phase, fn, facts, params
        if depth >= 3:
            continue
        for chain in facts.chains:
            root = _resolve_root(fn, chain, {})
            if root is None or root.uses_args:
                continue
            steps = chain.steps if chain.method is None else (*chain.steps, ("attr", chain.method))
            value = _walk(root.fetch(()), steps)
            value = value.__func__ if isinstance(value, staticmethod) else value
            if isinstance(value, functools.partial):
                value = value.func  # what a partial calls reads what it reads
            if _is_user_function(value):
                todo.append((phase, value, {}, depth + 1))
            elif isinstance(value, types.MethodType) and _is_user_function(value.__func__) \
                    and value.__func__.__code__.co_argcount:
                # ``Config.scale_for(x)``, ``CFG.scale()``: a method of the user's class or
                # object; its ``cls``/``self`` is that object, state like the root it hangs from.
                holder = _place(root, steps[:-1]).description if steps else root.description
                todo.append((phase, value.__func__, {value.__func__.__code__.co_varnames[0]:
                                                     _Bound(value.__self__, holder)}, depth + 1))
            todo += [(phase, f, {f.__code__.co_varnames[0]: _Bound(o, root.description)} if o is not None else {},
                      depth + 1) for f, o in opaque.entry_points(value)]  # an inner apply, a module, ...


def _methods(parts: Any) -> tuple[tuple[str, Any, dict[str, Any]], ...]:
    uses_setup = parts.setup_context is not None
    found = [("forward", parts.forward, _params(parts.forward, "forward", uses_setup))]
    if parts.setup_context is not None:
        found.append(("forward", parts.setup_context, _params(parts.setup_context, "setup_context", True)))
    found.append(("backward", parts.backward, _params(parts.backward, "backward", True)))
    return tuple(found)


def arg_masks(parts: Any) -> dict[int, frozenset[str]]:
    """Attributes of argument objects that forward/backward only increment (``cfg.calls +=
    1``) or mutate (``cfg.log.append``): left out of the call key, since every call changes
    them; the replayed write keeps them as eager does. Only for arguments the code does not
    pass on to other functions (which might read them)."""
    masks: dict[int, set[str]] = collections.defaultdict(set)
    values: dict[int, set[str]] = collections.defaultdict(set)
    escaped: set[int] = set()
    for _phase, fn, facts, params in _analysed(_methods(parts)):
        for chain in facts.chains:
            where = params.get(chain.root) if chain.root_kind == "fast" else None
            if not isinstance(where, int):
                continue
            if chain.root in facts.escaping or chain.root in facts.reassigned:
                escaped.add(where)
            if not chain.steps:
                continue
            attr = str(chain.steps[0][1])
            if chain.use == "increment" and len(chain.steps) == 1:
                masks[where].add(attr)
            elif chain.use == "receiver" and len(chain.steps) == 1:
                pass  # the receiver of a store or mutating call: not read as a value
            else:
                values[where].add(attr)
    return {i: frozenset(m - values[i]) for i, m in masks.items() if i not in escaped and m - values[i]}


# -- the tracker ---------------------------------------------------------------------------

@dataclasses.dataclass
class _Seen:
    """One object of a snapshot: how to find it again, and a copy of its contents."""

    obj: Any
    root: _Root
    steps: tuple[tuple[str, Any], ...]
    kind: str  # "attrs", "list", "dict", "set", "globals", "cell"
    contents: Any


class _Marker:
    """What an attribute that is only stored to holds while tracing (see ``_mark_store_targets``)."""

    def __repr__(self) -> str:
        return "<minihop: not stored yet>"


class _PrintWatch:
    """``print`` while the user's code is traced (in the tracing thread): recorded, not run."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, int, str]] = []  # (function, line in it, where)
        self.thread = threading.get_ident()
        self.real = builtins.print

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() != self.thread:
            return self.real(*args, **kwargs)
        frame = sys._getframe(1)
        self.lines.append((frame.f_code.co_name, frame.f_lineno,
                           f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'))
        return None


class StateTracker:
    """Watches Python state across one capture's tracing (see the module docstring)."""

    def __init__(self, parts: Any, args: tuple[Any, ...], fn_cls: type) -> None:
        self.parts = parts
        self.name = parts.name
        self.args = args
        self.reads: list[StateRead] = []
        self.roots: list[tuple[_Root, Any]] = []
        self.stores: dict[tuple[str, str], str] = {}  # (phase, name stored) -> where
        # (phase, root, name) written by ``+=``/``-=``: ``F.calls += 1`` is (.., "F", "calls")
        self.increments: set[tuple[str, str, str]] = set()
        self.watch: _PrintWatch | None = None
        self.hidden_reads: hidden.ReadWatch | None = None
        # Whether Python's generator may be drawn from where the code does not name it.
        self.may_draw = False
        self.messages: effects.MessageWatch | None = None
        self.forward_writes: list[StateWrite] | None = None
        # (id of the function, name) -> (holder, name, function, kind, what): see _find_hidden_read.
        self.hidden_sites: dict[tuple[int, str], tuple[Any, str, Any, str, str]] = {}
        self.fn_cls = fn_cls
        # ``(expr, where, how) -> error`` for a symbolic number written out (see unbacked).
        self.on_symbolic: Callable[[Any, str | None, str], Exception] | None = None
        self._read_keys: set[tuple[str, str]] = set()
        self.opaque = opaque.Finder(self.name, _library_module)  # why it may be single-use
        self.analysed = tuple(_analysed(self._methods()))  # read once: three passes use it
        self._find_reads()
        self.marked = self._mark_store_targets()
        try:
            self.before = self._snapshot()
        except BaseException:
            self._unmark()  # no tracker comes back to do it
            raise
        self.after_forward: dict[int, _Seen] | None = None
        self.finished = False

    # reads: every chain of the code whose value is the user's state
    def _methods(self) -> tuple[tuple[str, Any, dict[str, Any]], ...]:
        """The Function's methods, and the user functions passed to it as arguments (a
        surrogate-gradient function ``backward`` calls, as snntorch's ``CustomSurrogate``
        takes): what they read is read by forward or backward, whichever calls them."""
        passed = tuple((phase, f, {f.__code__.co_varnames[0]: _Bound(o, "an argument")} if o is not None else {})
                       for a in self.args for f, o in ([(a, None)] if _is_user_function(a) else opaque.entry_points(a))
                       for phase in ("forward", "backward"))
        return (*_methods(self.parts), *passed)

    def _find_reads(self) -> None:
        seen_roots: set[str] = set()
        for phase, fn, facts, params in self.analysed:
            code = code_of(fn)
            self.opaque.note_code(phase, code)
            for attr, line in facts.stores:
                self.stores.setdefault((phase, attr), f'File "{code.co_filename}", line {line}')
            for chain in facts.chains:
                if chain.use == "increment":
                    self.increments.add((phase, chain.root, str(chain.steps[-1][1]) if chain.steps else chain.root))
            for chain in facts.chains:
                root = _resolve_root(fn, chain, params, len(self.args))
                if root is None:
                    continue
                value = root.fetch(self.args)
                named = chain.steps if chain.method is None else (*chain.steps, ("attr", chain.method))
                named_end = _walk(value, named) if named else value  # what the code calls or reads
                if not root.uses_args:  # (arguments: pipeline asked before the trace)
                    refuse_iterator_read(self.name, phase, chain.root, named_end)
                self.opaque.note_chain(phase, code, chain, value, named_end, root.uses_args)
                self._find_hidden_read(root, value, named, named_end)
                if _reads_environment(value, named):
                    self._add_read(_ENVIRONMENT, phase, code, chain.line)
                setting = _FLAG_PLACES.get(id(named_end)) or setting_place(named_end)
                if setting is not None:
                    self._add_read(setting, phase, code, chain.line)
                if isinstance(value, types.ModuleType) and is_library(value):
                    continue  # torch.sin, math.pi: not the user's state
                if root.description not in seen_roots:
                    seen_roots.add(root.description)
                    self.roots.append((root, value))
                if root.uses_args:
                    continue  # argument objects are in the call key, whole
                if chain.use in ("receiver", "increment"):
                    continue
                end = _walk(value, chain.steps)
                if not _guarded_value(end) or (not chain.steps and not _guarded_value(value)):
                    continue
                # Through a user getter: a place that stops there (never runs it), so a backward
                # read of it never matches and backward is traced again when it runs, running
                # the getter then, as eager's backward does (the capture is single-use).
                self._add_read(_place(root, chain.steps, isinstance(end, UserAttribute)), phase, code, chain.line)
                if isinstance(end, functools.partial):
                    # What the partial passes is read too (its keywords may change in place).
                    for part in ("args", "keywords"):
                        self._add_read(_place(root, (*chain.steps, ("attr", part))), phase, code, chain.line)
        for place in collectives.world_places():  # rank, world size, groups: constants in the graphs
            self._add_read(place, "forward", None, None)
        # The Function class is watched when its code names it (``MyFn.calls += 1``): a root above.

    def _find_hidden_read(self, root: _Root, value: Any, steps: tuple[tuple[str, Any], ...], end: Any) -> None:
        """A clock read or a process-wide generator's function that the code names (``time.time``,
        ``np.random.rand``, a global ``perf_counter``; ``end``, at ``steps`` from ``value``):
        where to watch it (hidden.ReadWatch)."""
        found = hidden.watched(end)
        if found is None:
            # A library function outside torch and math may draw from Python's generator
            # where the code cannot see it: then the generator's state is compared too.
            if callable(end) and not isinstance(end, type) and is_library(end) and \
                    (getattr(end, "__module__", None) or "").split(".")[0] not in _NEVER_DRAW:
                self.may_draw = True
            return
        if steps and steps[-1][0] == "attr":
            self.hidden_sites[(id(end), steps[-1][1])] = (_walk(value, steps[:-1]), steps[-1][1], end, *found)
        elif not steps and root.home is not None and root.home[0] == "globals":
            self.hidden_sites[(id(end), root.home[2])] = (root.home[1], root.home[2], end, *found)
        elif not steps and root.home is not None and root.home[0] == "cell":
            self.hidden_sites[(id(end), "cell")] = (root.home[1], "cell_contents", end, *found)
        elif found[0] == "random":
            self.may_draw = True  # reached where it cannot be swapped (a table): compare the state

    def _mark_store_targets(self) -> list[tuple[Any, str, Any]]:
        """Attributes the code stores to but never reads (``RECORDER.last = n``) hold a marker
        while tracing: a store of the value already there is a write all the same (eager makes
        it on every call, and the value may have changed by the next one)."""
        read_places = {r.place.description for r in self.reads}
        marked: list[tuple[Any, str, Any]] = []
        for phase, fn, facts, params in self.analysed:
            for target in facts.targets:
                root = _resolve_root(fn, target, {})
                if root is None or root.uses_args:
                    continue  # attributes of argument objects are in the call key
                place = _place(root, target.steps)
                if place.description in read_places:
                    continue  # guarded: the same before every call, so storing it again changes nothing
                owner = place.owner(self.args)
                name = str(target.steps[-1][1])
                setter = getattr(type(owner), name, None)
                if hasattr(setter, "__set__") and not isinstance(setter, types.MemberDescriptorType):
                    continue  # a property: reading or marking it would run the user's code in it
                try:
                    old = getattr(owner, name, MISSING) if owner is not MISSING else MISSING
                except Exception:  # a user __getattr__: not a plain attribute to mark
                    continue
                if owner is MISSING or isinstance(owner, types.ModuleType) or not (
                        old is MISSING or isinstance(old, _ATOMS)) or any(o is owner and n == name for o, n, _ in marked):
                    continue
                try:
                    _setattr(owner, name, _Marker())
                except Exception:
                    continue
                marked.append((owner, name, old))
        return marked

    def _unmark(self) -> None:
        for owner, name, old in self.marked:
            try:
                if old is MISSING:
                    if isinstance(getattr(owner, name, None), _Marker):
                        _delattr(owner, name)
                elif isinstance(getattr(owner, name, None), _Marker):
                    _setattr(owner, name, old)
            except Exception:
                continue
        self.marked = []

    def _add_read(self, place: Place, phase: str, code: types.CodeType | None, line: int | None) -> None:
        key = (place.description, phase)
        if key in self._read_keys:
            return
        self._read_keys.add(key)
        where = f'File "{code.co_filename}", line {line}' if code is not None else None
        self.reads.append(StateRead(place, phase, where))

    def read_ctx_chains(self, ctx: Any) -> None:
        """Backward's reads through ctx (``ctx.cfg.scale``): after forward ran, ``ctx.cfg`` is
        an object; if it is one reachable from the arguments or globals, the read is of that
        place (and checked again when backward runs). Objects forward created are its own."""
        index = {id(seen.obj): seen for seen in (self.after_forward or self.before).values()}
        for phase, fn, facts, params in self.analysed:
            code = code_of(fn)
            for chain in facts.chains:
                if chain.root_kind != "fast" or params.get(chain.root) != "ctx" or not chain.steps \
                        or chain.use != "value":
                    continue
                # What the user set on ctx (never a property such as saved_tensors: reading it
                # unpacks, and its fresh tuple's id could be any snapshotted object's).
                first = vars(ctx).get(str(chain.steps[0][1]), MISSING) if chain.steps[0][0] == "attr" else MISSING
                seen = index.get(id(first))
                if isinstance(first, (*_ATOMS, torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)):
                    continue  # a value, not a holder (a symbolic size is each call's own)
                if seen is None and isinstance(first, torch.nn.Module):  # keyed whole, not snapshotted
                    seen = _argument_seen(first, self.args, self.parts.argnames)
                if seen is None:
                    continue
                steps = (*seen.steps, *chain.steps[1:])
                end = _walk(first, chain.steps[1:])
                if _guarded_value(end):
                    self._add_read(_place(seen.root, steps, isinstance(end, UserAttribute)), phase, code, chain.line)

    # writes: snapshots of everything reachable from the roots
    def _snapshot(self) -> dict[int, _Seen]:
        found: dict[int, _Seen] = {}
        queue: collections.deque[tuple[Any, _Root, tuple[tuple[str, Any], ...], int]] = collections.deque()
        globals_seen: dict[int, tuple[Any, dict[str, Any]]] = {}
        for root, _ in self.roots:
            value = root.fetch(self.args)
            if root.home is not None and root.home[0] == "globals":
                _, g, name = root.home
                entry = globals_seen.setdefault(id(g), (g, {}))
                bound = g.get(name, MISSING)
                entry[1][name] = bound if self.hidden_reads is None else self.hidden_reads.real_of(bound)
            elif root.home is not None:
                cell = root.home[1]
                bound = _cell_value(cell)  # the user's own binding, not minihop's stand-in
                found.setdefault(id(cell), _Seen(cell, root, (), "cell", bound if self.hidden_reads
                                                 is None else self.hidden_reads.real_of(bound)))
            queue.append((value, root, (), 0))
        for i, a in enumerate(self.args):
            queue.append((a, _Root(argname(i, self.parts.argnames),
                                   lambda args, i=i: args[i] if i < len(args) else MISSING, True), (), 0))
        for gid, (g, names) in globals_seen.items():
            found[gid] = _Seen(g, _Root("globals", lambda args, g=g: g, False), (), "globals", dict(names))
        while queue and len(found) < _MAX_OBJECTS:
            value, root, steps, depth = queue.popleft()
            if id(value) in found or depth > _MAX_DEPTH:
                continue
            kind, contents = _contents(value)
            if kind is None:
                continue
            found[id(value)] = _Seen(value, root, steps, kind, contents)
            children = (contents.items() if kind in ("attrs", "dict") else
                        enumerate(contents) if kind == "list" else ())
            if isinstance(value, torch.nn.Module):
                children = [*children, *value._modules.items()]
            for key, child in children:
                step = ("attr", key) if kind == "attrs" else ("item", key)
                queue.append((child, root, (*steps, step), depth + 1))
        return found

    def start(self) -> None:
        """Before the user's code runs: watch ``print`` and the clock."""
        self.watch = _PrintWatch()
        builtins.print = self.watch
        codes = {fn.__code__ for _, fn, _, _ in self.analysed if hasattr(fn, "__code__")}
        self.opaque.start(codes, self.args)
        self.hidden_reads = hidden.ReadWatch(list(self.hidden_sites.values()), self.may_draw,
                                             lambda frame: frame.f_code in codes
                                             or not _library_module(frame.f_globals.get("__name__") or ""))
        self.messages = effects.MessageWatch(self.hidden_reads.is_user)

    def stop(self) -> None:
        self.opaque.stop()
        if self.watch is not None:
            builtins.print = self.watch.real
        if self.messages is not None:
            self.messages.stop()  # first: it swapped over hidden_reads' stand-ins
        if self.hidden_reads is not None:
            self.hidden_reads.stop()

    def abort(self) -> None:
        """After tracing, however it ended: ``print`` restored, Python state put back."""
        self.stop()
        if not self.finished:
            self.finished = True
            self.opaque.put_back()  # what unanalysed code wrote, then what pystate watched
            _restore(self.before)
            self._unmark()

    def existed_before(self, value: Any) -> bool:
        """Whether ``value`` is an object of the Python state forward found (not its own)."""
        return id(value) in self.before

    def forward_done(self) -> None:
        self.after_forward = self._snapshot()
        # Classified now: a value forward set (a fresh dict) is copied as forward left it,
        # before backward changes it.
        self.forward_writes = self._writes(self.before, self.after_forward, "forward")
        if self.hidden_reads is not None:
            self.hidden_reads.check_generator()
            self.hidden_reads.phase = "backward"
        if self.messages is not None:
            self.messages.refuse(f"{self.name}.forward", self.hidden_reads)

    def finish(self, ctx: Any) -> PythonState:
        """Undo what tracing did to Python state; return what it read and the writes each
        call must replay. Raises ``SideEffectError`` for a write that cannot be replayed."""
        self.stop()
        after_forward = self.after_forward if self.after_forward is not None else self._snapshot()
        after = self._snapshot()
        try:
            writes = [*(self.forward_writes if self.forward_writes is not None
                        else self._writes(self.before, after_forward, "forward")),
                      *self._writes(after_forward, after, "backward")]
            if self.watch is not None and self.watch.lines:
                method, line, where = self.watch.lines[0]
                raise SideEffectError(
                    f"{self.name}.{method} calls `print` (line {line}).",
                    "A capture replays only tensor operations and the simple Python writes "
                    "minihop can repeat (counters, appends, constants); printing happens once, "
                    "while tracing, and never again when the graphs run.",
                    "Print outside the Function, or behind a flag that is off (if DEBUG: ...), "
                    "or run it eagerly with minihop.function(F, fallback='eager').",
                    where=where)
            if self.messages is not None:
                self.messages.refuse(f"{self.name}.backward", self.hidden_reads)
            if self.hidden_reads is not None and self.hidden_reads.reads:
                phase, kind, what, line, where = self.hidden_reads.reads[0]
                if kind == "clock":
                    raise SideEffectError(
                        f"{self.name}.{phase} reads the clock or the system's entropy "
                        f"(`{what}`, line {line}).",
                        "A capture records tensor operations: the value read while tracing would "
                        "be a constant in the graphs, and every call would reuse it where eager "
                        "reads a new one.",
                        "Read it outside the Function and pass it in as an argument, or run it "
                        "eagerly with minihop.function(F, fallback='eager').",
                        where=where)
                if kind == "seed":
                    raise SideEffectError(
                        f"{self.name}.{phase} seeds torch's random generator (`{what}`, line {line}).",
                        "A capture records tensor operations, and seeding is none: it would run "
                        "once, while tracing, so later calls' random ops would draw other numbers "
                        "than eager's, which reseeds on every call.",
                        "Seed outside the Function (before each call, if every call needs the same "
                        "numbers), pass a torch.Generator seeded outside as an argument, or run it "
                        "eagerly with minihop.function(F, fallback='eager').",
                        where=where)
                named = f" (`{what}`, line {line})" if what else " (in a function it calls)"
                self._refuse_draw(f"{phase} draws from {hidden.describe_global(kind)}{named}", where)
            self.read_ctx_chains(ctx)
            self.opaque.undo.clear()  # the trace stands for this call: unanalysed code's writes stay
        finally:
            self.abort()
        return PythonState(tuple(self.reads), tuple(writes), self.opaque.single_use())

    def _writes(self, old: dict[int, _Seen], new: dict[int, _Seen], phase: str) -> list[StateWrite]:
        read_places = {r.place.description for r in self.reads}
        writes: list[StateWrite] = []
        for key, was in old.items():
            later = new.get(key)
            if later is None or later.obj is not was.obj:
                continue  # not reachable any more: nothing of it is state the next call sees
            now = later.contents
            if _same(was.kind, was.contents, now):
                continue
            for step, before, after in _differences(was.kind, was.contents, now):
                writes.append(self._write(was, step, before, after, phase, read_places))
        return writes

    def _write(self, was: _Seen, step: tuple[str, Any], before: Any, after: Any, phase: str,
               read_places: set[str]) -> StateWrite:
        if was.kind == "hidden":
            self._refuse_hidden(was, phase)
        if was.kind == "globals":
            place = Place(f"global {step[1]}", lambda args, g=was.obj: g, ("item", step[1]))
        elif was.kind == "cell":
            place = Place(f"closure variable {was.root.description}", lambda args, c=was.obj: c, ("cell", None))
        else:
            place = _place(was.root, was.steps if step == ("extend", None) else (*was.steps, step))
        name = was.root.description if step[0] in ("extend", "cell") else str(step[1])
        where = self.stores.get((phase, name)) or self.stores.get((phase, str(step[1])))
        symbolic = [v.node.expr for v in (after if isinstance(after, (tuple, list)) else (after,))
                    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))]
        if symbolic and self.on_symbolic is not None:
            # A number read from data (an unbacked symbol): written out, it must be a value.
            raise self.on_symbolic(symbolic[0], where, f"it is written to {place.description}")
        if step == ("extend", None):
            if all(isinstance(v, _ATOMS) or _atom_tuple(v) for v in after):
                return StateWrite(place, "extend", tuple(after), phase, where)
            return self._refuse(place, phase, where, "appends objects minihop cannot repeat to")
        if isinstance(after, _ATOMS) and not isinstance(after, torch.Tensor) or _atom_tuple(after):
            guarded = place.description in read_places
            # An unguarded counter (``+=``) is replayed as its increment, exact for ints
            # only; a value set outright, or a guarded one (the same before every call), is
            # replayed by setting it again.
            root = place.description.removeprefix("global ").removeprefix("closure variable ")
            root = root.split(".")[0].split("[")[0]
            if not guarded and (phase, root, name) in self.increments:
                if type(before) is int and type(after) is int:
                    return StateWrite(place, "add", after - before, phase, where)
                return self._refuse(place, phase, where, "increments (not by whole numbers)")
            return StateWrite(place, "set", after, phase, where)
        if step[0] != "whole" and (after is MISSING or effects.constant_container(after)):
            # Deleted (``opts.pop("k")``), or a fresh container of constants set
            # (``Recorder.meta = {"seen": []}``): replayed as eager does it, each call.
            return StateWrite(place, "set" if after is MISSING else "copy",
                              after if after is MISSING else copy.deepcopy(after), phase, where)
        if isinstance(after, torch.Tensor) or _holds_tensor(after):
            return self._refuse(place, phase, where, "puts a tensor into", tensor=True)
        return self._refuse(place, phase, where, "changes")

    def _refuse(self, place: Place, phase: str, where: str | None, what: str, *, tensor: bool = False) -> StateWrite:
        self.abort()  # Python state put back before the error reaches the user
        todo = ("Return the tensor from forward instead, or run it eagerly with "
                "minihop.function(F, fallback='eager')." if tensor else
                "Keep such state out of the Function, make it a counter, an append of Python "
                "values or a constant, or run it eagerly with minihop.function(F, fallback='eager').")
        raise SideEffectError(
            f"{self.name}.{phase} {what} {place.description}, Python state it did not create.",
            "A capture replays tensor operations and only simple Python writes (counter "
            "increments, appends of Python values, constants set); this one would happen once, "
            "while tracing, and never again when the graphs run.",
            todo, where=where)


    def _refuse_hidden(self, was: _Seen, phase: str) -> None:
        place = was.root.description if not was.steps else _place(was.root, was.steps).description
        self._refuse_draw(f"{phase} {hidden.taking(was.obj)} {place}", None)

    def _refuse_draw(self, what: str, where: str | None) -> None:
        self.abort()  # generators put back before the error reaches the user
        raise SideEffectError(
            f"{self.name}.{what}, state Python keeps out of sight.",
            "A capture records tensor operations: a number drawn from a Python or numpy random "
            "generator, or taken from an iterator, while tracing would be a constant in the "
            "graphs, and every call would reuse it where eager draws a new one.",
            "Draw with torch instead (torch.rand(()) is recorded and drawn again on every "
            "call), pass the number in as an argument, or run it eagerly with "
            "minihop.function(F, fallback='eager').", where=where)


def _argument_seen(value: Any, args: tuple[Any, ...], argnames: tuple[str, ...]) -> _Seen | None:
    """``value`` as an argument (by identity), for a backward read through ctx: forward's key
    held its state, but the caller may change it before backward (``drop.eval()``)."""
    for i, a in enumerate(args):
        if a is value:
            return _Seen(a, _Root(argname(i, argnames), lambda call, i=i: call[i], True), (), "attrs", None)
    return None


def _atom_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, _ATOMS) or _atom_tuple(v) for v in value)


def _holds_tensor(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return any(isinstance(v, torch.Tensor) or _holds_tensor(v) for v in items)


_UNWATCHED = frozenset({int, float, bool, str, bytes, complex, type(None), torch.Tensor,
                        torch.nn.Parameter, types.ModuleType, types.FunctionType, tuple, frozenset})


def _contents(value: Any) -> tuple[str | None, Any]:
    """A shallow copy of what an object holds, for a later comparison (None: not watched)."""
    if type(value) in _UNWATCHED:
        return None, None
    if isinstance(value, torch.nn.Module):
        # Its plain attributes (``training``, ``self.steps``); parameters, buffers and
        # submodules live in its underscore dicts (submodules are walked as children).
        return "attrs", {k: v for k, v in vars(value).items() if not k.startswith("_")}
    if isinstance(value, _ATOMS) or isinstance(value, (torch.Tensor, types.ModuleType, types.FunctionType,
                                                       types.BuiltinFunctionType, types.MethodType,
                                                       staticmethod, classmethod, property, tuple,
                                                       frozenset, torch.nn.Module)) or value is MISSING:
        return None, None
    state = hidden.fingerprint(value)
    if state is not None:
        return "hidden", state  # a random generator or an iterator: refused if it moves
    if isinstance(value, (list, collections.deque)):
        return "list", list(value)
    if isinstance(value, dict):
        return "dict", dict(value)
    if isinstance(value, set):
        return "set", set(value)
    if isinstance(value, type):
        if is_library(value) or not issubclass(value, torch.autograd.Function) and value.__module__ == "builtins":
            return None, None
        return "attrs", {k: v for k, v in vars(value).items() if not k.startswith("__") and not k.startswith("_minihop")
                         and not isinstance(v, (types.FunctionType, staticmethod, classmethod, property))}
    if is_library(type(value)) and not _plain_holder(value):
        return None, None
    try:
        return "attrs", attributes(value)
    except Exception:
        return None, None


def _plain_holder(value: Any) -> bool:
    """A library object that only holds the user's values as attributes (``SimpleNamespace``,
    ``argparse.Namespace``, ``threading.local``): watched like the user's own objects. Other
    library objects keep their own bookkeeping (a logger's cache), which is not the user's."""
    cls = type(value)
    return isinstance(value, (types.SimpleNamespace, threading.local)) or \
        (cls.__module__ == "argparse" and cls.__name__ == "Namespace")


def _same(kind: str, old: Any, new: Any) -> bool:
    if kind == "cell":
        return old is new or (isinstance(old, _ATOMS) and type(old) is type(new) and old == new)
    if kind in ("attrs", "dict", "globals"):
        return old.keys() == new.keys() and all(old[k] is new[k] for k in old)
    if kind == "list":
        return len(old) == len(new) and all(a is b for a, b in zip(old, new))
    return old == new


def _differences(kind: str, old: Any, new: Any) -> Iterator[tuple[tuple[str, Any], Any, Any]]:
    if kind == "cell":
        yield ("cell", None), old, new
        return
    if kind in ("attrs", "dict", "globals"):
        step_kind = "attr" if kind == "attrs" else "item"
        for k in (*old.keys(), *(k for k in new if k not in old)):
            a, b = old.get(k, MISSING), new.get(k, MISSING)
            if a is not b:
                yield (step_kind, k), a, b
        return
    if kind == "list" and len(new) >= len(old) and all(a is b for a, b in zip(old, new)):
        yield ("extend", None), None, new[len(old):]
        return
    yield ("whole", None), old, new


def _restore(snapshot: dict[int, _Seen]) -> None:
    """Put every watched object back as the snapshot saw it."""
    for seen in snapshot.values():
        obj, old = seen.obj, seen.contents
        try:
            if seen.kind == "globals":
                for k, v in old.items():
                    if v is MISSING:
                        obj.pop(k, None)
                    elif obj.get(k, MISSING) is not v:
                        obj[k] = v
            elif seen.kind == "cell":
                if old is not MISSING and _cell_value(obj) is not old:
                    obj.cell_contents = old
            elif seen.kind == "hidden":
                if hidden.fingerprint(obj) != old:
                    hidden.restore(obj, old)
            elif seen.kind in ("list", "dict", "set"):
                if not _same(seen.kind, old, obj):
                    obj.clear()
                    (obj.extend if seen.kind == "list" else obj.update)(old)
            elif seen.kind == "attrs":
                now = _contents(obj)[1] or {}
                for k in now:
                    if k not in old:
                        _delattr(obj, k)
                for k, v in old.items():
                    if now.get(k, MISSING) is not v:
                        _setattr(obj, k, v)
        except Exception:
            continue


def _setattr(obj: Any, name: str, value: Any) -> None:
    # object.__setattr__ past a user's own __setattr__; a thread-local's needs its own.
    setter = type.__setattr__ if isinstance(obj, type) else setattr if _plain_holder(obj) else object.__setattr__
    setter(obj, name, value)


def _delattr(obj: Any, name: str) -> None:
    deleter = type.__delattr__ if isinstance(obj, type) else delattr if _plain_holder(obj) else object.__delattr__
    deleter(obj, name)
