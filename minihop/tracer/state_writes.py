"""What each change the heap watch found becomes: a write every call replays, or a refusal.

Place in the pipeline: tracer, called by ``pystate.StateTracker`` for each difference
``heap.changes`` lists after forward and after backward. ``write_of`` names the change's place
(a global, a cell, a process setting, an attribute or item below a root), classifies it by
``heap.RULES`` and returns the ``StateWrite`` the runtime replays; ``refused``/``drawn`` are the
errors for what cannot be replayed.

Invariant: a write replayed as a value set (``set``, ``copy``) either comes from a store in the
user's own code, or its place is guarded (the same before each call, so the same after), or
it is refused: a value library code set (``C.update(["k"])``) may depend on what was there.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..errors import SideEffectError
from ..spec import MISSING, StateWrite
from . import death_code, heap, hidden
from .heap import Seen
from .roots import cell_place, global_place, place_at, value_place

__all__ = ["drawn", "refuse_hidden_reads", "refused", "too_much_state", "write_of"]


def write_of(tracker: Any, was: Seen, step: tuple[str, Any], before: Any, after: Any, phase: str,
             read_places: set[str]) -> StateWrite:
    """One change of ``tracker``'s (a ``pystate.StateTracker``) heap watch, as the first rule of
    ``heap.RULES`` it matches says: a replayed ``StateWrite``, or a refusal (raised)."""
    if was.kind == "hidden":
        tracker._refuse_hidden(was, phase)
    if was.kind == "globals":
        place = global_place(was.obj, step[1], f"global {step[1]}")
    elif was.kind == "cell":
        place = cell_place(was.obj, was.root.key, f"closure variable {was.root.description}")
    elif was.kind == "process":
        place = value_place(str(step[1]), lambda args: None)
    else:  # (a library object's own state: the object's place)
        place = place_at(was.root, was.steps if step in (("extend", None), ("whole", None), ("attr", heap.STATE))
                         else (*was.steps, step))  # (the whole container's: an item replaced, entries reordered)
    name = was.root.description if step[0] in ("extend", "cell") else str(step[1])
    where = tracker.stores.get((phase, name)) or tracker.stores.get((phase, str(step[1])))
    symbolic = [v.node.expr for v in (after if issubclass(type(after), (tuple, list)) else (after,))
                if issubclass(type(v), (torch.SymInt, torch.SymFloat, torch.SymBool))]
    if symbolic and tracker.on_symbolic is not None:
        # A number read from data (an unbacked symbol): written out, it must be a value.
        raise tracker.on_symbolic(symbolic[0], where, f"it is written to {place.description}")
    found = death_code.dropped_death(step, before, after)
    if found is not None:  # (refused even by a backward that stands for its call: it read otherwise)
        raise death_code.refusal(tracker.name, phase, f"it drops {place.description}'s value, {found}",
                                 "where the code drops its last reference, mid-call")
    root = place.description.removeprefix("global ").removeprefix("closure variable ")
    root = root.split(".")[0].split("[")[0]
    rule = heap.classify(heap.Change(was.kind, step, before, after, place.description in read_places,
                                     (phase, root, name) in tracker.increments, was.library))
    if rule.outcome == "refuse":
        return tracker._refuse(place, phase, where, rule.what, tensor=rule.tensor)
    if rule.outcome in ("set", "copy") and after is not MISSING and where is None \
            and place.description not in read_places and not place.uses_args:
        # Set by library code (``C.update(["k"])``, ``d.setdefault``), not by a store of the
        # user's: the value may depend on what was there, which nothing guards. Forward's:
        # the place is guarded now (the same before each call, the same value after);
        # backward's: what was there when backward runs is the caller's to change, refused.
        if phase == "backward":
            return tracker._refuse(place, phase, where, "changes, through library code whose result "
                                "may depend on what was there,")
        # (its source line: the call on the container, ``C.update(...)``, where the code names it)
        tracker._add_read(place, "forward", None, None, tracker.stores.get((phase, root)))
    if rule.outcome in ("set", "copy"):
        # What a later call finds there is dropped by the replay, after the graph ran: it must
        # die quietly then (checked before each call; for backward's, when backward runs).
        quiet = value_place(f"code run when {place.description}'s old value dies (the replay drops it)",
                            lambda args: death_code.quiet_death(place.get(args)))
        tracker._add_read(quiet, phase, None, None, where)
    value = {"extend": lambda: tuple(after), "add": lambda: after - before,
             "copy": lambda: copy.deepcopy(after)}.get(rule.outcome, lambda: after)()
    return StateWrite(place, rule.outcome, value, phase, where)


def refused(name: str, phase: str, what: str, place: str, where: str | None, tensor: bool) -> SideEffectError:
    """The error for a write no capture can repeat (``what`` the code did at ``place``)."""
    todo = ("Return the tensor from forward instead, or run it eagerly with "
            "minihop.function(F, fallback='eager')." if tensor else
            "Keep such state out of the Function, make it a counter, an append of Python "
            "values or a constant, or run it eagerly with minihop.function(F, fallback='eager').")
    return SideEffectError(
        f"{name}.{phase} {what} {place}, Python state it did not create.",
        "A capture replays tensor operations and only simple Python writes (counter "
        "increments, appends of Python values, constants set); this one would happen once, "
        "while tracing, and never again when the graphs run.",
        todo, where=where)


def drawn(name: str, what: str, where: str | None) -> SideEffectError:
    """The error for a draw from a generator or an iterator the code does not own."""
    return SideEffectError(
        f"{name}.{what}, state Python keeps out of sight.",
        "A capture records tensor operations: a number drawn from a Python or numpy random "
        "generator, or taken from an iterator, while tracing would be a constant in the "
        "graphs, and every call would reuse it where eager draws a new one.",
        "Draw with torch instead (torch.rand(()) is recorded and drawn again on every "
        "call), pass the number in as an argument, or run it eagerly with "
        "minihop.function(F, fallback='eager').", where=where)


def refuse_hidden_reads(name: str, reads: list[tuple[str, str, str, int, str | None]]) -> None:
    """The first read ``hidden.ReadWatch`` saw (a clock, a seeding, a setter, a draw), refused."""
    if reads:
        phase, kind, what, line, where = reads[0]
        if kind in ("clock", "seed", "setter"):
            raise hidden.refusal(f"{name}.{phase}", kind, what, line, where)
        named = f" (`{what}`, line {line})" if what else " (in a function it calls)"
        raise drawn(name, f"{phase} draws from {hidden.describe_global(kind)}{named}", where)


def too_much_state(name: str, where: str) -> SideEffectError:
    """More is reachable than the heap watch walks (``heap.TooMuchState``): refused, not guessed."""
    return SideEffectError(
        f"{name}: the Python state its code can reach (its arguments' objects and what it "
        f"names) holds more than {heap.MAX_OBJECTS} objects; the watch stopped at {where}.",
        "minihop watches everything a trace can reach for writes (one it did not see would "
        "stay made by the trace alone, or leave a fake tensor there), and refuses rather than "
        "guess past what it watched.",
        "Pass the Function what it uses rather than a large structure holding it, or run it "
        "eagerly with minihop.function(F, fallback='eager').")
