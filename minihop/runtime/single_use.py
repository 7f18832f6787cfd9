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

__all__ = ["once", "spending"]

Check = tuple[Callable[[tuple[Any, ...]], bool], Callable[[tuple[Any, ...]], Any]]


def once(name: str, reasons: tuple[str, ...], checks: tuple[Check, ...],
         run: Callable[[tuple[Any, ...]], Any]) -> tuple[tuple[Check, ...], Callable[[tuple[Any, ...]], Any]]:
    """``checks`` and ``run`` for a capture: unchanged without ``reasons``; else with a first
    check that fails once ``run`` has run, and ``run`` noting that it has."""
    if not reasons:
        return checks, run
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
    return ((fresh, spent), *checks), run_once


def spending(checks: tuple[Check, ...], run: Callable[[tuple[Any, ...]], Any]) -> Callable[[tuple[Any, ...]], Any]:
    """``run`` spending the single use ``checks`` (another capture's, from ``once``) guard:
    a capture of edited graphs (``minihop.with_graphs``) shares its original's one call."""
    spend = getattr(checks[0][0], "spend", None) if checks else None
    if spend is None:
        return run

    def run_once(args: tuple[Any, ...]) -> Any:
        spend()
        return run(args)

    return run_once
