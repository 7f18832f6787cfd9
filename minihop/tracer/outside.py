"""Find the tensors forward put outside its return value, so a capture can put them there too.

Place in the pipeline: the tracer, around the forward trace. User code stores values where
the caller reads them afterwards: ``sink.append(y)`` on a list argument, ``obj.cache = y`` on an
argument object, ``store["k"] = y``, ``_CACHE.append(y)`` on a global, ``hard._soft = soft``
on a tensor it returns. Run on fake tensors, that leaves a fake tensor in the caller's
object, and never the real one. ``snapshot_outside`` records, before forward runs, every
list, dict and object reachable from the arguments and from the globals and closure cells
forward names (and the ``__dict__`` of each argument tensor); ``find_outside_tensors``
compares after forward and returns each write as an ``OutsideTensor``: a ``spec.Place``
(a root and steps; resolved again from each call's arguments) and the value.
The tracer turns each tensor value into a hidden fwd output, and the runtime
(``runtime/writes.py``) puts the real one at the location on every call.

Why hidden fwd outputs (appended after the user's, never top-level, so never returned to
autograd): the graph contract stays as it is (bwd takes an ``unused_N`` grad for each), the
tensor is exactly what eager's forward computed (under no-grad: no history; a view of an
input stays a view of that input), and a Function without such writes gets byte-for-byte the
graphs it had before.

Invariant: when this module is done (returned or raised), no container it snapshotted holds
a fake tensor of the trace; a write it cannot route again per call is a ``SideEffectError``.
The location records are plain data so that other Python-state analyses can reuse them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ..errors import SideEffectError
from ..spec import MISSING, Place, Root
from ..structure import Path, _is_object_container, attributes, iter_leaves
from .heap import class_state, del_attr, same, set_attr
from .library import is_exec_class, is_user_module, module_data
from .memo_writes import changes_since
from .names import free_values

__all__ = ["OutsideTensor", "OutsideSnapshot", "outside_roots", "snapshot_outside",
           "find_outside_tensors", "tensor_attributes"]

# A snapshot root, before it is a ``Place``'s: ("arg", i), ("global" | "closure", name) a
# value forward names, ("globals", module) the globals it rebinds, ("output", i) fwd output i.
RootKey = tuple[str, Any]

# How deep below a root the snapshot looks for containers (cycles are cut by identity).
_MAX_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class OutsideTensor:
    """One value forward put at ``location``: a fake tensor of the trace, or a Python value."""

    location: Place
    value: Any


@dataclasses.dataclass
class _Container:
    """One mutable container as it was before forward ran."""

    value: Any
    root: RootKey
    path: Path
    kind: str  # "list", "dict", "object", "class", "globals" or "tensor" (its own attributes)
    before: Any
    fetch_root: Callable[[], Any] | None
    after: Any = None  # what forward left there, when it was taken back out (``_diff``)


@dataclasses.dataclass
class OutsideSnapshot:
    """The containers reachable before forward ran, with a shallow copy of each's contents."""

    containers: list[_Container]

    def restore(self) -> None:
        """Put every container back as it was (used when forward itself failed)."""
        for c in self.containers:
            if _changed(c):
                _restore(c)

    @contextlib.contextmanager
    def replayed(self, outside_value: Callable[[Any], Any] | None = None,
                 again: bool = False, changes: list[Any] | None = None) -> Iterator[None]:
        """Forward's writes taken back out put there again while backward is traced: a
        backward that reads what forward stored (a mask cached in a global dict) finds it, as
        in eager. Each container is left as it was found, however backward ended (when
        backward is traced again later, what the runtime has put there since).

        A container below a global or a closure cell (a memo: ``ROTARY[n] = table``,
        ``STATE.obj = t``) is the caller's as much as forward's: eager's backward reads what it
        holds when backward runs, which the caller may have cleared or replaced since. There
        each value forward wrote goes through ``outside_value`` (backward's reads of it are then
        reads of that place, ``backward_reads.BackwardReads.stand_in``); and backward traced
        ``again`` for a call finds such containers as they really are now (the runtime
        repeated forward's writes there, and the caller changed what it changed)."""
        redone = [(c, _contents(c)) for c in self.containers if c.after is not None
                  and not (again and _caller_held(c))]
        put = []
        for c, _ in redone:
            after = c.after
            if outside_value is not None and _caller_held(c):
                after = _mapped(c, after, outside_value)
            _set_contents(c, after)
            put.append(after)
        try:
            yield
        finally:
            for (c, found), after in zip(redone, put, strict=True):
                if changes is not None and c.kind != "tensor":  # what backward did there (``changes``)
                    changes += changes_since(c.kind, after, _contents(c),
                                             lambda s, c=c: location(c.root, c.path, s, c.fetch_root))
                _set_contents(c, found)


