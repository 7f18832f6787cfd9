"""Every error minihop raises on purpose, and the notices it gives (``MinihopWarning``).

Each class subclasses ``MinihopError`` and the built-in exception a user would already catch
(``TypeError``, ``ValueError``, ``NotImplementedError``). Messages follow one shape, as JAX's do:
what was found (naming the user's Function, method, argument path and source line), why it is
not supported, and what to do instead. Each class carries a stable ``code`` so messages can be
pinned in tests and looked up in ``docs/unsupported.md``.
"""

from __future__ import annotations

import logging
import threading
import traceback
import warnings

__all__ = [
    "MinihopError",
    "UnsupportedArgumentError",
    "UnsupportedOutputError",
    "DataDependentError",
    "BackwardOutputError",
    "InplaceInputError",
    "SideEffectError",
    "GuardMismatchError",
    "InconsistentGraphsError",
    "UnsupportedOperationError",
    "CtxArgumentError",
]
# (Not errors, so not in ``__all__``, which tests read as the error classes: ``MinihopWarning``,
# public as ``minihop.MinihopWarning``, ``notice``, which gives one, and ``shows_fakes``.)


class _ErrorType(type):
    """The errors' metaclass: ``dir()`` of an error class lists minihop's own attributes only,
    so ``help(minihop)`` shows each error's code and fields, not the hundreds of lines of
    methods every exception inherits (attribute lookup itself is unchanged)."""

    def __dir__(cls) -> list[str]:
        return sorted({name for klass in cls.__mro__ if klass.__module__ == __name__ for name in vars(klass)})


class MinihopError(Exception, metaclass=_ErrorType):
    """Base of every error minihop raises deliberately."""

    code: str = "MH000"

    def __init__(self, found: str, why: str, todo: str, *, where: str | None = None) -> None:
        self.found = found
        self.why = why
        self.todo = todo
        self.where = where
        lines = [f"[{self.code}] {found}"]
        if where:
            lines.append(f"  at {where}")
        lines.append(f"Why: {why}")
        lines.append(f"What to do: {todo}")
        super().__init__("\n".join(lines))
        if getattr(MADE, "depth", 0):  # (while the user's code is traced: one torch then swallows is found again)
            MADE.last = self


# .last: the MinihopError made last in this thread while a phase of the user's code was traced
# (.depth: how many such phases run), and only then: raised, it holds the frames of its
# traceback, and with them the caller's objects (a call's ctx, its tensors), which eager
# lets go of when the call ends.
MADE = threading.local()


def made_in(depth: int) -> None:
    """A phase of the user's code begins (+1) or ends (-1): ``last_made`` is kept only within."""
    MADE.depth = getattr(MADE, "depth", 0) + depth
    MADE.last = None


def last_made() -> MinihopError | None:
    """The MinihopError made last in this thread (kept only while a phase is traced: ``made_in``):
    a refusal raised inside a tensor's binary operator, which torch turns into ``NotImplemented``
    and Python then into "unsupported operand type(s)", is found again by the trace."""
    return getattr(MADE, "last", None)


class UnsupportedArgumentError(MinihopError, TypeError):
    """An argument (or a ``dynamic=`` request about one) minihop cannot capture faithfully."""

    code = "MH101"


class UnsupportedOutputError(MinihopError, TypeError):
    """Forward returned, or a saved capture holds, something minihop cannot rebuild."""

    code = "MH102"


class DataDependentError(MinihopError, NotImplementedError):
    """Forward or backward needs tensor values minihop cannot guard (random ops, ...)."""

    code = "MH103"


class UnsupportedOperationError(MinihopError, NotImplementedError):
    """An operation that cannot run on fake tensors, or cannot be replayed as captured."""

    code = "MH104"


class InplaceInputError(MinihopError, RuntimeError):
    """An in-place write to an input that eager's autograd would refuse or mis-handle."""

    code = "MH105"


class SideEffectError(MinihopError, NotImplementedError):
    """A write to Python state minihop cannot replay exactly as eager makes it."""

    code = "MH106"


class CtxArgumentError(MinihopError, TypeError, RuntimeError, AssertionError):
    """A ``ctx`` method called with arguments eager refuses."""

    # Eager raises TypeError (save_for_backward), RuntimeError (mark_dirty,
    # mark_non_differentiable) or AssertionError (save_for_forward) for these: one class that
    # is all three keeps every handler written against eager working.
    code = "MH107"


class BackwardOutputError(MinihopError, ValueError, RuntimeError):
    """Backward returned the wrong number, shape or kind of grads."""

    # Eager raises RuntimeError for these: code written against eager keeps catching them.
    code = "MH201"


class GuardMismatchError(MinihopError, ValueError):
    """A capture called with arguments unlike the ones it was captured for."""

    code = "MH301"


class InconsistentGraphsError(MinihopError, ValueError):
    """A (fwd, bwd) pair that breaks the graph contract (``check_consistent``)."""

    code = "MH401"


class MinihopWarning(UserWarning, metaclass=_ErrorType):
    """minihop's notices: a Function run eagerly (``fallback="eager"``), a cache limit reached,
    a backward traced for too many values. Filter them by this class."""


def notice(message: str, stacklevel: int = 2) -> None:
    """Give one of minihop's notices as a ``MinihopWarning``. Where the caller's filters make
    warnings errors (``-W error``, ``simplefilter("error")``), the notice is logged instead
    (logger ``minihop``): under ``fallback="eager"`` a call runs as eager's would, and raising
    minihop's notice would make it raise where eager does not."""
    try:
        warnings.warn(message, MinihopWarning, stacklevel=stacklevel + 1)
    except MinihopWarning:
        logging.getLogger("minihop").warning(message)


def release_frames(error: BaseException, drop: bool = True) -> None:
    """Free the locals of the frames an exception's traceback keeps (and its cause's and
    context's), which hold them in a cycle: eager frees a call's objects when the caller drops
    them, and runs their ``__del__`` then, not when the garbage collector next runs. ``drop``:
    the traceback goes too (the error is kept for its message only). (A frame still running
    is left as it is.)"""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        if drop:
            e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


def shows_fakes(raised: BaseException) -> bool:
    """Whether an exception's text shows a fake tensor (its repr or class name): one raised by
    the user's code traced on fakes, which eager, on the call's values, never raises as such."""
    try:
        return "FakeTensor" in str(raised)
    except Exception:  # (a user's __str__ that fails)
        return False
