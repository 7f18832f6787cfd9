"""A Python function as a key: what it reads of itself when called.

Place in the pipeline: runtime, used by ``guards.value_key`` wherever a function is keyed (an
argument, a guarded global or class attribute holding a helper, a bound method's or a
partial's function, a method in a user class's state). A function object keeps its identity
while the caller replaces what a call of it runs: ``helper.__defaults__ = (3.0,)``,
``helper.__kwdefaults__["s"] = 3.0`` (a dict, changed in place), ``helper.__code__ =
other.__code__``. Each of those changes what the helper computes (its defaults are baked into
the graphs as constants), so each is part of its key. ``__globals__`` and ``__closure__``
cannot be rebound; the closure cells' contents are read places of their own (``tracer/roots``).

A default's own contents (a list default that grows, ``seen=[]``) are not in the key: they
are state of that default object (``tracer/roots.resolve_root`` reads a Function method's
defaults as places). Here a default is keyed by identity unless it is a plain constant
(compared by value, so setting ``(2.0,)`` again hits).

And ``methods_key``: a Function class's own methods as a key, by the ids of their code and
defaults (one attribute load each, on the hot path), with the ``apply`` its callers run and the
``boxed_grads_call`` flag autograd reads at forward: the cache's key (``cache.py``) and what a
direct capture checks before each call (``Capture.__call__``: ``F.forward`` replaced, or its
defaults or code, since the capture was made). ``backward_methods``: what autograd loads again
when backward runs, which the runtime's backward compares.

Invariant: the key holds the function, its code and each default it keys by identity, so no
id in it is reused by another object while the key lives (``methods_held``: what a holder of
a ``methods_key`` keeps alive).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..library_state import Same as _Same, float_bits

__all__ = ["backward_methods", "class_apply", "function_key", "methods_check", "methods_held", "methods_key", "same_function",
           "show_function_key"]

# Defaults compared by value: immutable constants (a float by its bits: -0.0 is not 0.0).
_CONSTANTS = (str, bytes, int, bool, complex, type(None))


def _default_key(value: Any) -> Any:
    if type(value) is float:
        return ("F", float_bits(value))
    if type(value) in _CONSTANTS or issubclass(type(value), type):
        return ("V", type(value), value)
    return ("id", _Same(value))


def function_key(fn: types.FunctionType) -> tuple[Any, ...]:
    """``fn``'s identity, its code's and its defaults' (positional and keyword-only), and its
    names (code that dispatches on ``act.__name__``). Its attributes (``fn.scale``) are
    ``guards.value_key``'s to add: their values are keyed as any value is."""
    kwdefaults = fn.__kwdefaults__
    return ("fn", id(fn), _Same(fn), _Same(fn.__code__),
            tuple(_default_key(v) for v in fn.__defaults__ or ()),
            None if kwdefaults is None else tuple((k, _default_key(v)) for k, v in kwdefaults.items()),
            fn.__name__, fn.__qualname__)


def same_function(key: Any) -> bool:
    """Whether ``key`` is a function's key that its function still has, without keyword
    defaults (a dict changed in place): then its function, code and defaults tuple being the
    very same objects, its names the same strings and no attributes set is a match
    (``guard_checks.compile_live_check``'s fast path)."""
    if not (issubclass(type(key), tuple) and key and key[0] == "fn" and key[5] is None):
        return False
    fn = key[2].obj
    return fn is not None and fn.__kwdefaults__ is None and not fn.__dict__ and function_key(fn) == key


def _show_default(key: Any) -> str:
    if key[0] == "F":
        return repr(float.fromhex(key[1]))
    return repr(key[2]) if key[0] == "V" else f"the {type(key[1].obj).__name__} object at {id(key[1].obj):#x}"


def show_function_key(key: tuple[Any, ...]) -> str:
    """A function's key as a person reads it: ``function helper (defaults (2.0,))``."""
    fn = key[2].obj
    if fn is None:  # (held weakly by its key: ``library_state.Same``)
        return f"function {key[7]} (no longer alive)"
    text = f"function {getattr(fn, '__qualname__', fn)}"
    if key[4]:
        text += f" (defaults ({', '.join(_show_default(d) for d in key[4])}{',' if len(key[4]) == 1 else ''}))"
    if key[5]:
        text += f" (keyword defaults {{{', '.join(f'{k!r}: {_show_default(d)}' for k, d in key[5])}}})"
    if key[3].obj is not fn.__code__:  # (a dead code object: replaced too)
        text += " (its code since replaced)"
    return text


def methods_key(fn_cls: type) -> tuple[Any, ...]:
    """The Function's methods, and what a call of each reads of itself besides its identity:
    its code, defaults and keyword defaults, which the caller may replace on the same function
    object (``F.forward.__defaults__ = (3.0,)``). By id, on the hot path: ``methods_held`` keeps the
    objects of every key made, so no id in a key is another object's while it lives."""
    fwd, bwd, setup, app = fn_cls.forward, fn_cls.backward, fn_cls.setup_context, _apply_of(fn_cls)
    boxed = getattr(fn_cls, "boxed_grads_call", False)  # (read at forward: autograd's node is made boxed)
    try:  # functions (staticmethods): a few attribute loads per call, no key objects built
        if fwd.__kwdefaults__ is None and bwd.__kwdefaults__ is None and setup is _NO_SETUP:
            return (fn_cls, fwd, bwd, fn_cls.vjp, setup, id(fwd.__code__), id(fwd.__defaults__),
                    id(bwd.__code__), id(bwd.__defaults__), app, boxed)
        return (fn_cls, fwd, bwd, fn_cls.vjp, setup, app, boxed, *(id(part) for f in (fwd, bwd, setup) for part in (
            f.__code__, f.__defaults__, *(f.__kwdefaults__ or {}).values())))
    except AttributeError:  # a callable object: its own state is not a function's
        return (fn_cls, fwd, bwd, fn_cls.vjp, setup, app, boxed)


