"""Put forward's outside writes in place on every call: ``sink.append(y)``, ``obj.cache = y``,
``store["k"] = y``, ``_CACHE.append(y)``, ``hard._soft = soft``.

Place in the pipeline: runtime (never imports the tracer). The tracer found each write as a
``spec.OutsideWrite``; a tensor written is a hidden fwd output (see ``tracer/outside.py`` for
why). ``make_writer`` turns the writes, once per capture, into one function the runner calls
after the Function ran, with the call's arguments and all fwd outputs: each location is
resolved anew from that call's arguments (or the global/closure value as it is now), as eager
would resolve it.

Invariant: the writes happen in the order forward made them, once per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..spec import OutsideWrite, Place
from ..structure import make_getter
from ..returned import fresh, has_computed

__all__ = ["make_writer"]

# Python values written that ``fresh`` rebuilds per call.
_REBUILT = (dict, list, set, tuple)

Writer = Callable[[tuple[Any, ...], Any], None]


def make_writer(writes: tuple[OutsideWrite, ...]) -> Writer | None:
    """``(args, fwd outputs) -> None`` doing ``writes``; None when there are none."""
    if not writes:
        return None
    # A Python value is rebuilt per call (``fresh``): forward makes a new dict or list each
    # eager call (an edit to one call's must not show in the next), and a number computed from
    # symbolic sizes is this call's.
    steps = tuple((_container(w.location), w.location.step, w.output, w.value,
                   w.output is None and (has_computed(w.value) or issubclass(type(w.value), _REBUILT)))
                  for w in writes)

    def write(args: tuple[Any, ...], outs: Any) -> None:
        for container, (kind, key), output, value, rebuilt in steps:
            target = container(args, outs)
            if output is not None:
                value = outs[output]
            elif rebuilt:
                value = fresh(value, args)
            if kind == "append":
                target.append(value)
            elif kind == "key":
                target[key] = value
            else:
                setattr(target, key, value)

    return write


def _container(place: Place) -> Callable[[tuple[Any, ...], Any], Any]:
    """``(args, outs) -> the object the write goes into``, generated once."""
    root = place.root
    if not place.steps:  # the root itself (a rebound global): written into its home
        return lambda args, outs, home=place.owner(()): home
    path = place.steps[:-1]
    if root.kind == "arg":
        get = make_getter((("arg", root.key), *path))
        return lambda args, outs: get(args, {})
    below = make_getter((("arg", 0), *path))  # the path, applied to a root passed as args[0]
    if root.kind == "output":
        return lambda args, outs: below((outs[root.key],), {})
    fetch = root.get
    return lambda args, outs: below((fetch(args),), {})
