"""What backward does to the containers forward stored tensors in (a memo forward fills and
backward empties: ``CACHE["mask"] = m`` in forward, ``CACHE.pop("mask")`` in backward).

Place in the pipeline: tracer, called by ``outside.OutsideSnapshot.replayed`` when backward is
traced with forward's writes put back, and by ``trace.trace`` to turn what it found into the
record. Forward's tensors are put back for backward to read and taken out again after it (a
trace leaves the caller's state as it found it), so the heap watch (``pystate``) never sees
what backward did there: this module compares each container with what was put there.

Invariant: backward deleting an entry forward wrote is a write replayed after each backward
(``StateWrite`` kind ``"discard"``, as eager's backward leaves the container); any other change
there (an entry rebound, added, a list changed) is refused (MH106): nothing is dropped silently.
"""

from __future__ import annotations

from typing import Any

from ..errors import SideEffectError
from ..spec import MISSING, Place, StateWrite

__all__ = ["BackwardChange", "changes_since", "backward_writes"]

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
