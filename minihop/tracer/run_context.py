"""How the user's code runs while it is traced: as eager would run it, not as Dynamo's caches would.

Place in the pipeline: tracer, entered by ``session.Tracing.run`` around each phase of the
user's code (forward, ``setup_context``, backward). ``symbols_printed_as_values`` makes a
symbolic size print as its value in the user's own code (pinning it, as Dynamo specialises);
``compiled_code_runs_eagerly`` makes code the user compiled run as written, so its ops are
recorded. ``observing_modes`` names the torch function and dispatch modes active at a call
(a capture is not made or run under them: ``cache``, ``pipeline.run_pipeline``).

Invariant: both are undone when the phase ends, also on an error; torch's own code (error
messages, graph printing) sees torch's behaviour unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from .frames import is_library_code

__all__ = ["compiled_code_runs_eagerly", "modes_refusal", "observing_modes", "refuse_entered_dispatch_modes",
           "symbols_printed_as_values"]


def observing_modes() -> list[str]:
    """The torch function and dispatch modes active now, but torch's default-device context
    (``torch.set_default_device``, ``with torch.device(...)``), which only fills in factory
    ops' device. Any other mode (a user's, ``FlopCounterMode``, a ``FakeTensorMode``) runs its
    code on every op: while a capture is traced it would see the tracer's fake tensors and
    bookkeeping, and a capture's graphs make other calls than eager's forward."""
    if not (torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack()):
        return []
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    found = [m for m in _get_current_function_mode_stack() if not issubclass(type(m), DeviceContext)]
    return [type(m).__qualname__ for m in (*found, *_get_current_dispatch_mode_stack())]


def modes_refusal(function: str, modes: list[str], what: str = "called") -> Any:
    """The refusal of a call (``what``: "called", "captured") made while ``modes`` are active."""
    from ..errors import UnsupportedOperationError
    return UnsupportedOperationError(
        f"{function} was {what} while {', '.join(modes)} {'is' if len(modes) == 1 else 'are'} active "
        "(a torch function or dispatch mode).",
        "A mode runs its code on every op. While a capture is traced it would see minihop's fake "
        "tensors and bookkeeping, and a capture's graphs make other calls than eager's forward: "
        "what the mode counts, records or changes would not be eager's.",
        "Call the Function outside the mode, or use minihop.function(F, fallback=\"eager\").")


def refuse_entered_dispatch_modes(fake_mode: Any, describe: str, where: str | None) -> None:
    """Above the trace's ``fake_mode`` (the caller's modes are refused before tracing), a
    dispatch mode the phase's own code entered (``with LoggingMode():``, a user's
    ``TorchDispatchMode`` counting or rewriting aten ops): it runs on the trace's fake tensors,
    where the heap watch is paused, and the graph's run has no such mode, so what it counts, logs
    or rewrites is lost (before round 24, silently). Refused (MH104)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    from ..errors import UnsupportedOperationError
    stack = _get_current_dispatch_mode_stack()
    above = [m for m in stack[next((i + 1 for i, m in enumerate(stack) if m is fake_mode), len(stack)):]
             if not (type(m).__module__ or "").startswith("minihop.")]  # (minihop's own: a helper's draws)
    if not above:
        return
    raise UnsupportedOperationError(
        f"{describe} runs ops under {', '.join(type(m).__qualname__ for m in above)}, a dispatch mode it entered itself.",
        "A dispatch mode runs its code on every aten op: while traced it sees minihop's fake tensors "
        "(what it records or counts is not put back or repeated), and the captured graph runs without "
        "it, so what it rewrites or counts on each call is lost.",
        "Enter the mode around the call instead (fallback='eager' then runs the Function under it), or "
        "run this Function eagerly with minihop.function(F, fallback='eager').", where=where)


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
