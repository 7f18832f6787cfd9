"""Values on ctx that backward reaches through a holder minihop cannot key: refused (MH106).

Place in the pipeline: tracer (``trace.py`` calls ``refuse_unkeyed_ctx_holders`` once forward
has run, before backward is traced). Backward's reads of a plain value are keyed on where the
value lives (an argument's attribute, a list or dict item, a global): minihop re-reads or
re-traces when it changes. An iterator, a generator or a random generator kept on ctx moves
as backward takes values from it (a second backward takes the next); a weak reference (``weakref.ref``, ``weakref.proxy``, a
``WeakKeyDictionary``/``WeakValueDictionary``/``WeakSet``) or a ``collections.ChainMap`` hides
the place: backward's ``ctx.ref().v`` or ``ctx.cm["k"]`` reads what the caller left there when
``.backward()`` runs (red team 3: forward's value was used, silently). Until such a holder's
reads are keyed by the place model, one kept on ctx (directly, or in a list, tuple, dict or
plain object on ctx) makes the capture refuse; ``fallback="eager"`` then runs the Function eagerly.

Invariant: every ctx value of a type in ``UNKEYED`` (however deep: ``death_code.held_first``, its one walk) is
refused; nothing else is changed.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

from ..errors import SideEffectError
from .hidden import fingerprint
from .death_code import held_first

__all__ = ["UNKEYED", "refuse_unkeyed_ctx_holders"]

# Holders whose lookups are not an attribute or item step of the place model: what they yield
# is found when backward runs (a dereference, a chain of maps searched in order).
UNKEYED: tuple[type, ...] = (weakref.ref, weakref.ProxyType, weakref.CallableProxyType,
                             weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet,
                             collections.ChainMap)


def _unkeyed(value: Any) -> str | None:
    """The type name of ``value`` where it is an unkeyed holder, or None."""
    if issubclass(type(value), UNKEYED):  # (isinstance on a proxy is its referent's: test the type)
        return type(value).__name__
    if not issubclass(type(value), (list, tuple, dict)) and fingerprint(value) is not None:
        # An iterator, a generator, a random generator: each backward (a second one with
        # retain_graph=True) takes the next value; the trace took one, once.
        return type(value).__name__
    return None


def refuse_unkeyed_ctx_holders(name: str, ctx: Any) -> None:
    """MH106 where forward left an ``UNKEYED`` holder on ctx (see module docstring)."""
    seen: set[int] = set()
    for key, value in vars(ctx).items():
        if key.startswith("_minihop"):
            continue
        found = held_first(value, _unkeyed, seen)
        if found:
            raise SideEffectError(
                f"{name}.forward keeps a {found} on ctx.{key}.",
                f"Backward reads through the {found} when it runs (a dereference or a search of "
                "several maps), after the caller may have changed what it reaches; minihop keys "
                "backward's reads on attribute and item places only, so it would use forward's value.",
                "Keep the object itself (ctx.obj = obj) or a plain dict on ctx, or run it eagerly "
                "with minihop.function(F, fallback='eager').")
