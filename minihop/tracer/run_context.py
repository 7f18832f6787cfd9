"""How the user's code runs while it is traced: as eager would run it, not as Dynamo's caches would.

Place in the pipeline: tracer, entered by ``session.Tracing.run`` around each phase of the
user's code (forward, ``setup_context``, backward). ``symbols_printed_as_values`` makes a
symbolic size print as its value in the user's own code (pinning it, as Dynamo specialises);
``compiled_code_runs_eagerly`` makes code the user compiled run as written, so its ops are
recorded.

Invariant: both are undone when the phase ends, also on an error; torch's own code (error
messages, graph printing) sees torch's behaviour unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from .frames import is_library_code

__all__ = ["compiled_code_runs_eagerly", "symbols_printed_as_values"]


_SYMBOLIC_TYPES = ((torch.SymInt, int), (torch.SymFloat, float), (torch.SymBool, bool))


@contextlib.contextmanager
def symbols_printed_as_values(shape_env: Any) -> Any:
    """``str()``, ``repr()`` and f-strings of a symbolic size in the user's code give its value
    and pin it (the capture is then guarded to that value), as Dynamo specialises it: the
    symbol's name (``s93``) would be text unlike eager's, silently. torch's own calls (error
    messages, graph printing) keep the name. Static traces have no symbols: nothing to do."""
    if shape_env is None:
        yield
        return
    originals = [(cls, cls.__dict__["__repr__"]) for cls, _ in _SYMBOLIC_TYPES]

    def printed(original: Any, convert: type) -> Any:
        def __repr__(self: Any) -> str:
            if is_library_code(sys._getframe(1).f_code.co_filename):
                return original(self)  # type: ignore[no-any-return]
            return repr(convert(self))
        return __repr__

    try:
        for (cls, original), (_, convert) in zip(originals, _SYMBOLIC_TYPES, strict=True):
            cls.__repr__ = printed(original, convert)  # type: ignore[method-assign]
        yield
    finally:
        for cls, original in originals:
            cls.__repr__ = original  # type: ignore[method-assign]


def compiled_code_runs_eagerly() -> Any:
    """Code the user compiled (``torch.compile``) runs as written while it is traced, so its
    ops are recorded: a compiled graph cached from an eager call would run on fake tensors
    (and leave them in autograd's graph). Nothing was compiled if Dynamo was never loaded."""
    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    return torch.compiler.set_stance("force_eager")