def _caller_held(c: _Container) -> bool:
    """A container reached from a global or a closure cell (not an argument's, not an output's)."""
    return c.root[0] in ("global", "closure", "globals") and c.kind != "tensor"


def _mapped(c: _Container, contents: Any, value_of: Callable[[Any], Any]) -> Any:
    """``contents`` with each value forward wrote (new or rebound since before) mapped."""
    if c.kind == "list":
        n = len(c.before)
        return [*contents[:n], *(value_of(v) for v in contents[n:])]
    return {k: v if k in c.before and c.before[k] is v else value_of(v) for k, v in contents.items()}


def outside_roots(forward: Any,
                  fake_args: tuple[Any, ...]) -> tuple[tuple[RootKey, Any, Callable[[], Any] | None], ...]:
    """The roots a write can hang from: each argument, each mutable global or closure value
    forward names (modules, functions, tensors and ``nn.Module``s are left out: their state
    is not a caller's container), each of the user's classes it names (``Holder.last = y``,
    a class-level cache) and the globals it rebinds (``global _EYE; _EYE = torch.eye(n)``)."""
    roots: list[tuple[RootKey, Any, Callable[[], Any] | None]] = [
        (("arg", i), a, None) for i, a in enumerate(fake_args)]
    roots += [((kind, name), value, fetch) for kind, name, value, fetch in free_values(forward) if _is_state(value)]
    rebound = _rebound_globals(forward)
    if rebound is not None:
        g, names = rebound
        roots.append((("globals", g.get("__name__", "?")), _Globals(g, names), lambda g=g: g))
    return tuple(roots)


class _Globals:
    """The globals forward rebinds, as one container (only those names are its contents)."""

    def __init__(self, g: dict[str, Any], names: tuple[str, ...]) -> None:
        self.g = g
        self.names = names


def _rebound_globals(forward: Any) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    fn = getattr(forward, "__func__", forward)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    names = tuple(dict.fromkeys(i.argval for i in dis.get_instructions(code) if i.opname == "STORE_GLOBAL"))
    return (fn.__globals__, names) if names else None


def _is_user_class(value: Any) -> bool:
    return isinstance(value, type) and not issubclass(value, torch.nn.Module) and \
        ((value.__module__ or "").split(".")[0] not in _LIBRARY_ROOTS or is_exec_class(value))


_LIBRARY_ROOTS = frozenset({"builtins", "torch", "numpy", "typing", "collections", "enum", "abc"})


def _is_state(value: Any) -> bool:
    if _is_user_class(value) or is_user_module(value):
        return True
    if isinstance(value, (types.ModuleType, type, torch.Tensor, torch.nn.Module)):
        return False
    return isinstance(value, (list, dict)) or _is_object_container(value)


def snapshot_outside(roots: tuple[tuple[RootKey, Any, Callable[[], Any] | None], ...]) -> OutsideSnapshot:
    """Record every list, dict, object (and argument tensor's attributes) below ``roots``."""
    found: list[_Container] = []
    seen: set[int] = set()
    for root, value, fetch in roots:
        _walk(value, root, (), fetch, found, seen, 0)
    return OutsideSnapshot(found)


def _walk(value: Any, root: RootKey, path: Path, fetch: Callable[[], Any] | None,
          found: list[_Container], seen: set[int], depth: int) -> None:
    if depth > _MAX_DEPTH or id(value) in seen:
        return
    if isinstance(value, torch.Tensor):
        seen.add(id(value))
        found.append(_Container(value, root, path, "tensor", tensor_attributes(value), fetch))
        return
    if isinstance(value, tuple):
        for i, item in enumerate(value):
            _walk(item, root, path + (("item", i),), fetch, found, seen, depth + 1)
        return
    if isinstance(value, list):
        kind, step, items = "list", "item", list(enumerate(value))
    elif isinstance(value, dict):
        kind, step, items = "dict", "key", list(value.items())
    elif isinstance(value, _Globals):
        kind, step, items = "globals", "key", []  # their values are roots of their own
    elif _is_user_class(value):
        kind, step, items = "class", "attr", list(class_state(value).items())
    elif is_user_module(value):  # its data (``usermod.last = y``), not its code
        kind, step, items = "object", "attr", list(module_data(value).items())
    elif _is_object_container(value) or isinstance(value, torch.nn.Module):
        # A module argument too: ``mod.last = y`` is a plain attribute, as on any object.
        kind, step, items = "object", "attr", list(attributes(value).items())
    else:
        return
    seen.add(id(value))
    c = _Container(value, root, path, kind, None, fetch)
    c.before = _contents(c)
    found.append(c)
    for key, item in items:
        if step == "key" and not isinstance(key, (str, int)):
            continue  # no route to it by a generated getter
        _walk(item, root, path + ((step, key),), fetch, found, seen, depth + 1)


