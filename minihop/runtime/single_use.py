"""A single-use capture serves one call, however it is called.

Place in the pipeline: runtime, used by ``capture.make_capture``. A capture whose code read
or ran what minihop cannot bound (``PythonState.single_use``, found by ``tracer.opaque``) is
right for the call it was traced for and unknown for any other. The cache never files such a
capture; this module makes a direct ``Capture`` (``cap = minihop.capture(F, x)``) keep the same
rule: its first run serves the call, and every later ``cap(...)`` raises ``GuardMismatchError``
(MH301) naming why it is single-use, instead of replaying values that may be stale.

Invariant: a capture with reasons in ``single_use`` runs at most once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import GuardMismatchError
from .assumptions import Assumption

__all__ = ["once", "spending"]


def once(name: str, reasons: tuple[str, ...], assumptions: tuple[Assumption, ...],
         run: Callable[[tuple[Any, ...]], Any]) -> tuple[tuple[Assumption, ...], Callable[[tuple[Any, ...]], Any]]:
    """``assumptions`` and ``run`` for a capture: unchanged without ``reasons``; else with
    first an assumption per reason (one check: the capture has not run yet), and ``run``
    noting that it has."""
    if not reasons:
        return assumptions, run
    used = [False]

    def fresh(_args: tuple[Any, ...]) -> bool:
        return not used[0]

    def spent(_args: tuple[Any, ...]) -> GuardMismatchError:
        return GuardMismatchError(
            f"Capture of {name} is single-use and has served its call: " + "; ".join(reasons),
            "minihop cannot bound what that code reads, so a later call could get values of "
            "the first call's state without any error.",
            f"Call minihop.apply({name}, ...) or minihop.function({name}) (they capture again "
            "on each call), or minihop.capture again for each call.")

    def run_once(args: tuple[Any, ...]) -> Any:
        used[0] = True
        return run(args)

    fresh.spend = lambda: used.__setitem__(0, True)  # type: ignore[attr-defined]
    single = tuple(Assumption("single use", "call", "not run yet", fresh,
                              "single-use (minihop.apply captures again on the next call; "
                              f"fallback='eager' runs it eagerly): {reason}", explain_failure=spent)
                   for reason in reasons)
    return (*single, *assumptions), run_once


def spending(assumptions: tuple[Assumption, ...], run: Callable[[tuple[Any, ...]], Any]) -> Callable[[tuple[Any, ...]], Any]:
    """``run`` spending the single use ``assumptions`` (another capture's, from ``once``)
    guard: a capture of edited graphs (``minihop.with_graphs``) shares its original's one call."""
    spend = getattr(assumptions[0].check, "spend", None) if assumptions else None
    if spend is None:
        return run

    def run_once(args: tuple[Any, ...]) -> Any:
        spend()
        return run(args)

    return run_once
