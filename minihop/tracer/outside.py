"""Find the tensors forward put outside its return value, so a capture can put them there too.

Place in the pipeline: the tracer, between forward's trace and the heap watch's rule table.
User code stores values where the caller reads them afterwards: ``sink.append(y)`` on a list
argument, ``obj.cache = y`` on an argument object, ``store["k"] = y``, ``_CACHE.append(y)`` on a
global, ``hard._soft = soft`` on a tensor it returns. Run on fake tensors, that leaves a fake
tensor in the caller's object, and never the real one.

This module keeps no snapshot of its own: the heap watch (``heap``, driven by ``pystate``)
snapshots every object the trace can reach before forward and after it, and diffs the two
once. ``claim`` takes, of those differences, the ones of each container forward stored a
tensor of the trace in (and every change to a tensor's own attributes): each becomes an
``OutsideTensor`` (a ``spec.Place``, resolved again from each call's arguments, and the value),
the container is put back as it was, and the rest of the differences go on to the heap's rule
table. The tracer turns each tensor value into a hidden fwd output, and the runtime
(``runtime/writes.py``) puts the real one at the place on every call.

Why hidden fwd outputs (appended after the user's, never top-level, so never returned to
autograd): the graph contract stays as it is (bwd takes an ``unused_N`` grad for each), the
tensor is exactly what eager's forward computed (under no-grad: no history; a view of an
input stays a view of that input), and a Function without such writes gets byte-for-byte the
graphs it had before.

Invariant: when ``claim`` is done (returned or raised), no container it took holds a fake
tensor of the trace; a write it cannot route again per call is a ``SideEffectError``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import SideEffectError
from ..library_state import tensor_attributes
from ..spec import MISSING, Place, Root
from ..structure import iter_leaves
from . import heap
from .heap import Difference, Seen
from .memo_writes import changes_since
from .roots import global_place, place_at

__all__ = ["OutsideTensor", "OutsideWrites", "claim"]

# The containers a write can be repeated into on each call (``runtime/writes.py``): by
# ``append``, by item and by attribute.
_CLAIMABLE = frozenset({"list", "dict", "globals", "attrs", "tensor"})


@dataclasses.dataclass(frozen=True)
class OutsideTensor:
    """One value forward put at ``location``: a fake tensor of the trace, or a Python value."""

    location: Place
    value: Any


@dataclasses.dataclass
class _Claimed:
    """A container forward stored a tensor in: as the heap watch saw it before forward (``seen``),
    and what forward left there (``after``), taken back out."""

    seen: Seen
    after: Any


@dataclasses.dataclass
class OutsideWrites:
    """What ``claim`` found and took back out of the caller's containers."""

    tensors: tuple[OutsideTensor, ...]
    claimed: list[_Claimed]

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
        redone = [(c, heap.current(c.seen)) for c in self.claimed
                  if not (again and _caller_held(c.seen))]
        put = []
        for c, _ in redone:
            after = c.after
            if outside_value is not None and _caller_held(c.seen):
                after = _mapped(c, after, outside_value)
            heap.put(c.seen, after)
            put.append(after)
        try:
            yield
        finally:
            for (c, found), after in zip(redone, put, strict=True):
                if changes is not None and c.seen.kind != "tensor":  # what backward did there (``changes``)
                    changes += changes_since(c.seen.kind, after, heap.current(c.seen),
                                             lambda s, c=c: location(c.seen, s))
                heap.put(c.seen, found)


def _caller_held(seen: Seen) -> bool:
    """A container reached from a global or a closure cell (not an argument's)."""
    return not seen.root.uses_args and seen.kind != "tensor"


def _mapped(c: _Claimed, contents: Any, value_of: Callable[[Any], Any]) -> Any:
    """``contents`` with each value forward wrote (new or rebound since before) mapped."""
    before = c.seen.contents
    if c.seen.kind == "list":
        return [*contents[:len(before)], *(value_of(v) for v in contents[len(before):])]
    return {k: v if before.get(k, MISSING) is v else value_of(v) for k, v in contents.items()}