def _contents(c: _Container) -> Any:
    if c.kind == "globals":
        return {n: c.value.g[n] for n in c.value.names if n in c.value.g}
    if c.kind == "class":
        return class_state(c.value)
    if c.kind == "list":
        return list(c.value)
    if c.kind == "dict":
        return dict(c.value)
    if c.kind == "tensor":
        return tensor_attributes(c.value)
    return module_data(c.value) if is_user_module(c.value) else attributes(c.value)


def _changed(c: _Container) -> bool:
    return not same("list" if c.kind == "list" else "dict", c.before, _contents(c))


def _restore(c: _Container) -> None:
    _set_contents(c, c.before)


def _set_contents(c: _Container, contents: Any) -> None:
    if c.kind == "list":
        c.value[:] = contents
    elif c.kind == "globals":
        for name in c.value.names:
            if name in contents:
                c.value.g[name] = contents[name]
            else:
                c.value.g.pop(name, None)
    elif c.kind == "dict":
        c.value.clear()
        c.value.update(contents)
    else:  # a class, an object, a tensor's attributes: past any user __setattr__, as the heap does
        now = _contents(c)
        for name in now:
            if name not in contents:
                del_attr(c.value, name)
        for name, v in contents.items():
            set_attr(c.value, name, v)


@functools.lru_cache(maxsize=1)
def _torch_tensor_attributes() -> frozenset[str]:
    """The ``__dict__`` entries torch itself gives a (fake) tensor."""
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.empty(0))
    return frozenset(vars(fake)) | frozenset(vars(torch.empty(0)))


def tensor_attributes(t: torch.Tensor) -> dict[str, Any]:
    """The attributes user code set on tensor ``t`` (torch's own entries left out)."""
    internal = _torch_tensor_attributes()
    return {k: v for k, v in vars(t).items() if k not in internal and not k.startswith("__")}


def find_outside_tensors(snapshot: OutsideSnapshot, outputs: tuple[torch.Tensor, ...],
                         is_traced: Callable[[Any], bool], function: str,
                         code: types.CodeType | None, argnames: tuple[str, ...] = ()) -> tuple[OutsideTensor, ...]:
    """What forward wrote outside its return value, in write order per container.

    ``outputs`` are forward's flat output tensors (attributes set on them count too, with an
    ``("output", i)`` root); ``is_traced(v)`` says whether ``v`` is a fake tensor of this
    trace. Every container holding a traced tensor is put back as it was before forward
    (the runtime repeats the writes on each call). For a container whose only changes are
    Python values the changes are left alone and not reported (other state analyses own
    those), except on tensors, whose user attributes are always reported.
    Raises ``SideEffectError`` for a write that cannot be routed again per call.
    """
    found: list[OutsideTensor] = []
    who = _Who(function, code, argnames)
    try:
        for c in snapshot.containers:
            if _changed(c):
                found.extend(_diff(c, is_traced, who))
        container_ids = {id(c.value) for c in snapshot.containers}
        for i, out in enumerate(outputs):
            if id(out) in container_ids:
                continue  # an argument returned as is: its attributes are the argument's
            for name, value in tensor_attributes(out).items():
                _check_value(value, ("output", i), (), ("attr", name), is_traced, who)
                found.append(OutsideTensor(location(("output", i), (), ("attr", name)), value))
    except BaseException:
        snapshot.restore()
        raise
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class _Who:
    """What a refusal names: the Function, its forward's code, its argument names."""

    function: str
    code: types.CodeType | None
    argnames: tuple[str, ...]


def location(root: RootKey, path: Path, step: Any, fetch: Callable[[], Any] | None = None) -> Place:
    """The place of a write: ``step`` into the container at ``path`` below ``root``."""
    kind, key = root
    if kind == "globals":  # a rebound global: the name itself, stored in its globals dict
        g, name = fetch(), step[1]
        return Place(Root("global", name, f"global {name}", lambda args, g=g, n=name: g.get(n, MISSING), home=g))
    if kind in ("arg", "output"):
        return Place(Root(kind, key), (*path, step))
    return Place(Root("cell" if kind == "closure" else "global", key, str(key), lambda args, f=fetch: f()),
                 (*path, step))


