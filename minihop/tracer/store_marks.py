"""Markers on the attributes a Function's code only stores to, while it is traced.

Place in the pipeline: tracer, used by ``pystate.StateTracker`` around one trace. A store of the
value already there (``RECORDER.last = n``, the same ``n`` as last call) changes nothing the heap
watch can see, yet eager makes it on every call, and the value may differ by the next one. So
such an attribute holds a ``_Marker`` while tracing: the store is then a change, replayed.

Invariant: a marker is never where the user's code may read it. An attribute the code reads
(a guarded place), or one of an object the code reads as a whole (``getattr(S, "k", None)``,
``vars(S)``: its reads are not named, so any attribute of it may be read) is not marked; a
backward traced again after forward (which would have overwritten the marker) sees none of
forward's markers where it reads.
"""

from __future__ import annotations

import types
from typing import Any

from ..spec import MISSING, StateRead
from .atoms import ATOMS
from ..library_state import del_attr, set_attr
from .roots import place_at, resolve_root

__all__ = ["Marked", "mark", "unmark"]

Marked = list[tuple[Any, str, Any]]  # (owner, attribute, the value it had before: MISSING if none)


class _Marker:
    """What an attribute that is only stored to holds while tracing."""

    def __repr__(self) -> str:
        return "<minihop: not stored yet>"


def mark(analysed: tuple[Any, ...], reads: list[StateRead], args: tuple[Any, ...]) -> Marked:
    """Put a marker on each attribute ``analysed`` code stores to and never reads; returns what
    ``unmark`` puts back."""
    read_places = {r.place.description for r in reads}
    marked: Marked = []
    for _phase, fn, facts, _params in analysed:
        for target in facts.targets:
            root = resolve_root(fn, target, {})
            if root is None or root.uses_args:
                continue  # attributes of argument objects are in the call key
            place = place_at(root, target.steps)
            if any(place_at(root, target.steps[:k]).description in read_places
                   for k in range(len(target.steps) + 1)):
                # Guarded (the same before every call, so storing it again changes nothing), or
                # an attribute of an object read whole (the code may read it unnamed).
                continue
            owner = place.owner(args)
            name = str(target.steps[-1][1])
            setter = getattr(type(owner), name, None)
            if hasattr(setter, "__set__") and not issubclass(type(setter), types.MemberDescriptorType):
                continue  # a property: reading or marking it would run the user's code in it
            try:
                old = getattr(owner, name, MISSING) if owner is not MISSING else MISSING
            except Exception:  # a user __getattr__: not a plain attribute to mark
                continue
            if owner is MISSING or issubclass(type(owner), types.ModuleType) or not (
                    old is MISSING or issubclass(type(old), ATOMS)) or \
                    any(o is owner and n == name for o, n, _ in marked):
                continue
            try:
                set_attr(owner, name, _Marker())
            except Exception:
                continue
            marked.append((owner, name, old))
    return marked


def unmark(marked: Marked) -> None:
    """Put back what ``mark`` replaced, where a marker is still there."""
    for owner, name, old in marked:
        try:
            if old is MISSING:
                if issubclass(type(getattr(owner, name, None)), _Marker):
                    del_attr(owner, name)
            elif issubclass(type(getattr(owner, name, None)), _Marker):
                set_attr(owner, name, old)
        except Exception:
            continue