def claim(differences: list[Difference], before: dict[int, Seen], after: dict[int, Seen],
          outputs: tuple[torch.Tensor, ...],
          is_traced: Callable[[Any], bool], function: str, code: types.CodeType | None,
          argnames: tuple[str, ...] = ()) -> tuple[OutsideWrites, list[Difference]]:
    """What forward wrote outside its return value, in write order per container, and the
    differences left for the heap's rule table.

    ``differences`` are the heap watch's, from its snapshot ``before`` forward to ``after`` (taken
    after forward); ``outputs`` are forward's flat output tensors (attributes set on one that
    is not an argument count too, with an ``("output", i)`` root); ``is_traced(v)`` says
    whether ``v`` is a fake tensor of this trace. Every container holding a traced tensor
    is put back as it was before forward (the runtime repeats the writes on each call) and
    ``after`` is told so. A container whose only changes are Python values is left to the rule
    table, except a tensor, whose user attributes are always taken here.
    Raises ``SideEffectError`` for a write that cannot be routed again per call.
    """
    who = _Who(function, code, argnames)
    per_object: dict[int, list[Difference]] = {}
    for d in differences:
        per_object.setdefault(id(d[0].obj), []).append(d)
    found: list[OutsideTensor] = []
    claimed: list[_Claimed] = []
    rest: list[Difference] = []
    for key, group in per_object.items():
        seen = group[0][0]
        if not _takes(seen, group, after[key].contents, is_traced):
            rest += group
            continue
        # Of a list or a tensor's attributes, every change; of another container, the entries
        # that hold a traced tensor (and any removal, refused below): its Python values set
        # beside them (``obj.count += 1; obj.cache = y``) are the rule table's (an increment).
        taken = group if seen.kind in ("list", "tensor") else [
            d for d in group if d[1][0] == "whole" or d[3] is MISSING or _holds_traced(d[3], is_traced)]
        rest += [d for d in group if not any(d is t for t in taken)]
        if issubclass(type(seen.obj), torch.nn.Module):
            _refuse_registration(seen, taken, who)
        claimed.append(_Claimed(seen, after[key].contents))
        put_back = _without(seen, after[key].contents, taken)
        heap.put(seen, put_back)  # no fake tensor stays in the caller's object
        after[key] = dataclasses.replace(after[key], contents=put_back)
        for step, value in _writes(seen, taken, who):
            place = location(seen, step)
            _check_value(value, place, is_traced, who)
            found.append(OutsideTensor(place, value))
    for i, out in enumerate(outputs):
        if id(out) in before:
            continue  # a tensor the caller holds (an argument returned as is): its changes are above
        for name, value in tensor_attributes(out).items():
            place = Place(Root("output", i), (("attr", name),))
            _check_value(value, place, is_traced, who)
            found.append(OutsideTensor(place, value))
    return OutsideWrites(tuple(found), claimed), rest


def _refuse_registration(seen: Seen, taken: list[Difference], who: _Who) -> None:
    """A module's parameter replaced (``m.double()``: eager swaps its data in place, keeping the
    Parameter; a fake one cannot) or a parameter or buffer registered (``register_buffer``) by
    forward: set again by ``setattr`` each call, it would be a plain tensor or attribute."""
    module = seen.obj
    for _, (_, name), before, _ in taken:
        if name in module._parameters or (before is MISSING and name in module._buffers):
            raise _refusal(who, location(seen, ("attr", name)), "registers or replaces a parameter or "
                           "buffer of that module (register_buffer, register_parameter, m.double(), m.to())")


def _without(seen: Seen, now: Any, taken: list[Difference]) -> Any:
    """Contents ``now`` with the ``taken`` changes undone (all of them, for a list or a tensor)."""
    if seen.kind in ("list", "tensor"):
        return seen.contents
    undone = dict(now)
    for _, (_, k), before, _ in taken:
        if before is MISSING:
            undone.pop(k, None)
        elif k is not None:
            undone[k] = before
    return undone


def _takes(seen: Seen, group: list[Difference], now: Any, is_traced: Callable[[Any], bool]) -> bool:
    """Whether a container's changes are this module's: a tensor's attributes, or a container
    forward stored a traced tensor in (or changed otherwise while one is there)."""
    if seen.kind == "tensor":
        return True
    if seen.kind not in _CLAIMABLE or seen.library:
        return False
    if any(_holds_traced(after, is_traced) for _, step, _, after in group if step[0] != "whole"):
        return True
    removed = any(step[0] == "whole" or after is MISSING for _, step, _, after in group)
    values = now if seen.kind == "list" else now.values()
    return removed and any(_holds_traced(v, is_traced) for v in values)


