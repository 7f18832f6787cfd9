"""The warnings a captured call gives come from the user's line, as eager's do.

Place in the pipeline: runtime. An op a graph records may warn (torch's ``F.softmax`` without
``dim``, ``F.mse_loss``'s ``size_average``, a C++ ``TORCH_WARN``). Python names a warning's
location by a caller's frame: in eager the user's line, in the user's module, whose registry
is the ``default`` filter's memory, so the warning shows once for that line whichever call
gives it. The graph's call of that op would name the graph's line and namespace, new with each
capture (a new size, a recapture): one more showing per capture. ``at_user_line`` makes the
frame the op is called from: code compiled as the user's file at the user's line, run in the
user's module's namespace (``codegen.emit`` calls such an op through it, from the node's
``"minihop_warns"`` that ``tracer.messages`` noted).

``as_called`` runs a Function eagerly (a refused call, ``fallback="eager"``) as if called
from the user's own frames: minihop's frames between the user's call and ``F.apply`` would
otherwise be what ``warnings.warn(..., stacklevel=3)`` names (eager names the user's call).

``real_run_shows`` wraps the real run (graph or eager) of the call whose forward was just
traced: a warning the trace held back that the run does not give itself (a library's
warn-once flag the trace used up) is given after it, from eager's location and registry.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["as_called", "at_user_line", "real_run_shows"]

_CALL = compile("def call(f, *args, **kwargs): return f(*args, **kwargs)", "<minihop>", "exec").co_consts[0]
_NAMESPACES: dict[tuple[str, str], dict[str, Any]] = {}  # a module not in sys.modules: one per file


def _namespace(module: Any, filename: str) -> dict[str, Any]:
    """The user's module's globals (where ``warnings`` keeps its ``__warningregistry__``)."""
    home = sys.modules.get(module) if issubclass(type(module), str) else None
    if home is not None and issubclass(type(getattr(home, "__dict__", None)), dict):
        return vars(home)
    return _NAMESPACES.setdefault((str(module), filename), {"__name__": module or "<string>"})


@functools.lru_cache(maxsize=1024)
def at_user_line(filename: str, line: int, module: Any, name: str = "call") -> Callable[..., Any]:
    """``call(f, *args, **kwargs)``: ``f(*args, **kwargs)`` from a frame at ``filename``'s
    ``line`` in ``module`` (its code named ``name``, as a log record's ``funcName``): what a
    warning ``f`` gives (at its caller's frame) is located there, as eager's."""
    code = _CALL.replace(co_filename=filename, co_firstlineno=max(int(line or 1), 1), co_name=name, co_qualname=name)
    return types.FunctionType(code, _namespace(module, filename), "call")


# How many of the caller's frames an eager run stands in (a warning's ``stacklevel`` up to 2 + this).
_LEVELS = 3


def as_called(fn: Callable[..., Any] | None, found: Callable[[bool], Callable[..., Any]] | None = None) -> Callable[..., Any]:
    """``fn`` (``F.apply``; or what ``found(again)`` gives when called: the class's ``apply`` now,
    ``again`` where this call is already on the thread's stack), called from stand-ins of the
    first frames outside minihop (each an ``at_user_line`` frame at that frame's line, in its
    module): a warning forward or a helper gives with ``stacklevel`` 3 to 5 is located at the
    user's frame it names in eager."""
    running = threading.local()

    def call(*args: Any, **kwargs: Any) -> Any:
        frame = sys._getframe(1)
        while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("minihop"):
            frame = frame.f_back
        depth = getattr(running, "depth", 0)
        run, stand_ins = (fn if found is None else found(depth > 0)), set()
        for _ in range(_LEVELS):
            if frame is None:
                break
            code = frame.f_code
            stand_in = at_user_line(code.co_filename, frame.f_lineno, frame.f_globals.get("__name__"), code.co_name)
            stand_ins.add(stand_in.__code__)
            run = functools.partial(stand_in, run)
            frame = frame.f_back
        running.depth = depth + 1
        try:
            return run(*args, **kwargs)
        except BaseException as e:
            _without_stand_ins(e.__traceback__, stand_ins)  # (a traceback shows the user's frames once)
            raise
        finally:
            running.depth = depth
    return call


def _without_stand_ins(tb: Any, codes: set[types.CodeType]) -> None:
    """Unlink the stand-in frames from a traceback that passed through them."""
    while tb is not None:
        after = tb.tb_next
        while after is not None and after.tb_frame.f_code in codes:
            after = after.tb_next
        tb.tb_next = after
        tb = after


class real_run_shows:  # noqa: N801  (a context manager, named as one)
    """Around the real run (graph or eager) of the call whose forward was just traced: the
    warnings it gives are shown as they come; after it, each ``held`` one
    (``(text, category, filename, line, module)``) it did not show is given as well, from
    eager's location and registry (a library's warn-once flag was used up by the trace: eager
    gives it now; one the filters hid, they hide again)."""

    def __init__(self, held: list[tuple[Any, ...]]) -> None:
        self.held = held
        self.given: set[tuple[str, type]] = set()

    def __enter__(self) -> None:
        if self.held:
            self.show = warnings.showwarning
            warnings.showwarning = self._noted

    def _noted(self, message: Any, category: type, *args: Any, **kwargs: Any) -> Any:
        self.given.add((str(message), category))
        return self.show(message, category, *args, **kwargs)

    def __exit__(self, *exc: Any) -> None:
        if not self.held:
            return
        if warnings.showwarning == self._noted:
            warnings.showwarning = self.show
        shown = set()
        for text, category, filename, line, module in self.held:
            if (text, category) in self.given or (text, category) in shown or exc[0] is not None:
                continue
            shown.add((text, category))
            registry = _namespace(module, filename).setdefault("__warningregistry__", {})
            warnings.warn_explicit(text, category, filename, int(line or 0), module=module, registry=registry)
