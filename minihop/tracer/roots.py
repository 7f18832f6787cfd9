"""Where the user's code reads Python state from: its roots, found in the bytecode.

Place in the pipeline: tracer, asked by ``pystate.StateTracker`` before the trace (and by
``pipeline`` for ``arg_masks``). The three methods of a Function, and the user's helper
functions they reach through globals, closures and bound methods, are analysed
(``analysed``); each chain a code reads (``chains.Chain``) is resolved to a ``spec.Root``: a
global, a closure cell, an argument or a parameter's default, found anew on every call. A
``spec.Place`` at steps below a root (``place_at``) is what a ``StateRead`` guards and a
``StateWrite`` replays. The heap watch (``heap``) snapshots from these same roots.

Invariant: a root is resolved from the function's own globals/closure/parameters, never from
a value seen while tracing, so a guard re-reads the caller's current state on every call.
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import functools
import inspect
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..library_state import global_module_hooks
from ..user_code import item_served_by_code
from ..spec import MISSING, Place, Root
from ..place import walk_plain
from . import opaque
from .atoms import CONSTANTS
from .chains import Chain, CodeFacts, code_facts
from .imports import module_root
from .library import is_user_function, library_module
from .names import code_of
from .userattr import UserAttribute, served_by_user_code

__all__ = ["ENVIRONMENT", "FLAG_PLACES", "MODULE_HOOKS", "UNANALYSED", "Bound", "analysed", "arg_masks", "cell_place", "cell_value",
           "global_place", "guarded_value", "method_objects", "methods_and_passed", "methods_of", "place_at", "reads_environment", "resolve_root",
           "value_place", "walk"]

def function_of(fn: Any) -> Any:
    return inspect.unwrap(getattr(fn, "__func__", fn))


def wrapper_layers(fn: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The user's own wrappers around ``fn`` (outermost first), down to, not including, the
    function ``inspect.unwrap`` finds, each with its parameters' bindings: a wrapper function
    (``functools.wraps``), or a callable object's ``__call__`` with ``self`` bound to it.
    Library wrappers (``custom_fwd``, ``once_differentiable``) are left out: their reads are
    torch's, watched as such."""
    found: list[tuple[Any, dict[str, Any]]] = []
    f = getattr(fn, "__func__", fn)
    while hasattr(f, "__wrapped__") and len(found) < 16:
        if issubclass(type(f), types.FunctionType) and is_user_function(f):
            # (a copy without ``__wrapped__``, sharing its code, globals and cells, so that
            # what unwraps a function for its code, here, stops at the wrapper)
            layer = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
            layer.__kwdefaults__ = f.__kwdefaults__
            found.append((layer, {}))
        elif not issubclass(type(f), types.FunctionType) and is_user_function(getattr(type(f), "__call__", None)):
            call = type(f).__call__
            found.append((call, {call.__code__.co_varnames[0]: Bound(f, f"{getattr(fn, '__qualname__', 'forward')}'s decorator")}
                          if call.__code__.co_argcount else {}))
        f = f.__wrapped__
    return found