def _diff(c: _Container, is_traced: Callable[[Any], bool], who: _Who) -> list[OutsideTensor]:
    now = _contents(c)
    changes: list[tuple[Any, Any]] = []  # (step, value)
    removed: Any = None  # the step of a change that is not an addition, if any
    if c.kind == "list":
        n = len(c.before)
        if len(now) >= n and all(a is b for a, b in zip(now, c.before)):
            changes = [(("append", None), v) for v in now[n:]]
        else:
            removed = ("append", None)
    else:
        step = "key" if c.kind in ("dict", "globals") else "attr"
        gone = [k for k in c.before if k not in now]
        removed = (step, gone[0]) if gone else None
        changes = [((step, k), v) for k, v in now.items() if k not in c.before or v is not c.before[k]]
    holds_fake = any(_holds_traced(v, is_traced) for _, v in changes) or (
        removed and any(_holds_traced(v, is_traced) for v in (now if c.kind == "list" else now.values())))
    if not holds_fake and c.kind != "tensor":
        return []  # only Python values changed: not this module's job
    c.after = now
    _restore(c)
    location_of = lambda s: location(c.root, c.path, s, c.fetch_root)  # noqa: E731
    if removed is not None:
        raise _refusal(who, location_of(removed), "changes that container in a way "
                       "other than by adding to it or setting entries (an item replaced in, "
                       "removed from or inserted into a list; an entry deleted) while putting "
                       "a tensor there")
    for s, v in changes:
        _check_value(v, c.root, c.path, s, is_traced, who, c.fetch_root)
    return [OutsideTensor(location_of(s), v) for s, v in changes]


def _holds_traced(value: Any, is_traced: Callable[[Any], bool]) -> bool:
    if is_traced(value) or isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) \
            and not free_unbacked_symbols(value):  # a number read from data: pystate's to turn into a value
        return True  # a symbolic size is refused by _check_value (its attributes are torch's)
    if isinstance(value, torch.Tensor):
        return False
    return any(is_traced(leaf) or isinstance(leaf, FakeTensor) for _, leaf in iter_leaves(value))


def _check_value(value: Any, root: RootKey, path: Path, step: Any, is_traced: Callable[[Any], bool],
                 who: _Who, fetch: Callable[[], Any] | None = None) -> None:
    """Refuse a value that cannot be put back on each call: a tensor inside a value forward
    made (an object, a container), a fake tensor of another trace, or a symbolic size."""
    if is_traced(value):
        return
    loc = location(root, path, step, fetch)
    if isinstance(value, FakeTensor):
        raise _refusal(who, loc, "puts a fake tensor there that this trace did not make")
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _refusal(who, loc, "puts a symbolic size there (captured with dynamic "
                       "shapes, it has no one value)")
    if not isinstance(value, torch.Tensor) and _holds_traced(value, is_traced):
        raise _refusal(who, loc, f"puts a {type(value).__name__} there that holds a "
                       "tensor, and forward made that value itself")


def _refusal(who: _Who, loc: Place, what: str) -> SideEffectError:
    code = who.code
    line = _source_line(code, loc.step)
    where = f'File "{code.co_filename}", line {line}' if code is not None and line is not None else None
    return SideEffectError(
        f"{who.function}.forward writes to {loc.describe(who.argnames)}"
        f"{f' (line {line})' if line is not None else ''}: it {what}.",
        "A capture puts forward's tensors back where forward put them on every call, which "
        "works only for a tensor stored directly into a list, dict or object that existed "
        "before the call (an argument, a global, a closure value) or onto a returned tensor; "
        "leaving this one would leave a fake tensor from tracing behind.",
        "Store the tensor itself there (e.g. obj.cache = y, not obj.cache = Holder(y)), "
        "return it from forward, or run this Function eagerly with "
        "minihop.function(F, fallback='eager').",
        where=where)


def _source_line(code: types.CodeType | None, step: Any) -> int | None:
    """The first line of forward that makes a write like ``step`` (best effort)."""
    if code is None:
        return None
    kind, key = step
    for ins in dis.get_instructions(code):
        hit = ((kind == "attr" and ins.opname == "STORE_ATTR" and ins.argval == key)
               or (kind == "key" and ins.opname == "STORE_SUBSCR")
               or (kind == "append" and ins.opname in ("LOAD_ATTR", "LOAD_METHOD")
                   and ins.argval == "append"))
        if hit and ins.positions is not None:
            return ins.positions.lineno
    return None
