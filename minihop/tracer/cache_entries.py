"""What an ``lru_cache`` helper's cache holds for a call, beside what the trace computed.

Place in the pipeline: tracer, asked by ``hidden.ReadWatch`` each time the user's code calls an
``lru_cache``/``functools.cache`` helper while traced. The trace never lets the cache keep a
fake tensor, and eager's code gets the very object the cache holds, which may differ from
what the helper makes now (written in place since, drawn at random once).

A result that holds tensors, for plain arguments, is therefore not computed in the graphs: the
trace takes the cache's own entry (``fetched_entry``: looked up without calling the helper, so
no hit is counted; where there is none, stand-ins of what the helper makes) and each tensor in
it becomes an input read through the place "that call's result" (``entry_routes``), on every
call and when backward runs. A read that finds no entry makes it (its miss counted, as eager's
call counts it) and the call's own replay (``hidden.ReadWatch.call_writes``) is then skipped.
For a dynamic size or a caller's tensor among the arguments (keyed by identity) no entry can
be read on later calls: the graphs compute it, for one call, checked against the cache's entry
for this call (``computed_for_this_call``).

Wherever a helper is held, the trace must swap it for ``hidden.ReadWatch``'s uncached stand-in,
or its cache keeps the trace's fake tensors: ``lru_sites`` (per chain the code names: a dict's
or a list's item, a decorator's cell, a partial's keyword) and ``lru_sites_of`` (the analysed
functions' module globals and keyword defaults) find where; one held where it cannot be
swapped (an argument, a positional default, a tuple) is refused.

A mutable object without tensors the cache hands out (a config dict, a list, an object:
``get_config()["lr"] = 0.1`` from anywhere) may have been changed since it was made, and may be
again between calls: the cache's own entry is fetched (the call eager makes) and compared with
the trace's (``cached_entry``): a difference is refused, and the capture is single-use.

Invariant: the trace's answer is the cache's, or the capture is refused; never the fresh one
where they differ.
"""

from __future__ import annotations

import functools
import gc
import types
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import SideEffectError
from ..graph_names import held_name, ident
from ..place import MISSING, Place, Root, walk_plain
from ..structure import iter_leaves, replace_tensors
from .atoms import CONSTANTS, holds_tensor
from .effects import held
from .identity import SWAPPED_IN
from .routes import state_named

__all__ = ["NOT_FETCHED", "called", "caching", "lru_sites", "lru_sites_of", "cached_entry", "entry_routes", "fetched_entry", "made_entry", "computed_for_this_call",
           "stale_cache_check", "traced_call"]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)

NOT_FETCHED = object()


# torch's own values a key may hold (``table(4, dtype=x.dtype)``): hashed and compared by value
_TORCH_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format)


def _plain(value: Any) -> bool:
    if issubclass(type(value), (tuple, frozenset)):
        return all(_plain(v) for v in value)
    return type(value) in CONSTANTS or type(value) in _TORCH_VALUES or value is None


def plain_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Arguments the cache's entry can be fetched for again on every call: plain values."""
    return all(_plain(a) for a in (*args, *kwargs.values()))


def fetched_entry(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What the code gets from the cache, for plain arguments, where it holds tensors: the
    cache's entry, looked up without calling (no hit counted: the capture's reads of the place
    and the call's own replay are the calls eager makes); MISSING where the cache holds none yet
    (the helper is traced: ``made_entry``); ``NOT_FETCHED`` where the entry holds no tensor (its
    value is traced) or the arguments are not plain."""
    if not plain_call(args, kwargs):
        return NOT_FETCHED
    entry = _peek(fn, args, kwargs)
    return entry if entry is MISSING or holds_tensor(entry) else NOT_FETCHED


def made_entry(fn: Any, result: Any, drawn: _Draws, what: str, where: str) -> Any:
    """For an entry the cache does not hold yet, where the traced helper returned tensors:
    stand-ins of them, read from the cache on every call like an entry it holds (the capture's
    first read makes it); ``NOT_FETCHED`` for a result without tensors (traced as it is). The
    helper's own ops stay in the graph, unused (what the user's call ran)."""
    if not holds_tensor(result):
        return NOT_FETCHED
    stale_cache_check(fn, what, where)  # (made again by the capture's read: of its arguments alone)
    _refuse_draws(drawn, what, where, "for an entry its cache does not hold yet")
    return replace_tensors(result, lambda path, t: _stand_in(t))


def _refuse_draws(drawn: _Draws, what: str, where: str, when: str) -> None:
    if drawn.ops:
        raise SideEffectError(
            f"{what} (an lru_cache helper) draws random numbers ({drawn.ops[0]}) {when}.",
            "Eager draws them once, where the Function calls it, and its cache keeps them; "
            "minihop would draw them where it reads the cache (before the graphs run) or in "
            "its graphs on every call.",
            "Call the helper once before (it is then read from the cache), or run it eagerly "
            "with minihop.function(F, fallback='eager').", where=where)


def traced_call(unwrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, _Draws]:
    """The helper run on the trace's values (recorded), with the random ops it ran."""
    drawn = _Draws()
    with drawn:
        return unwrapped(*args, **kwargs), drawn


