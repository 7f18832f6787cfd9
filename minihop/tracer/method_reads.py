"""The user's function a chain calls as a method of a class: a read place of its own.

Place in the pipeline: tracer, asked by ``pystate.StateTracker`` for each chain its code reads
(``places_named``: these and ``module_reads.places_held``).
``MyFn.scale(t)`` calls the function the class holds under ``scale``; the chain's read place
is the class (``MyFn``), whose key is its identity when it is a ``torch.autograd.Function``
(its other attributes are read places of their own). What a call of ``scale`` computes also
depends on what the function reads of itself, which the caller may replace without touching
the class: ``MyFn.scale.__defaults__ = (3.0,)``, ``__kwdefaults__``, ``__code__``. So the
called attribute is a read place too, keyed by ``runtime.guards.value_key`` (a function by its
defaults and code: ``runtime/function_keys``).

A user class's methods are keyed with its state, a user object's with its class, a user
module's attribute read last is a place (``module_reads``), and an argument is in the call key:
the place added here is redundant for those, and costs one more compare where it is.

Invariant: every user function a chain calls through a class (a staticmethod, a classmethod,
a plain function attribute) is under a guard that sees its defaults and code.
"""

from __future__ import annotations

import types
from typing import Any

from ..spec import Place, Root
from .library import is_user_function
from .module_reads import places_held
from .roots import place_at, walk
from .tensor_attr_reads import attributes_place
from .userattr import UserAttribute

__all__ = ["called_places", "places_named"]


def places_named(root: Root, value: Any, steps: tuple[tuple[str, Any], ...], method: str | None,
                 code: types.CodeType | None = None) -> list[Place]:
    """The places a chain reads besides its own (``root`` then ``steps``, then a call of
    ``method``): names holding modules and a user module's attribute (``module_reads``), the
    user's function it calls on a class (``called_places``), and a tensor's Python attributes
    (``tensor_attr_reads.attributes_place``)."""
    named = steps if method is None else (*steps, ("attr", method))
    return [*places_held(root, value, named), *called_places(root, value, steps, method),
            *attributes_place(root, value, steps, code)]


def called_places(root: Root, value: Any, steps: tuple[tuple[str, Any], ...], method: str | None) -> list[Place]:
    """The place of the function ``method`` names on the class at ``steps`` below ``root``
    (its value ``value``), where that is a user function: guarded like any read place."""
    if method is None or root.uses_args:
        return []
    holder = walk(value, steps)
    if not issubclass(type(holder), type):
        return []  # an object: keyed with its class's methods; a module: module_reads
    called = walk(holder, (("attr", method),))
    if issubclass(type(called), UserAttribute):
        return []  # computed by the user's code: single-use already (userattr)
    fn = called.__func__ if issubclass(type(called), types.MethodType) else called
    if not is_user_function(fn):
        return []
    return [place_at(root, (*steps, ("attr", method)))]