def _apply_of(fn_cls: type) -> Any:
    """The function ``F.apply`` runs: torch's, or an ``apply`` set on the class since a capture
    (eager's ``F.apply`` runs it; a capture is refused for it, ``function_parts.refuse_own_apply``).
    minihop's own watcher, set on torch's ``Function`` while a backward is traced with grad on
    (``tracer.grad_modes.watching_applies``), stands for the one it watches."""
    found = fn_cls.apply
    found = getattr(found, "__func__", found)
    return getattr(found, "minihop_watched", found)


def class_apply(fn_cls: type, again: bool = False) -> Any:
    """``F.apply`` as eager's caller loads it (an ``apply`` set on the class since is its own),
    but torch's where it is minihop's (``F.apply = minihop.function(F).apply``, as @captured does)
    or came back into the eager run it was called for (``again``: ``apply = classmethod(lambda
    cls, *a: MH(*a))``, endlessly otherwise): what a cache runs for a call it runs eagerly."""
    found = fn_cls.apply
    if again or getattr(getattr(found, "__self__", None), "_minihop_own", False):
        return torch.autograd.Function.__dict__["apply"].__get__(None, fn_cls)
    return found


_NO_SETUP = torch.autograd.Function.setup_context
# ``is or ==``: as the tuple comparison of the keys does (a bound classmethod is a new object on
# each load, equal to the one keyed). A load that fails (a method replaced by an object without
# ``__code__``) is a key of another form: not this one. Compiled once; each key's objects are
# the namespace it runs in.
_METHODS_CHECK = compile("\n".join((
    "def check(F):",
    "    try:",
    "        f, b, v, s = F.forward, F.backward, F.vjp, F.setup_context",
    "        return (F is cls and (f is fwd or f == fwd) and (b is bwd or b == bwd) and (v is vjp or v == vjp)",
    "                and (s is setup or s == setup) and f.__kwdefaults__ is None and b.__kwdefaults__ is None",
    "                and f.__code__ is fc and f.__defaults__ is fd and b.__code__ is bc and b.__defaults__ is bd",
    "                and F.apply.__func__ is app and F.boxed_grads_call is bx)",
    "    except AttributeError:",
    "        return False")), "<minihop methods check>", "exec")


def methods_check(fn_cls: type, key: tuple[Any, ...]) -> Callable[[type], bool]:
    """``F -> bool``: ``methods_key(F) == key``, for ``key`` of the common form (staticmethods
    without keyword defaults, no ``setup_context``) generated as identity tests against
    ``fn_cls``'s methods, which ``key`` names: the hot path asks it before each hit, and a key
    tuple built per call costs more than the loads themselves. Any other key (or one that is
    not ``fn_cls``'s now) is compared whole."""
    if len(key) != 11 or key[4] is not _NO_SETUP or type(key[10]) is not bool or methods_key(fn_cls) != key:
        return lambda F: methods_key(F) == key
    fwd, bwd = key[1], key[2]
    consts = {"cls": fn_cls, "fwd": fwd, "bwd": bwd, "vjp": key[3], "setup": _NO_SETUP,
              "fc": fwd.__code__, "fd": fwd.__defaults__, "bc": bwd.__code__, "bd": bwd.__defaults__, "app": key[9], "bx": key[10]}
    exec(_METHODS_CHECK, consts)
    check: Callable[[type], bool] = consts["check"]
    return check


def methods_held(fn_cls: type) -> list[Any]:
    """The objects ``methods_key`` names by id."""
    found: list[Any] = []
    for fn in (fn_cls.forward, fn_cls.backward, fn_cls.setup_context):
        kw = getattr(fn, "__kwdefaults__", None)
        found += [getattr(fn, "__code__", None), getattr(fn, "__defaults__", None), *(kw or {}).values()]
    return found


def backward_methods(fn_cls: type | None, boxed: bool = False) -> tuple[Any, Any, bool] | None:
    """What autograd loads when a call's backward runs (``BackwardCFunction.apply``: ``F.backward``
    and ``F.vjp``, loaded then, not at ``apply``; whether it hands backward its grads as one list:
    ``boxed`` (``F.boxed_grads_call`` when forward ran: the node is made boxed) or the class's
    flag now): a rebinding between forward and ``.backward()`` (``mock.patch.object(F,
    "backward", spy)`` around the loss's backward) is eager's new backward, so the runtime
    compares them before it runs the traced bwd."""
    if fn_cls is None:
        return None
    return (fn_cls.backward, fn_cls.vjp, bool(boxed or getattr(fn_cls, "boxed_grads_call", False)))
