"""Which Python operator the user wrote, so the graph records it as Dynamo does.

Place in the pipeline: tracer. A torch function mode sees ``x * y``, ``2 * x`` and
``x.mul(y)`` as the same call (``Tensor.mul(x, y)`` or ``(x, 2)``), so the operator form and
the operands' source order are lost by the time the recording mode runs. While a trace runs,
``hold()`` puts a thin wrapper on each of ``torch.Tensor``'s operator slots
(``__mul__``, ``__rmul__``, ``__iadd__``, ``__invert__``, ...): it notes, for this thread,
which ``operator`` function the user's syntax means and whether Python called the reflected
slot, then calls torch's own slot unchanged. The next torch call the recording mode sees takes
that note (``take_form``), and the node is written ``operator.mul(2, x)`` as Dynamo writes it;
without a note the call was a method (``x.mul(y)``) or a function (``torch.mul``).

The wrappers are put on once, at the first trace, and stay: putting them on and taking them
off per trace costs milliseconds (each change to a class's attributes invalidates the type
caches of torch.Tensor's many subclasses), more than a whole small capture. Outside a trace
(no ``hold`` counted) a wrapper only tests a counter and calls torch's slot, so eager code,
and the captured graphs as they run, pay one Python call per operator; the form is
thread-local, so a trace in one thread never sees another thread's operators.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["hold", "release", "take_form", "Form"]

# (the operator function, whether Python called the reflected slot: operands swapped back).
Form = tuple[Callable[..., Any], bool]

_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
           "pow": operator.pow, "matmul": operator.matmul, "and": operator.and_,
           "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift,
           "rshift": operator.rshift}
_INPLACE = {"add": operator.iadd, "sub": operator.isub, "mul": operator.imul,
            "truediv": operator.itruediv, "floordiv": operator.ifloordiv, "mod": operator.imod,
            "pow": operator.ipow, "matmul": operator.imatmul, "and": operator.iand,
            "or": operator.ior, "xor": operator.ixor, "lshift": operator.ilshift,
            "rshift": operator.irshift}
# Comparisons have no reflected slot of their own: Python calls ``x.__gt__(0)`` for ``0 < x``,
# and Dynamo records what Python called (``x > 0``).
_SLOTS: dict[str, tuple[Callable[..., Any], bool]] = {
    **{f"__{n}__": (f, False) for n, f in _BINARY.items()},
    **{f"__r{n}__": (f, True) for n, f in _BINARY.items()},
    **{f"__i{n}__": (f, False) for n, f in _INPLACE.items()},
    "__lt__": (operator.lt, False), "__le__": (operator.le, False),
    "__gt__": (operator.gt, False), "__ge__": (operator.ge, False),
    "__eq__": (operator.eq, False), "__ne__": (operator.ne, False),
    "__neg__": (operator.neg, False), "__pos__": (operator.pos, False),
    "__abs__": (operator.abs, False), "__invert__": (operator.invert, False),
}
# ``@=``: torch.Tensor has no ``__imatmul__``, so Python falls back to ``__matmul__`` and
# rebinds the name (no write). Dynamo still records ``operator.imatmul``; the wrapper added
# for the trace calls ``__matmul__``, as Python's fallback would.
_FALLBACK = {"__imatmul__": "__matmul__"}

_UNARY = {"__neg__", "__pos__", "__abs__", "__invert__"}

_state = threading.local()
_lock = threading.Lock()
_users = 0
_installed = False


def take_form() -> Form | None:
    """The operator the user's syntax meant for the torch call now running, once."""
    form = getattr(_state, "form", None)
    if form is not None:
        _state.form = None
    return form


def _noted(original: Callable[..., Any], form: Form, self: Any, *args: Any) -> Any:
    outer = getattr(_state, "form", None)
    _state.form = form
    try:
        return original(self, *args)
    finally:
        _state.form = outer  # a slot that made no torch call (NotImplemented) leaves none


def _wrap(original: Callable[..., Any], form: Form, unary: bool) -> Callable[..., Any]:
    # One wrapper per arity, no *args: outside a trace this is the whole cost per operator.
    if unary:
        def slot(self: Any) -> Any:
            return _noted(original, form, self) if _users else original(self)
    else:
        def slot(self: Any, other: Any) -> Any:
            return _noted(original, form, self, other) if _users else original(self, other)
    slot.__name__ = getattr(original, "__name__", "slot")
    return slot


def _install() -> None:
    originals = {name: getattr(torch.Tensor, _FALLBACK.get(name, name), None) for name in _SLOTS}
    for name, form in _SLOTS.items():
        if originals[name] is not None:
            setattr(torch.Tensor, name, _wrap(originals[name], form, name in _UNARY))


def hold() -> None:
    """A trace starts: note operator forms until the matching ``release``."""
    global _users, _installed
    with _lock:
        if not _installed:
            _install()
            _installed = True
        _users += 1


def release() -> None:
    global _users
    with _lock:
        _users -= 1
    _state.form = None