def _writes(seen: Seen, group: list[Difference], who: _Who) -> list[tuple[tuple[str, Any], Any]]:
    """The writes that repeat a container's changes: appends to a list, entries and attributes
    set. Raises for a change that is not one (an item removed, replaced or inserted, an entry
    deleted, entries reordered)."""
    if seen.kind == "list":
        if len(group) == 1 and group[0][1] == ("extend", None):
            return [(("append", None), v) for v in group[0][3]]
        raise _refusal(who, location(seen, ("append", None)), _REMOVED)
    writes = []
    step_kind = "key" if seen.kind in ("dict", "globals") else "attr"
    for _, (kind, name), _, value in group:
        if kind == "whole":  # (entries reordered: the container's own place)
            raise _refusal(who, place_at(seen.root, _route(seen.steps)), _REMOVED)
        if value is MISSING:
            raise _refusal(who, location(seen, (step_kind, name)), _REMOVED)
        writes.append(((step_kind, name), value))
    return writes


_REMOVED = ("changes that container in a way other than by adding to it or setting entries (an "
            "item replaced in, removed from or inserted into a list; an entry deleted) while "
            "putting a tensor there")


@dataclasses.dataclass(frozen=True)
class _Who:
    """What a refusal names: the Function, its forward's code, its argument names."""

    function: str
    code: types.CodeType | None
    argnames: tuple[str, ...]


def location(seen: Seen, step: tuple[str, Any]) -> Place:
    """The place of a write: ``step`` (``("append", None)``, ``("key", k)``, ``("attr", name)``)
    into the container the heap watch saw as ``seen``."""
    if seen.kind == "globals":  # a global rebound (or a user module's name): written into its dict
        return global_place(seen.obj, step[1], f"global {step[1]}")
    return place_at(seen.root, (*_route(seen.steps), step))


def _route(steps: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """The heap watch's item steps, as the runtime's getters spell them: an index, or a key."""
    return tuple(("key", k) if kind == "item" and not issubclass(type(k), int) else (kind, k) for kind, k in steps)


def _holds_traced(value: Any, is_traced: Callable[[Any], bool]) -> bool:
    if is_traced(value) or issubclass(type(value), (torch.SymInt, torch.SymFloat, torch.SymBool)) \
            and not free_unbacked_symbols(value):  # a number read from data: pystate's to turn into a value
        return True  # a symbolic size is refused by _check_value (its attributes are torch's)
    if issubclass(type(value), torch.Tensor):
        return False
    return any(is_traced(leaf) or issubclass(type(leaf), FakeTensor) for _, leaf in iter_leaves(value))


def _plain_key(key: Any) -> bool:
    """A key the place names again by equality, as eager's lookup does: a string, an int, None, a
    torch device or dtype, a tuple of them (``(x.device, False)``: a memo per device). Not a
    float (NaN never equals itself, eager's next call adds a key of its own)."""
    if issubclass(type(key), tuple):
        return all(_plain_key(k) for k in key)
    return key is None or issubclass(type(key), (str, int)) or type(key) in (torch.device, torch.dtype)


def _check_value(value: Any, place: Place, is_traced: Callable[[Any], bool], who: _Who) -> None:
    """Refuse a value that cannot be put back on each call: a tensor inside a value forward
    made (an object, a container), a fake tensor of another trace, a symbolic size, or a place
    no getter reaches again (below a key that is not a string or a number)."""
    if any(kind in ("key", "item") and not _plain_key(k) for kind, k in place.steps):
        raise _refusal(who, place, "puts a value below a key minihop cannot name again on each call")
    if is_traced(value):
        return
    if issubclass(type(value), FakeTensor):
        raise _refusal(who, place, "puts a fake tensor there that this trace did not make")
    if issubclass(type(value), (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _refusal(who, place, "puts a symbolic size there (captured with dynamic "
                       "shapes, it has no one value)")
    if not issubclass(type(value), torch.Tensor) and _holds_traced(value, is_traced):
        raise _refusal(who, place, f"puts a {type(value).__name__} there that holds a "
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
               or (kind == "key" and (ins.opname == "STORE_SUBSCR"
                                      or ins.opname == "STORE_GLOBAL" and ins.argval == key))
               or (kind == "append" and ins.opname in ("LOAD_ATTR", "LOAD_METHOD")
                   and ins.argval == "append"))
        if hit and ins.positions is not None:
            return ins.positions.lineno
    return None
