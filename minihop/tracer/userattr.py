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

Invariant: pystate never runs a user-defined attribute getter itself.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

__all__ = ["UserAttribute", "served_by_user_code"]

# Descriptors whose __get__ runs no Python code of anyone's.
_PURE = (types.FunctionType, staticmethod, classmethod, types.BuiltinFunctionType,
         types.MethodDescriptorType, types.WrapperDescriptorType, types.GetSetDescriptorType,
         types.MemberDescriptorType, types.ClassMethodDescriptorType, types.MethodWrapperType)


class UserAttribute:
    """Where a chain stops: ``owner.name`` is computed by user code (``what``)."""

    __slots__ = ("owner", "name", "what")

    def __init__(self, owner: Any, name: str, what: str) -> None:
        self.owner, self.name, self.what = owner, name, what

    def __repr__(self) -> str:
        return f"<.{self.name}, computed by {self.what}>"


def _user(fn: Any, library: Callable[[str], bool]) -> bool:
    fn = getattr(fn, "__func__", fn)
    return isinstance(fn, types.FunctionType) and not library(getattr(fn, "__module__", None) or "")


def _getter(found: Any) -> Any:
    """The Python function reading ``found`` (a class attribute) runs, or None."""
    if isinstance(found, _PURE):
        return None
    if isinstance(found, property):
        return found.fget
    if isinstance(found, functools.cached_property):
        return found.func
    return getattr(type(found), "__get__", None)


def served_by_user_code(obj: Any, name: str, library: Callable[[str], bool]) -> str | None:
    """What user code ``getattr(obj, name)`` would run (for a message), or None if none."""
    cls = type(obj)
    hook = getattr(cls, "__getattribute__", None)
    if hook is not object.__getattribute__ and hook is not type.__getattribute__ and _user(hook, library):
        return f"{cls.__qualname__}.__getattribute__"
    owners = obj.__mro__ if isinstance(obj, type) else ()
    for klass in (*owners, *cls.__mro__):
        found = klass.__dict__.get(name, _NOTHING)
        if found is _NOTHING:
            continue
        if not owners and klass is not None and name in getattr(obj, "__dict__", {}) and \
                not hasattr(type(found), "__set__"):
            return None  # the instance's own value shadows a non-data descriptor
        getter = _getter(found)
        if getter is not None and _user(getter, library):
            return f"{type(found).__qualname__} {klass.__qualname__}.{name}"
        return None
    if name in getattr(obj, "__dict__", {}):
        return None
    hook = getattr(cls, "__getattr__", None)
    if hook is not None and _user(hook, library):
        return f"{cls.__qualname__}.__getattr__"
    return None


_NOTHING = object()