def resolve_root(fn: Any, chain: Chain, params: dict[str, Any], passed: int | None = None) -> Root | None:
    """Where ``chain``'s root lives, for ``fn``'s code: a global, a closure cell, or one of
    the call's arguments (``params``: parameter name -> argument index, or "ctx"); a
    parameter past the ``passed`` arguments is its default, state like a global."""
    fn = function_of(fn)
    code = fn.__code__
    if chain.root_kind == "global":
        g = fn.__globals__
        name = chain.root
        if name not in g and hasattr(builtins, name):
            return None  # a builtin (len, print, ...): not the user's state
        return global_place(g, name, name).root
    if chain.root_kind == "import":
        return module_root(fn, chain)  # a module the code imports itself (``import numpy as np``)
    if chain.root_kind == "deref" and chain.root in code.co_cellvars and chain.deferred \
            and issubclass(type(params.get(chain.root)), int) and all(n != chain.root for n, _ in code_facts(code).stores):
        # A parameter a function it defines captures (``lambda g: g * cfg.s``): that function
        # reads the argument when it runs, backward's call of it too.
        chain = dataclasses.replace(chain, root_kind="fast")
    if chain.root_kind == "deref":
        if chain.root not in code.co_freevars:
            return None  # a local captured by an inner function
        cell = fn.__closure__[code.co_freevars.index(chain.root)]
        return cell_place(cell, chain.root, chain.root).root
    where = params.get(chain.root)
    if issubclass(type(where), Bound) and chain.root not in code_facts(code).reassigned:
        return Root("class" if issubclass(type(where.obj), type) else "value", where.description, where.description,
                    lambda args, o=where.obj: o)
    if issubclass(type(where), int) and chain.root not in code_facts(code).reassigned:
        # A parameter left out of the call holds its default: the same object every call
        # (``cache=[]``), state like a global's.
        default = default_of(fn, chain.root)
        if passed is not None and where >= passed and default is not MISSING:
            # Not in the call key (no argument was passed for it): read and written as state.
            text = f"{fn.__name__}'s default {chain.root}"
            return Root("value", text, text, lambda args, d=default: d)
        return Root("arg", where, chain.root, lambda args, i=where, d=default: args[i] if i < len(args) else d)
    if where is None and chain.root not in code_facts(code).reassigned:
        # A helper's parameter (a helper's arguments are not the Function's): its mutable
        # default (``def acc(v, seen=[])``, ``*, cache={}``) is one object every call, read and
        # grown like a global; keyed like one.
        default = default_of(fn, chain.root)
        if default is not MISSING and not issubclass(type(default), (*CONSTANTS, tuple, frozenset)):
            text = f"{fn.__name__}'s default {chain.root}"
            return Root("value", text, text, lambda args, d=default: d)
    return None


def global_place(g: dict[str, Any], name: str, description: str) -> Place:
    """Global ``name`` of the globals dict ``g`` (written into ``g``)."""
    return Place(Root("global", name, description, lambda args, g=g, n=name: g.get(n, MISSING), home=g))


def cell_place(cell: Any, name: str, description: str) -> Place:
    """Closure variable ``name``, held in ``cell`` (written into the cell)."""
    return Place(Root("cell", name, description, lambda args, c=cell: cell_value(c), home=cell))


def default_of(fn: Any, name: str) -> Any:
    """Parameter ``name``'s default value in ``fn``, or MISSING (read off the code: a
    signature object per chain costs more than the rest of the analysis)."""
    code = fn.__code__
    positional = code.co_varnames[:code.co_argcount]
    if name in positional:
        defaults = fn.__defaults__ or ()
        i = positional.index(name) - (len(positional) - len(defaults))
        return defaults[i] if i >= 0 else MISSING
    return (fn.__kwdefaults__ or {}).get(name, MISSING)


def cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return MISSING


def walk(value: Any, steps: tuple[tuple[str, Any], ...], analysing: bool = True) -> Any:
    """The value at ``steps`` from ``value``. ``analysing``: stop at a step computed by user
    code (userattr); guards (``analysing=False``) walk chains analysis found free of them."""
    if not analysing:
        return walk_plain(value, steps)
    for step in steps:
        if value is MISSING:
            return MISSING
        kind, key = step
        if kind == "attr" and not issubclass(type(value), torch.Tensor):
            what = served_by_user_code(value, key, library_module)
            if what is not None:  # never run the user's getter here (see userattr)
                return UserAttribute(value, f".{key}", what)
        elif kind != "attr":
            what = item_served_by_code(value, key, library_module)
            if what is not None:  # nor the user's __getitem__, a key's __hash__, a factory
                return UserAttribute(value, f"[{key!r}]", what)
        value = walk_plain(value, (step,))
    return value