def computed_for_this_call(fn: Any, unwrapped: Callable[..., Any], result: Any, drawn: _Draws, args: tuple[Any, ...],
                           kwargs: dict[str, Any], what: str, where: str) -> bool:
    """Whether the graphs compute a result holding tensors whose cache entry cannot be read
    on later calls (a dynamic size, a tensor argument): right for this call only, checked."""
    return _sized_entry(fn, unwrapped, result, drawn, args, kwargs, what, where) or \
        _tensor_keyed(fn, unwrapped, result, args, kwargs, what, where)


def _sized_entry(fn: Any, unwrapped: Callable[..., Any], result: Any, drawn: _Draws, args: tuple[Any, ...],
                kwargs: dict[str, Any], what: str, where: str) -> bool:
    """Whether a result holding tensors was computed for a dynamic size (``table(x.shape[0])``
    under dynamic shapes): no entry can be read for a size the capture has not seen, so the
    graphs compute it, which holds for this call only (single-use) and only where the cache's
    entry for this call's sizes is what the helper makes (checked: refused otherwise)."""
    values = (*args, *kwargs.values())
    if not holds_tensor(result) or not any(issubclass(type(v), _SYMBOLIC) for v in values):
        return False
    _refuse_draws(drawn, what, where, "for a dynamic size")
    hints = [v.node.hint if issubclass(type(v), _SYMBOLIC) else v for v in values]
    plain_args, plain_kwargs = tuple(hints[:len(args)]), dict(zip(kwargs, hints[len(args):]))
    entry = _peek(fn, plain_args, plain_kwargs) if all(h is not None for h in hints) else NOT_FETCHED
    if entry is MISSING:
        return True  # (eager makes it now, as the graphs do)
    with unset_fake_temporarily(), torch._C.DisableTorchFunction():
        fresh = unwrapped(*plain_args, **plain_kwargs) if entry is not NOT_FETCHED else None
        if fresh is None or not _same(entry, fresh):
            raise SideEffectError(
                f"The tensor {what} (an lru_cache helper) returned for a dynamic size is not what "
                "it makes now (written in place since its cache made it).",
                "Eager gets the tensor its cache holds; minihop computes it in its graphs for a "
                "dynamic size, which cannot read the cache's entry for each size.",
                "Capture without dynamic sizes (minihop.function(F) keys each size), or run it "
                "eagerly with minihop.function(F, fallback='eager').", where=where)
    return True


def _tensor_keyed(fn: Any, unwrapped: Callable[..., Any], result: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 what: str, where: str) -> bool:
    """Whether a result holding tensors was computed for a caller's tensor among the arguments
    (``table(W)``: the cache keys it by identity, and keeps what it made from it as it was then,
    while the graphs compute it from the tensor as it is). Its entry for this call is checked
    against what the helper makes now (refused where they differ: written in place since), and
    the capture serves this call only (single-use)."""
    values = (*args, *kwargs.values())
    if not holds_tensor(result) or not any(issubclass(type(v), torch.Tensor) and not issubclass(type(v), FakeTensor)
                                           for v in values):
        return False
    entry = _peek(fn, args, kwargs)
    if entry is not MISSING:
        with unset_fake_temporarily(), torch._C.DisableTorchFunction():
            fresh = unwrapped(*args, **kwargs)
        if not _same(entry, fresh):
            raise SideEffectError(
                f"The tensor {what} (an lru_cache helper) returned for a tensor argument is not what "
                "it makes from that tensor now (the tensor or the entry was written in place since).",
                "Eager gets the tensor its cache holds, keyed by the argument's identity; minihop's "
                "graphs compute it from the argument as it is now.",
                "Key the helper by plain values (sizes, dtypes), or run it eagerly with "
                "minihop.function(F, fallback='eager').", where=where)
    return True


