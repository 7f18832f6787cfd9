"""What backward does to the containers forward stored tensors in (a memo forward fills and
backward empties: ``CACHE["mask"] = m`` in forward, ``CACHE.pop("mask")`` in backward).

Place in the pipeline: tracer, called by ``outside.OutsideWrites.replayed`` when backward is
traced with forward's writes put back, and by ``trace.trace`` to turn what it found into the
record. Forward's tensors are put back for backward to read and taken out again after it (a
trace leaves the caller's state as it found it), so the heap watch (``pystate``) never sees
what backward did there: this module compares each container with what was put there.

Invariant: backward deleting an entry forward wrote is a write replayed after each backward
(``StateWrite`` kind ``"discard"``, as eager's backward leaves the container); any other change
there (an entry rebound, added, a list changed) is refused (MH106): nothing is dropped silently.

And the values backward's reads found (``seen_by_backward``): taken as backward starts, with
forward's writes put back, not after the trace (which took them out again): the runtime
compares them with what the places hold when backward runs, after forward's writes were
replayed. Taken after the trace, a memo forward fills read as missing, so every backward was
traced again, and one that also deleted the entry could not be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import SideEffectError
from ..spec import MISSING, Place, PythonState, StateRead, StateWrite

__all__ = ["BackwardChange", "changes_since", "backward_writes", "seen_by_backward", "with_seen"]

BackwardChange = tuple[Place, str]  # (the place, "deleted" or "changed")


def changes_since(kind: str, put: Any, now: Any, location_of: Any) -> list[BackwardChange]:
    """How a container's contents ``now`` differ from what was ``put`` there before backward
    ran; ``location_of(step)``: the place of a step into it."""
    if kind == "list":
        same = len(now) == len(put) and all(a is b for a, b in zip(now, put, strict=True))
        return [] if same else [(location_of(("append", None)), "changed")]
    step = "key" if kind in ("dict", "globals") else "attr"
    found: list[BackwardChange] = []
    for k, v in put.items():
        if k not in now:
            found.append((location_of((step, k)), "deleted"))
        elif now[k] is not v:
            found.append((location_of((step, k)), "changed"))
    found += [(location_of((step, k)), "changed") for k in now if k not in put]
    return found


def backward_writes(name: str, argnames: tuple[str, ...], changes: list[BackwardChange]) -> tuple[StateWrite, ...]:
    """The writes each backward replays for ``changes`` (a deleted entry); MH106 for the rest."""
    for place, what in changes:
        if what != "deleted":
            raise SideEffectError(
                f"{name}.backward changes {place.describe(argnames)}, in a container where "
                "forward stored a tensor.",
                "minihop puts forward's tensors back there while tracing backward and repeats "
                "a deletion of one (a memo backward empties) after each backward; another "
                "change there would have no value to repeat but the traced one.",
                "Keep what backward changes in a container of its own, or run it eagerly with "
                "minihop.function(F, fallback='eager').")
    return tuple(StateWrite(place, "discard", MISSING, "backward") for place, _ in changes)


def seen_by_backward(reads: list[StateRead], args: tuple[Any, ...],
                     key_of: Callable[[Any], Any]) -> dict[str, Any]:
    """Per backward read of a place outside the arguments (a global, a cell, a class), the key
    of what it holds now, as backward starts: ``description -> key``. (An argument's places
    are keyed with the call.)"""
    seen = {}
    for r in reads:
        if r.phase == "backward" and not r.place.uses_args and r.place.root.kind != "ctx":
            try:
                seen[r.place.description] = key_of(r.place.get(args))
            except Exception:  # unreadable now: keyed after the trace, as before
                continue
    return seen


def with_seen(state: PythonState, seen: dict[str, Any]) -> PythonState:
    """``state`` with each backward read's ``seen`` key set from ``seen``."""
    if not seen:
        return state
    return dataclasses.replace(state, reads=tuple(
        dataclasses.replace(r, seen=seen[r.place.description])
        if r.phase == "backward" and r.place.description in seen else r for r in state.reads))
