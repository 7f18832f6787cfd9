"""Every error minihop raises on purpose.

Each class subclasses ``MinihopError`` and the built-in exception a user would already catch
(``TypeError``, ``ValueError``, ``NotImplementedError``). Messages follow one shape, as JAX's do:
what was found (naming the user's Function, method, argument path and source line), why it is
not supported, and what to do instead. Each class carries a stable ``code`` so messages can be
pinned in tests and looked up in ``docs/unsupported.md``.
"""

from __future__ import annotations

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


class MinihopError(Exception):
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


class UnsupportedArgumentError(MinihopError, TypeError):
    code = "MH101"


class UnsupportedOutputError(MinihopError, TypeError):
    code = "MH102"


class DataDependentError(MinihopError, NotImplementedError):
    code = "MH103"


class UnsupportedOperationError(MinihopError, NotImplementedError):
    code = "MH104"


class InplaceInputError(MinihopError, RuntimeError):
    code = "MH105"


class SideEffectError(MinihopError, NotImplementedError):
    code = "MH106"


class CtxArgumentError(MinihopError, TypeError, RuntimeError, AssertionError):
    # Eager raises TypeError (save_for_backward), RuntimeError (mark_dirty,
    # mark_non_differentiable) or AssertionError (save_for_forward) for these: one class that
    # is all three keeps every handler written against eager working.
    code = "MH107"


class BackwardOutputError(MinihopError, ValueError, RuntimeError):
    # Eager raises RuntimeError for these: code written against eager keeps catching them.
    code = "MH201"


class GuardMismatchError(MinihopError, ValueError):
    code = "MH301"


class InconsistentGraphsError(MinihopError, ValueError):
    code = "MH401"