def tensor_holder(steps: tuple[tuple[str, Any], ...], end: Any,
                  holder: Callable[[], Any]) -> tuple[tuple[tuple[str, Any], ...], Any]:
    """A read through ctx that ends at a tensor in a list or dict (``ctx.ws[-1]``,
    ``ctx.parts["b"]``): which tensor that is depends on the container as backward finds it
    (the caller may append or delete after forward), so the read is of the container
    (``holder()``, at ``steps[:-1]``): its length, keys and tensors' properties."""
    if issubclass(type(end), torch.Tensor) and steps:
        container = holder()
        if type(container) in (list, dict):
            return steps[:-1], container
    return steps, end


def place_at(root: Root, steps: tuple[tuple[str, Any], ...], analysing: bool = False) -> Place:
    """The place at ``root.steps``, with its reader compiled (``analysing``: it stops at a
    step computed by user code, as ``walk`` does)."""
    if not steps:
        return Place(root, (), root.fetch)
    if analysing:
        return Place(root, steps, lambda args, f=root.fetch, s=steps: walk(f(args), s, True))
    return Place(root, steps, lambda args, f=root.fetch, s=steps: walk_plain(f(args), s))


def reads_environment(value: Any, steps: tuple[tuple[str, Any], ...]) -> bool:
    """``os.environ[...]``, ``os.environ.get``, ``os.getenv`` (or those bound by name): the
    environment is a read like any global, guarded whole (it is small, and which key the code
    reads is an argument the bytecode chain does not hold)."""
    if value is os:
        return bool(steps) and steps[0] == ("attr", "environ") or steps[:1] == (("attr", "getenv"),)
    return value is os.environ or value is os.getenv


def value_place(description: str, fetch: Callable[[tuple[Any, ...]], Any]) -> Place:
    """The place of an answer fetched on each call (a setting, the environment)."""
    return Place(Root("value", description, description, fetch), (), fetch)


def environment(args: tuple[Any, ...]) -> dict[Any, Any]:
    return dict(getattr(os.environ, "_data", os.environ))  # the raw bytes: no decoding per call


ENVIRONMENT = value_place("the environment (os.environ)", environment)
# What code minihop did not analyse read while backward was traced (a read of backward whose
# captured value no call matches: ``spec.UNMATCHED``).
UNANALYSED = value_place("what code minihop did not analyse reads", lambda args: None)
# Read where the code names a module class (``nn.ReLU()(x)``, in forward or a helper): calling
# the module it builds runs them (a module argument's or global's key holds them already).
MODULE_HOOKS = value_place("the hooks registered for every module", lambda args: global_module_hooks())


@dataclasses.dataclass(frozen=True)
class Bound:
    """A method's first parameter, bound to the user's object or class it was called on."""

    obj: Any
    description: str


def flag_place(fn: Callable[[], Any]) -> Place:
    return value_place(f"torch.{fn.__name__}()", lambda args: fn())


# Settings that read the same inside forward/backward as at the call (grad mode does not:
# autograd turns it off there, so it is not one of them).
FLAG_PLACES = {id(fn): flag_place(fn) for fn in (
    torch.get_default_dtype, torch.are_deterministic_algorithms_enabled,
    torch.is_deterministic_algorithms_warn_only_enabled, torch.get_float32_matmul_precision,
    torch.is_anomaly_enabled, torch.is_anomaly_check_nan_enabled)}


def guarded_value(value: Any) -> bool:
    """All but Python modules and tensors (lifted inputs); a module keyed whole (value_key)."""
    return value is MISSING or not issubclass(type(value), (types.ModuleType, torch.Tensor))


