"""Python values the user's code takes from symbolic sizes in a backward traced again for a call.

Place in the pipeline: tracer, around the user's backward in ``backward.rerun_backward`` when
the capture has dynamic sizes. Such a trace reuses the capture's symbolic sizes, whose values
(hints) are the sizes the capture was traced for, not this call's: a Python number or branch
the user's code takes from one (``int(g.shape[0])``, ``if n > 2``, ``range(n)``) would be
another call's, written to a log or baked into the graphs. So while the user's backward runs,
converting a symbolic number to a Python value *from the user's own frames* is refused
(MH104), unless its answer holds for every size (``n >= 0``); torch's own code doing so
inside an op (strides, contiguity) is left alone.

Invariant: the conversion methods of ``torch.SymInt``, ``SymFloat`` and ``SymBool`` are the
originals again when ``refusing_size_values`` exits, however it exits.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_float, is_concrete_int, statically_known_true

from ..errors import UnsupportedOperationError

__all__ = ["refusing_size_values"]

_CONVERSIONS = ((torch.SymInt, ("__int__", "__index__", "__bool__")),
                (torch.SymFloat, ("__int__", "__float__", "__bool__")),
                (torch.SymBool, ("__int__", "__bool__")))


@contextlib.contextmanager
def refusing_size_values(name: str, is_user: Callable[[types.FrameType], bool]) -> Iterator[None]:
    """While inside: a conversion called from a frame ``is_user`` accepts raises MH104."""
    originals: list[tuple[type, str, Any]] = []

    def guarded(cls: type, method: str, original: Any) -> Any:
        def convert(self: Any) -> Any:
            frame = sys._getframe(1)
            if is_user(frame) and not _known(self):
                raise _refusal(name, self, frame)
            return original(self)
        return convert

    for cls, methods in _CONVERSIONS:
        for method in methods:
            original = vars(cls)[method]
            originals.append((cls, method, original))
            setattr(cls, method, guarded(cls, method, original))
    try:
        yield
    finally:
        for cls, method, original in originals:
            setattr(cls, method, original)


def _known(value: Any) -> bool:
    """Whether ``value``'s answer is the same for every size the capture serves (a size's own
    bounds decide it: ``n >= 0``), so the trace's answer is the call's too."""
    if issubclass(type(value), torch.SymBool):
        return statically_known_true(value) or statically_known_true(torch.sym_not(value))
    return is_concrete_int(value) if issubclass(type(value), torch.SymInt) else is_concrete_float(value)


def _refusal(name: str, value: Any, frame: types.FrameType) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"{name}.backward, traced again for this call, takes a Python value from a dynamic "
        f"size ({value.node.expr}).",
        "A backward traced again reuses the capture's symbolic sizes, whose values are the "
        "sizes the capture was traced for, not this call's; the value would be another call's.",
        "Compute with tensor ops instead of Python numbers from sizes, capture with "
        "dynamic=False, or call the Function eagerly.",
        where=f'File "{frame.f_code.co_filename}", line {frame.f_lineno}')
