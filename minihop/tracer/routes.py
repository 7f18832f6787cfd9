"""Routes to the tensors a Function reaches outside its arguments, to fetch them again per call.

Place in the pipeline: tracer, built once per trace (``session.Tracing``) from the globals and
closure cells forward and backward read (``names.free_values``). A tensor forward or backward
reaches there (directly, as a held module's parameter or buffer, or inside a held list, tuple,
dict or user object: ``TS[0]``, ``D["w"]``, ``H.w``) gets an input name and a ``spec.Place``
(the global or cell root, then the steps down to it) whose reader fetches it as it is now; the
trace lifts it as a graph input read through that place.

Invariant: fetching anew on every call is what eager does: rebinding the name or replacing the
tensor takes effect at the next call. A tensor no route reaches is not fetched here (the trace
makes its capture single-use; backward reading one the heap walk found outside the arguments
is refused: ``backward_reads.BackwardReads.lift``).
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..spec import Place, Root
from ..graph_names import free_value_root, held_name, parameter_name, tensor_name
from ..structure import attributes
from ..library_state import own_dict
from ..user_code import library_base, plain_items, plain_pairs
from .chains import code_facts
from .names import free_values
from .library import is_library, is_user_module, module_data

__all__ = ["RouteMap", "closure_routes", "merged", "module_tensors", "state_named"]


Route = tuple[str, Place]


def closure_routes(fn: Any) -> RouteMap:
    """id(tensor) -> (input name, its place), for tensors forward/backward reach
    through closure cells, globals, or the parameters and buffers of a module held there.

    Fetching anew on every call is what eager does: rebinding the name or replacing the
    parameter takes effect at the next call.
    """
    routes = RouteMap()
    seen: set[int] = set()
    # (a method that is a partial or a callable object: the functions it runs, ``_helpers_of``)
    starts = [fn] if getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None) is not None else _helpers_of(fn)
    reached = [r for start in starts for r in _reached_free_values(start, 0, seen)]
    tails = _list_tails(reached)
    for kind, name, value, fetch, _code in reached:
        root = Root("cell" if kind == "closure" else "global", name, name, lambda args, f=fetch: f())
        walk = _Walk()
        _add_routes(routes, value, free_value_root(kind, name), fetch, root, (), tails=tails.get(id(value), {}), walk=walk)
        routes.cut = routes.cut or walk.cut
    return routes


# A list the code reads only at one negative index (``HIST[-1]``): (id of the free value it is
# below, steps to the list) -> that index.
Tails = dict[int, dict[tuple[tuple[str, Any], ...], int]]


def _list_tails(reached: list[tuple[str, str, Any, Callable[[], Any], Any]]) -> Tails:
    """Where the code (chains of constant subscripts, ``chains.code_facts``) reads a container
    at one negative index only: ``HIST[-1]`` means the last item whatever the length, so its
    route is that index (a memo list the caller appends to). Read at any other index too, the
    list's items keep their positions (checked with the list's length)."""
    seen: dict[tuple[int, tuple[tuple[str, Any], ...]], set[Any]] = {}
    for kind, name, value, _fetch, code in reached:
        for inner in _nested(code):
            for chain in code_facts(inner).chains:
                if chain.root != name or chain.root_kind != ("deref" if kind == "closure" else "global"):
                    continue
                for k, (step, key) in enumerate(chain.steps):
                    if step == "item":
                        seen.setdefault((id(value), chain.steps[:k]), set()).add(key)
    tails: Tails = {}
    for (root, steps), keys in seen.items():
        (key,) = keys if len(keys) == 1 else (None,)
        if type(key) is int and key < 0:
            tails.setdefault(root, {})[steps] = key
    return tails


def _nested(code: Any) -> Iterator[types.CodeType]:
    if issubclass(type(code), types.CodeType):
        yield code
        for const in code.co_consts:
            yield from _nested(const)


# How deep the helpers a method calls are followed (as roots.analysed follows them).
_HELPER_DEPTH = 3


def _reached_free_values(fn: Any, depth: int, seen: set[int]) -> Iterator[tuple[str, str, Any, Callable[[], Any], Any]]:
    """``fn``'s free values, then those of the user's helpers it names (a function, a
    ``functools.partial``, a staticmethod, a bound method, a callable object's ``__call__``),
    so a tensor backward reads through ``helper()`` is fetched again too. A helper rebound
    between calls is a guarded read (pystate): its globals are found here through the
    helper seen when tracing."""
    code = getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None)
    if code is None or id(code) in seen:
        return
    seen.add(id(code))
    for kind, name, value, fetch in free_values(fn):
        yield kind, name, value, fetch, code
        if depth < _HELPER_DEPTH:
            for helper in _helpers_of(value):
                yield from _reached_free_values(helper, depth + 1, seen)


def state_named(fn: Any) -> str | None:
    """The first global or closure value that ``fn``, or a helper of the user's it names,
    names and that is state rather than code (a tensor, a number, a container, an object, a
    class or module of the user's, whose attributes may change); None where all it names is
    library code, the user's functions, or builtins."""
    for _kind, name, value, _fetch, _code in _reached_free_values(fn, 0, set()):
        if issubclass(type(value), (types.FunctionType, types.BuiltinFunctionType)):
            continue  # code (a function of the user's: its own names are followed)
        if issubclass(type(value), (types.ModuleType, type)):
            if is_library(value):
                continue
            return name  # the user's class or module: its attributes may change (a class is
            # callable, and its type is the library's ``type``: not a library callable below)
        if callable(value) and is_library(type(value)) and not issubclass(type(value), functools.partial):
            continue  # a library callable (torch's op objects)
        return name
    return None


def _helpers_of(value: Any) -> list[Any]:
    """The user's functions that calling ``value``, or a method of it, runs: a function, a
    partial's, a staticmethod's, a bound method's; the methods of the user's class or of an
    instance of it (``READER.read()``, ``Inner.apply`` runs ``Inner.forward``), and the
    functions such an instance holds (a wrapper's ``self.fn``)."""
    for _ in range(4):  # a partial of a partial of a staticmethod...
        if issubclass(type(value), (staticmethod, classmethod)):
            value = value.__func__
        elif issubclass(type(value), functools.partial):
            value = value.func
        elif issubclass(type(value), types.MethodType):
            value = value.__func__
        else:
            break
    if issubclass(type(value), types.FunctionType):
        return [] if is_library(value) else [value]
    cls = value if issubclass(type(value), type) else type(value)
    if is_library(cls) or issubclass(type(value), types.ModuleType):
        return []
    methods = []
    for attr in own_dict(cls).values():
        attr = attr.__func__ if issubclass(type(attr), (staticmethod, classmethod)) else attr
        if issubclass(type(attr), types.FunctionType) and not is_library(attr):
            methods.append(attr)  # (not a stand-in minihop put there while tracing)
    if not issubclass(type(value), type):  # (an object's own functions: ``self.fn(*a)`` runs them)
        methods += [f for held in (own_dict(value) or {}).values() if callable(held)
                    for f in _helpers_of(held) if f not in methods][:8]
    return methods


def _add_routes(routes: dict[int, Route], value: Any, prefix: str, fetch: Callable[[], Any],
                root: Root, steps: tuple[tuple[str, Any], ...], depth: int = 0,
                tails: dict[tuple[tuple[str, Any], ...], int] | None = None,
                walk: _Walk | None = None) -> None:
    """Routes to a closed-over tensor, to a closed-over module's parameters and buffers, and
    to tensors held in closed-over lists, tuples, deques, dicts and the user's objects
    (``TS[0]``, ``D["w"]``, ``H.cfg.layers[2].w``): replacing one there takes effect at the
    next call, as in eager. ``tails``: the lists below ``value`` that the code reads at one
    negative index only. ``walk``: the containers visited so far (cycles are cut there)."""
    walk = walk if walk is not None else _Walk()
    if issubclass(type(value), torch.Tensor):
        # The reader is the route's own fetch: it keeps a list's length check (see below).
        routes.setdefault(id(value), (tensor_name(prefix), Place(root, steps, lambda args, f=fetch: f())))
    elif issubclass(type(value), torch.nn.Module):
        for pname, tensor in (*value.named_parameters(), *value.named_buffers()):
            place = Place(root, (*steps, *(("attr", part) for part in pname.split("."))),
                          lambda args, f=fetch, p=pname: _module_tensor(f(), p))
            routes.setdefault(id(tensor), (parameter_name(prefix, pname), place))
        # ... and what its modules hold as plain attributes (``self.mask = t``, a dict of tables)
        for mname, sub in value.named_modules():
            for k, held in own_dict(sub).items():
                if not k.startswith("_") and (issubclass(type(held), torch.Tensor) or _held(held)):
                    path = (*(part for part in mname.split(".") if part), k)
                    _add_routes(routes, held, held_name(prefix, ".".join(path)),
                                lambda f=fetch, m=mname, k=k: getattr(f().get_submodule(m), k, None), root,
                                (*steps, *(("attr", part) for part in path)), depth + 1, tails, walk)
    elif id(value) not in walk.seen:
        held = _held(value)
        if not held:
            return
        if depth >= _ROUTE_DEPTH or len(walk.seen) >= _MAX_VISITS or len(routes) >= _MAX_ROUTES:
            walk.cut = True  # (what is below is not reached: ``RouteMap.cut``)
            return
        walk.seen.add(id(value))
        tail = (tails or {}).get(steps)
        # (a list's length and items read past a subclass's own ``__len__``/``__getitem__``)
        length = library_base(type(value)).__len__(value) if issubclass(type(value), (list, collections.deque)) else None
        if length is not None and tail is not None and -length <= tail:
            # ``HIST[-1]``: whatever the list's length, first (the item's other route is its position)
            step = ("item", tail)
            _add_routes(routes, library_base(type(value)).__getitem__(value, tail), held_name(prefix, tail),
                        lambda f=fetch, s=step: _step(f(), s),
                        root, (*steps, step), depth + 1, tails, walk)
        for step, child in held:
            if issubclass(type(child), (torch.Tensor, torch.nn.Module)) or _held(child):
                # A list's position means what the code read (``ws[-1]``, ``ws[i]``) only while
                # the list keeps its length: a longer list's last item is another position.
                _add_routes(routes, child, held_name(prefix, step[1]),
                            lambda f=fetch, s=step, n=length: _step(f(), s, n), root, (*steps, step), depth + 1,
                            tails, walk)


class RouteMap(dict[int, Route]):
    """``closure_routes``'s answer; ``cut``: the walk stopped somewhere (too deep, too many
    containers or tensors), so a tensor the code reaches may have no route though a global or
    cell holds it (backward refuses to read such a one: ``BackwardReads.lift``)."""

    cut = False


class _Walk:
    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.cut = False


def merged(*maps: RouteMap) -> RouteMap:
    """The routes of several maps (the first's win where both reach a tensor)."""
    out = RouteMap()
    for m in reversed(maps):
        out.update(m)
        out.cut = out.cut or getattr(m, "cut", False)
    return out


# How deep, how many containers and how many tensors the routes into containers and objects go.
_ROUTE_DEPTH = 12
_MAX_VISITS = 4096
_MAX_ROUTES = 256


def _held(value: Any) -> list[tuple[tuple[str, Any], Any]]:
    """The (step, value) pairs a container or a user's object holds."""
    # (read past a subclass's own methods: a ``__len__`` or ``items`` of the user's would run)
    if issubclass(type(value), (list, tuple, collections.deque)):
        return [(("item", i), v) for i, v in enumerate(itertools.islice(plain_items(value), _MAX_ROUTES))]
    if issubclass(type(value), dict):
        return [(("item", k), v) for k, v in itertools.islice(plain_pairs(value), _MAX_ROUTES) if _routable_key(k)]
    if _is_user_object(value):
        return [(("attr", k), v) for k, v in attributes(value).items()]
    if issubclass(type(value), type) and not is_library(value):  # ``F.W``: a tensor class attribute
        return [(("attr", k), v) for k, v in own_dict(value).items() if not k.startswith("__")]
    if is_user_module(value):  # ``usermod.last``: a user module's data
        return [(("attr", k), v) for k, v in module_data(value).items()]
    return []


# The standard library's plain attribute holders: a user's values are all they hold
# (``STATE = SimpleNamespace(obj=None)``, ``_LOCAL = threading.local()``).
_HOLDERS = (types.SimpleNamespace, threading.local)


def _routable_key(key: Any) -> bool:
    """A dict key a route can hold (it is fetched by it again): a string, a number, or a tuple
    of such and devices and dtypes (``CACHE[(n, device)]``)."""
    if issubclass(type(key), tuple):
        return all(_routable_key(k) for k in key)
    return key is None or issubclass(type(key), (str, int, float, torch.device, torch.dtype))


def _is_user_object(value: Any) -> bool:
    """An instance of the user's own class (not a function, class or module), or a plain
    attribute holder: its attributes hold the user's values."""
    return (own_dict(value) is not None and not issubclass(type(value), (type, types.FunctionType, types.MethodType,
                                                                   types.ModuleType, torch.nn.Module))
            and (not is_library(type(value)) or type(value) in _HOLDERS))


def _step(owner: Any, step: tuple[str, Any], length: int | None = None) -> Any:
    """``owner[key]`` or ``owner.name`` now; None where it is gone, or where a list no longer
    has its ``length`` (the live check sees it)."""
    kind, key = step
    base = library_base(type(owner)) if issubclass(type(owner), (list, tuple, dict, collections.deque)) else None
    if length is not None and (base not in (list, collections.deque) or base.__len__(owner) != length):
        return None
    try:  # (past a subclass's own ``__getitem__``, as the walk read it)
        return (base.__getitem__(owner, key) if base is not None else owner[key]) if kind == "item" else getattr(owner, key)
    except (LookupError, AttributeError, TypeError):
        return None


def _module_tensor(module: torch.nn.Module, name: str) -> Any:
    owner, _, leaf = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, leaf)


def module_tensors(module: torch.nn.Module) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    """A module's tensors by attribute path: its parameters and buffers, and the tensors its
    modules hold as plain attributes (``self.mask = t``: state a forward or backward reads)."""
    found = [(tuple(name.split(".")), t) for name, t in (*module.named_parameters(), *module.named_buffers())]
    for mname, sub in module.named_modules():
        found += [((*(p for p in mname.split(".") if p), k), held) for k, held in own_dict(sub).items()
                  if not k.startswith("_") and issubclass(type(held), torch.Tensor)]
    return found