def params_of(fn: Any, method: str, uses_setup: bool) -> dict[str, Any]:
    """Parameter name -> argument index (or "ctx") for one of the user's methods (a
    ``functools.partial``'s: the parameters it leaves to the call)."""
    bound: tuple[int, Any] = (0, {})
    if issubclass(type(fn), functools.partial):
        fn, bound = fn.func, (len(fn.args), fn.keywords)
    code = code_of(fn)
    if code is None:
        return {}
    names = tuple(n for n in code.co_varnames[bound[0]:code.co_argcount] if n not in bound[1])
    found: dict[str, Any] = {}
    owner = getattr(fn, "__self__", None) if issubclass(type(fn), types.MethodType) else None
    if owner is not None and names:
        # A classmethod ``forward(cls, ctx, x)``: its first parameter is the class it was
        # called on (``cls.SLOPE`` is that class's attribute), and ctx and the arguments follow.
        found[names[0]] = Bound(owner, getattr(owner, "__qualname__", type(owner).__qualname__))
        names = names[1:]
    if method == "forward":
        offset = 0 if uses_setup else 1
        found.update({n: i - offset for i, n in enumerate(names) if i >= offset})
        if not uses_setup and names:
            found[names[0]] = "ctx"
        return found
    if names:
        found[names[0]] = "ctx"
    return found


# How far through the user's helpers the analysis follows (BFS: nearest first): calls and
# functions analysed. Beyond, code runs under the call watch, which keeps and puts back less.
_HELPER_DEPTH, _MAX_ANALYSED = 12, 512


def analysed(methods: tuple[tuple[str, Any, dict[str, Any]], ...]
             ) -> Iterator[tuple[str, Any, CodeFacts, dict[str, Any]]]:
    """Each method, and each user helper function it reaches through globals or closures
    (their parameters are not the Function's arguments), with its code's facts."""
    seen: set[int] = set()
    todo = [(phase, fn, params, 0) for phase, fn, params in methods]
    # A method the user decorated (``@counting``, ``functools.wraps``): its code is the
    # innermost function's, but each wrapper of the user's runs too, reading its own cells
    # and globals (a call counter): analysed as helpers (their ``*args`` are not named).
    # (at the method's own depth: a wrapper is the method as the caller runs it)
    todo += [(phase, layer, bound, 0) for phase, fn, _ in methods for layer, bound in wrapper_layers(fn)]
    while todo:
        phase, fn, params, depth = todo.pop(0)
        code = code_of(fn)
        if code is None or (id(code), phase) in seen:
            continue
        seen.add((id(code), phase))  # type: ignore[arg-type]
        facts = code_facts(code)
        fn = function_of(fn)
        yield phase, fn, facts, params
        if depth >= _HELPER_DEPTH or len(seen) >= _MAX_ANALYSED:
            continue  # (deeper helpers run under the call watch: ``call_watch.CallWatch``)
        for chain in facts.chains:
            # (a helper reached through a bound ``self``/``cls``, ``cls._helper(x)``, too)
            root = resolve_root(fn, chain, {k: v for k, v in params.items() if issubclass(type(v), Bound)})
            if root is None or root.uses_args:
                continue
            steps = chain.steps if chain.method is None else (*chain.steps, ("attr", chain.method))
            value = walk(root.fetch(()), steps)
            value = value.__func__ if issubclass(type(value), staticmethod) else value
            if issubclass(type(value), functools.partial):
                value = value.func  # what a partial calls reads what it reads
            # (a helper forward hands on uncalled, or one a function forward defines calls:
            # backward may call it later, so it is analysed for backward too)
            phases = (phase, "backward") if (chain.deferred or chain.handed) and phase == "forward" else (phase,)
            if is_user_function(value):
                todo += [(p, value, {}, depth + 1) for p in phases]
            elif issubclass(type(value), types.MethodType) and is_user_function(value.__func__) \
                    and value.__func__.__code__.co_argcount:
                # ``Config.scale_for(x)``, ``CFG.scale()``: a method of the user's class or
                # object; its ``cls``/``self`` is that object, state like the root it hangs from.
                holder = place_at(root, steps[:-1]).description if steps else root.description
                todo += [(p, value.__func__, {value.__func__.__code__.co_varnames[0]: Bound(value.__self__, holder)},
                          depth + 1) for p in phases]
            todo += [(p, f, {f.__code__.co_varnames[0]: Bound(o, root.description)} if o is not None else {},
                      depth + 1) for f, o in opaque.entry_points(value) for p in phases]  # an inner apply, a module, ...


