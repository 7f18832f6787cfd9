"""Attributes served by the user's code: read them only where the user's code reads them.

Place in the pipeline: tracer, asked by ``pystate`` whenever it follows a chain of attributes
(finding what the code reads before the trace, and fetching a guarded place on every call).
``obj.tick`` is not always a lookup: a descriptor's ``__get__``, a ``property``, a
``functools.cached_property`` or a class's ``__getattr__``/``__getattribute__`` run Python
code, which may count calls, draw numbers or read anything. Following such a chain runs that
code one extra time (eager's call runs it once), so the user's counter, generator or cache
would be off by one; and what it read is unknown.

So pystate stops at such a step (``UserAttribute``, neither read nor guarded) and the capture
is single-use (``opaque.Finder.note_chain``): the code runs only inside the trace, as often as
in eager. Library descriptors (torch's ``Module.__getattr__``, a tensor's properties, C
slots, functions becoming bound methods) run no code of the user's and are followed.

Invariant: pystate never runs a user-defined attribute getter itself, and neither does a
check (``place.walk_plain``): ``served_by_user_code`` lives in ``user_code`` for both.
"""

from __future__ import annotations

from typing import Any

from ..user_code import served_by_user_code

__all__ = ["UserAttribute", "served_by_user_code"]


class UserAttribute:
    """Where a chain stops: ``owner`` then ``name`` (``.attr`` or ``[key]``) is computed by
    code (``what``) minihop does not run outside the user's own reads."""

    __slots__ = ("owner", "name", "what")

    def __init__(self, owner: Any, name: str, what: str) -> None:
        self.owner, self.name, self.what = owner, name, what

    def __repr__(self) -> str:
        return f"<.{self.name}, computed by {self.what}>"