def _same(a: Any, b: Any) -> bool:
    leaves = [list(iter_leaves(v)) for v in (a, b)]
    return len(leaves[0]) == len(leaves[1]) and all(
        pa == pb and (torch.equal(la, lb) and la.dtype == lb.dtype if issubclass(type(la), torch.Tensor)
                      and issubclass(type(lb), torch.Tensor) else la is lb or la == lb)
        for (pa, la), (pb, lb) in zip(*leaves))


class _Draws(TorchDispatchMode):
    """The random ops a helper runs (under the trace's fake mode: nothing is drawn)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def _stand_in(fake: torch.Tensor) -> torch.Tensor:
    """A real tensor of ``fake``'s properties: a route's key, for the entry the capture makes
    (zeros: never a value the trace reads, which the entry's own reads guard)."""
    with unset_fake_temporarily(), torch._C.DisableTorchFunction():
        return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device).zero_()


def _peek(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The entry ``fn``'s cache holds for the call, MISSING where none, without calling ``fn``
    (CPython's C cache: its key as ``functools`` makes it, its dict and its links); where the
    cache is not laid out so, the call itself (eager's, made now)."""
    if issubclass(type(fn), types.MethodType):  # (an lru_cache'd method: its object is the key's first item)
        fn, args = fn.__func__, (fn.__self__, *args)
    if type(fn) is not _LRU_WRAPPER:  # (another library's cache: the call itself, eager's)
        with unset_fake_temporarily(), torch._C.DisableTorchFunction():
            return fn(*args, **kwargs)
    refs = gc.get_referents(fn)
    caches = [r for r in refs if type(r) is dict and r is not getattr(fn, "__dict__", None)]
    marks = [r for r in refs if type(r) is object]
    typed = fn.cache_parameters().get("typed", False) if hasattr(fn, "cache_parameters") else None
    if len(caches) != 1 or len(marks) != 1 or typed is None:
        with unset_fake_temporarily(), torch._C.DisableTorchFunction():
            return fn(*args, **kwargs)
    key: Any = args + ((marks[0], *(x for kv in kwargs.items() for x in kv)) if kwargs else ())
    if typed:
        key += tuple(type(v) for v in (*args, *kwargs.values()))
    elif not kwargs and len(args) == 1 and type(args[0]) in (int, str):
        key = args[0]
    found = caches[0].get(key, MISSING)
    if found is MISSING or fn.cache_parameters().get("maxsize") is None:
        return found
    # A bounded cache's links are seen through the cache itself: (their type, key, result) each
    for i in range(1, len(refs) - 1):
        if issubclass(type(refs[i - 1]), type) and type(refs[i]) is type(key) and refs[i] == key:
            return refs[i + 1]
    with unset_fake_temporarily(), torch._C.DisableTorchFunction():
        return fn(*args, **kwargs)


def entry_routes(root: Root, entry: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 what: str) -> tuple[list[tuple[torch.Tensor, str, Place]], list[Place]]:
    """Each tensor in the cache's ``entry`` with an input name and its place: ``root`` (the
    helper, as the code named it) called again with the same arguments, then the steps down
    to the tensor (an item, a key, an object's attribute); and the place of each other value
    it holds (``table(4)["n"]``: the caller may change it between calls, a read of it is guarded)."""
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    call = Root("value", ("cached", root.kind, root.key, args, tuple(kwargs.items())), f"{what}({shown})",
                lambda a: _call(root.get(a), args, kwargs))
    found, values = [], []
    for steps, leaf in iter_leaves(entry):
        if issubclass(type(leaf), torch.Tensor):
            name = held_name(f"cached_{ident(what)}", "_".join(str(k) for k in (*args, *kwargs.values(), *(k for _, k in steps))))
            found.append((leaf, name, Place(call, steps)))
        elif steps:
            values.append(Place(call, steps))
    return found, values


def _call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The entry, looked up (no hit counted: the call's own, made again after fwd, counts it),
    or made where there is none (its miss counted, as eager's call counts it)."""
    with unset_fake_temporarily(), torch._C.DisableTorchFunction():  # (never a fake in the cache)
        entry = _peek(fn, args, kwargs)
        if entry is MISSING:
            _MADE.add(_made_key(fn, args, kwargs))  # (its call's own is made: not again)
            return fn(*args, **kwargs)
        return entry


# The calls whose entry a read of the place made (counted as their miss): the call itself,
# made again after fwd or when backward runs, is then not made again (``_replayed``).
_MADE: set[tuple[Any, ...]] = set()


def _made_key(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    # (a method is read anew each time, a new bound object: keyed by its function and object)
    owner = (id(fn.__func__), id(fn.__self__)) if issubclass(type(fn), types.MethodType) else (id(fn),)
    return (*owner, args, tuple(kwargs.items()))


def _replayed(fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        key = _made_key(fn, args, kwargs)
        if key in _MADE:
            _MADE.discard(key)
            return None
        return fn(*args, **kwargs)
    return call


_LRU_WRAPPER = type(functools.lru_cache(maxsize=None)(lambda: None))


def caching(value: Any) -> bool:
    """A helper that caches what it returns: ``functools.lru_cache``'s (a method of one too), or
    another library's of the same protocol (``cache_clear`` and ``__wrapped__``:
    ``cachetools.cached``), whose entries are fetched by calling it."""
    if type(value) is _LRU_WRAPPER or issubclass(type(value), types.MethodType) and type(value.__func__) is _LRU_WRAPPER:
        return hasattr(value, "__wrapped__")
    # (a decorator's function, ``functools.wraps``'d, with its cache's ``cache_clear``: asked of
    # its own dict, never through a proxy's code, which ``library_state.unseen`` refuses)
    own = value.__dict__ if type(value) is types.FunctionType else {}
    return "__wrapped__" in own and "cache_clear" in own


_lru = caching


def lru_sites(name: str, root: Root, value: Any, steps: tuple[tuple[str, Any], ...], end: Any,
              where: str) -> list[tuple[tuple[Any, ...], tuple[Any, str, Any, str, str]]]:
    """Where an lru_cache helper the code reaches is held, beyond a global, a cell or an
    attribute (``hidden.watched``'s sites): an item of a dict (``TABLES["pos"](n)``), or a cell
    of a decorator's wrapper the code calls (``@logged @lru_cache def table``: the analysis
    reads the wrapped body, so the helper inside is never named). Each is swapped for the
    uncached stand-in while traced, or its cache would keep the trace's fake tensors. One
    held where it cannot be swapped (an argument, a ``functools.partial``'s function) is
    refused."""
    if _lru(end) and root.uses_args:
        raise _unswappable(name, "passed in as an argument (or inside one)", where)
    if issubclass(type(end), functools.partial):
        if _lru(end.func) or any(_lru(a) for a in end.args):
            raise _unswappable(name, "inside a functools.partial", where)
        return list(_held_in(end.keywords).items())  # (``partial(helper, table=T)``)
    if _lru(end) and steps and steps[-1][0] == "item":
        owner = walk_plain(value, steps[:-1])
        if type(owner) in (dict, list):
            key = steps[-1][1] if type(owner) is dict else steps[-1][1] % len(owner)  # (``FNS[-1]``)
            return [((id(end), id(owner)), (owner, key, end, "uncached", getattr(end, "__qualname__", str(key))))]
        raise _unswappable(name, f"held in a {type(owner).__name__}", where)
    found = []
    fn, seen = end, 0
    while issubclass(type(fn), types.FunctionType) and seen < 8:  # (a decorator's wrappers, outermost first)
        for cell in fn.__closure__ or ():
            held = cell.cell_contents if _filled(cell) else None
            if _lru(held):
                found.append(((id(held), id(cell)), (cell, "cell_contents", held, "uncached",
                                                     getattr(held, "__qualname__", "an lru_cache function"))))
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return found


def lru_sites_of(name: str, fns: list[Any]) -> dict[tuple[Any, ...], tuple[Any, str, Any, str, str]]:
    """The lru_cache helpers the analysed functions may reach without naming them in a chain:
    every one among their module's globals (``globals()["T"]``, ``getattr(mod, name)``), their
    keyword defaults and a ``functools.partial``'s keywords, swapped where they are while
    traced. One among positional defaults or a partial's arguments (a tuple) is refused."""
    found: dict[tuple[Any, ...], tuple[Any, str, Any, str, str]] = {}
    spaces: dict[int, dict[str, Any]] = {}
    for fn in fns:
        fn = fn.__func__ if issubclass(type(fn), (types.MethodType, staticmethod, classmethod)) else fn
        if issubclass(type(fn), functools.partial):
            found.update(_held_in(fn.keywords))
            if any(_lru(a) for a in fn.args):
                raise _unswappable(name, "among a functools.partial's arguments", None)
            fn = fn.func
        if not issubclass(type(fn), types.FunctionType):
            continue
        spaces.setdefault(id(fn.__globals__), fn.__globals__)
        found.update(_held_in(fn.__kwdefaults__))
        if any(_lru(d) for d in fn.__defaults__ or ()):
            raise _unswappable(name, f"as a default argument of {fn.__qualname__}", None)
    for space in spaces.values():  # (keyed as a global's site is: ``pystate._find_hidden_read``)
        found.update({(id(site[2]), site[1]): site for site in _held_in(space).values()})
    return found


def _held_in(space: dict[str, Any] | None) -> dict[tuple[Any, ...], tuple[Any, str, Any, str, str]]:
    if type(space) is not dict:
        return {}
    return {(id(v), id(space), k): (space, k, v, "uncached", getattr(v, "__qualname__", k))
            for k, v in space.items() if _lru(v)}


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _unswappable(name: str, held: str, where: str | None) -> SideEffectError:
    return SideEffectError(
        f"{name} calls an lru_cache helper {held}.",
        "Tracing calls it on fake tensors; minihop keeps its cache from keeping them by "
        "swapping the helper where it is held (a global, a closure cell, an attribute, a dict "
        "item) while it traces, and cannot swap it there.",
        "Call the helper through a global or an attribute, or run it eagerly with "
        "minihop.function(F, fallback='eager').", where=where)


def called(home: Any, name: str, what: str, replay: bool = False) -> Root:
    """The lru_cache helper as the code named it, read as it is when the capture runs: a
    global, a closure cell, or an attribute of the user's object or class (``what``). To
    ``replay`` its call: one that skips a call whose entry a read of its place just made."""
    real = (lambda fn: _replayed(_real(fn))) if replay else _real
    if type(home) is dict and "__builtins__" in home:  # (a module's globals)
        return Root("global", name, f"global {name}", lambda a: real(home.get(name, MISSING)), home=home)
    if type(home) in (dict, list):  # (an item: ``TABLES["pos"]``, ``FNS[0]``)
        return Root("value", what, what, lambda a: real(walk_plain(home, (("item", name),))))
    if name == "cell_contents":
        return Root("cell", what, f"closure variable {what}", lambda a: real(home.cell_contents), home=home)
    return Root("value", what, what, lambda a: real(getattr(home, name, MISSING)))


def _real(fn: Any) -> Any:
    return SWAPPED_IN.get(id(fn), fn)  # (read while traced: the helper, not the watch's stand-in)


def cached_entry(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fresh: Any, what: str,
                 where: str) -> Any:
    """The object ``fn``'s cache holds for ``args`` (the call eager makes, made now), where the
    trace's ``fresh`` result is a mutable object without tensors; ``NOT_FETCHED`` otherwise
    (a tensor, a constant, arguments of the trace's). Refused where the two differ."""
    if _plain(fresh) or holds_tensor(fresh) or not all(_plain(a) for a in (*args, *kwargs.values())):
        return NOT_FETCHED
    with unset_fake_temporarily(), torch._C.DisableTorchFunction():
        entry = fn(*args, **kwargs)
    if held(entry) != held(fresh):
        raise SideEffectError(
            f"The object {what} (an lru_cache helper) returned was changed since its cache made it.",
            "Eager gets that very object from the cache, as changed; a capture computes the "
            "helper's result afresh in its graphs, so it would read the object as first made.",
            "Pass what the Function reads of it as an argument, or run it eagerly with "
            "minihop.function(F, fallback='eager').", where=where)
    return entry


def stale_cache_check(fn: Any, what: str, where: str, result: str = "tensor") -> None:
    """An lru_cache helper returned a ``result`` (a tensor, or a value: a number, a tuple...): the capture
    computes it (the graphs, or a constant in them), where eager gets what its cache holds,
    computed when that entry was made. Equal only if it is a function of its arguments alone;
    one that reads state outside them (a global tensor, a number, an object, a class) is
    refused, since its cache may hold a value computed from that state as it was."""
    read = state_named(fn.__wrapped__)
    if read is not None:
        raise SideEffectError(
            f"{what} (an lru_cache helper) returned a {result} computed from {read}, which is "
            "not one of its arguments.",
            f"Eager gets the {result} its cache holds, computed from "
            f"{read} as it was when that entry was made; a capture computes it again from "
            f"{read} as it is now, and the two differ once {read} changes (its cache is not "
            "keyed by it).",
            f"Pass {read} to the cached function as an argument, compute the {result} outside "
            "the Function and pass it in, or run it eagerly with minihop.function(F, "
            "fallback='eager').",
            where=where)