def methods_of(parts: Any) -> tuple[tuple[str, Any, dict[str, Any]], ...]:
    """The Function's methods as code to analyse, with their parameters: a method that is a
    callable object (``forward = staticmethod(Impl())``) is its ``__call__`` bound to it, one
    that is a ``functools.partial`` its function (``partial_reads``: what it passes)."""
    uses_setup = parts.setup_context is not None
    found = [("forward", parts.forward, "forward"), ("backward", parts.backward, "backward")]
    if parts.setup_context is not None:
        found.insert(1, ("forward", parts.setup_context, "setup_context"))
    out = []
    for phase, fn, method in found:
        if not issubclass(type(fn), (types.FunctionType, types.MethodType, functools.partial)) \
                and issubclass(type(getattr(type(fn), "__call__", None)), types.FunctionType):
            fn = fn.__call__  # (a bound method: its ``self`` is the object, state like a global)
        params = params_of(fn, method, uses_setup or method != "forward")
        out.append((phase, fn.func if issubclass(type(fn), functools.partial) else fn, params))
    return tuple(out)


def methods_and_passed(parts: Any, args: tuple[Any, ...]) -> tuple[tuple[str, Any, dict[str, Any]], ...]:
    """The Function's methods (``methods_of``), and the user functions passed to it as
    arguments (a surrogate-gradient function ``backward`` calls, as snntorch's
    ``CustomSurrogate`` takes): what they read is read by forward or backward, whichever calls them."""
    passed = tuple((phase, f, {f.__code__.co_varnames[0]: Bound(o, "an argument")} if o is not None else {})
                   for a in args for f, o in ([(a, None)] if is_user_function(a) else opaque.entry_points(a))
                   for phase in ("forward", "backward"))
    return (*methods_of(parts), *passed)


def method_objects(parts: Any) -> list[tuple[str, Place | str]]:
    """For each method that is not a plain function: what a ``functools.partial`` passes (its
    ``args`` and ``keywords``, which may change in place: read places of the phase it runs
    in), or, for one whose code no analysis can read (a C function), why the capture is
    single-use."""
    found: list[tuple[str, Place | str]] = []
    for phase, name, fn in (("forward", "forward", parts.forward), ("forward", "setup_context", parts.setup_context),
                            ("backward", "backward", parts.backward)):
        if issubclass(type(fn), functools.partial):
            place = value_place(f"{parts.name}.{name} (a functools.partial)", lambda args, p=fn: p)
            found += [(phase, place_at(place.root, (("attr", part),))) for part in ("args", "keywords")]
        if fn is not None and code_of(getattr(fn, "func", fn)) is None and not issubclass(type(getattr(type(fn), "__call__", None)), types.FunctionType):
            found.append((phase, f"{parts.name}.{name} is {type(fn).__name__} {fn!r}, code minihop cannot analyse"))
    return found


@functools.lru_cache(maxsize=256)  # (per FunctionParts: asked for every call's key)
def arg_masks(parts: Any) -> dict[int, frozenset[str]]:
    """Attributes of argument objects that forward/backward only increment (``cfg.calls +=
    1``) or mutate (``cfg.log.append``): left out of the call key, since every call changes
    them; the replayed write keeps them as eager does. Only for arguments the code does not
    pass on to other functions (which might read them)."""
    masks: dict[int, set[str]] = collections.defaultdict(set)
    values: dict[int, set[str]] = collections.defaultdict(set)
    escaped: set[int] = set()
    for _phase, fn, facts, params in analysed(methods_of(parts)):
        for chain in facts.chains:
            where = params.get(chain.root) if chain.root_kind == "fast" else None
            if not issubclass(type(where), int):
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
