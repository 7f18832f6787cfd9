"""The user's grad-mode switches inside backward, recorded as they act in eager in either mode.

Place in the pipeline: tracer, the handler ``special_calls.BEFORE_RUN`` runs for
``torch._C._set_grad_enabled`` (what ``torch.no_grad()``, ``torch.enable_grad()`` and
``torch.set_grad_enabled(...)`` call).

Why backward needs more than "record a real switch": backward is traced once, with grad off,
and its graph runs in two modes -- grad off (an ordinary ``backward()``) and grad on
(``create_graph=True``: eager runs the user's backward with grad enabled, so its ops are
differentiated again). A ``torch.no_grad()`` block switches nothing in the trace, yet under
``create_graph`` it is exactly what keeps its ops out of the double backward; and the end of a
``torch.enable_grad()`` block restores whatever backward was entered with, not the trace's
``False``. So in backward this module tracks the mode as eager would see it in either run --
``AMBIENT`` (the mode backward was entered with), ``True`` or ``False`` -- and records a node
whenever that changes:

- a switch to ``True``/``False`` is ``_set_grad_enabled(flag)``;
- a block's exit back to the mode it was entered in from ``AMBIENT`` is
  ``_set_grad_enabled(ambient)``, where ``ambient = torch.is_grad_enabled()`` is read by the
  graph when it first leaves ``AMBIENT`` (every departure leaves it from the entry mode).

Which exit restores what is read from the grad-mode context manager doing the call (its
``self`` in ``torch/autograd/grad_mode.py``'s frames): the mode when that object entered. A
direct ``torch._C._set_grad_enabled(flag)`` or ``torch.set_grad_enabled(flag)`` as a function
call is a switch to ``flag`` (as in eager, it lasts to the end of backward or the next switch).

A read of ``torch.is_grad_enabled()`` by the user's backward while the mode is ``AMBIENT``
(a branch on it, ``create_graph=torch.is_grad_enabled()``) gives the trace's ``False``; eager's
gives ``True`` under ``create_graph``, where this trace's code would be silently another
program. The read leaves a node ``grad_mode_as_traced(False, ...)`` that raises (MH104) when
the graph runs in a mode unlike the traced one, instead.

Another Function applied by the user's backward (``return Inner.apply(g * x)``, a backward
written as a Function for its double backward) is the same kind of fork: with grad off its
forward's ops are all eager runs, but under ``create_graph`` eager's graph holds ``Inner``'s node,
and the double backward calls ``Inner.backward``, where the captured graph would give its
forward ops' derivative. So the nodes of its forward are marked as a grad-mode read naming it
(``create_graph`` traces backward again with grad on), and a trace with grad on whose
gradients reach such a Function's node is refused (MH104; ``fallback="eager"`` runs the user's
backward for the call).

Forward (and anything else) keeps the plain rule: forward always runs with grad off, as traced,
so only a real switch is recorded (Dynamo's layout).

Invariant: in backward, the graph's grad mode after each recorded node is eager's in both a
``create_graph=False`` and a ``create_graph=True`` run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch

from ..errors import UnsupportedOperationError
from ..spec import READS_GRAD_MODE
from . import handlers
from .death_code import applied_death_code
from .frames import is_library_code

__all__ = ["grad_mode_as_traced", "read", "refuse_through_applied", "switch", "watching_applies"]

_GRAD_MODE_FILE = sys.modules[torch.no_grad.__module__].__file__
# minihop/ (with its separator: not a sibling package named minihop_*): the recording mode's
# frames sit between the context manager and the handler.
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
AMBIENT = "ambient"


class _Modes:
    """Backward's grad mode as eager sees it, while one graph is recorded."""

    def __init__(self) -> None:
        self.current: Any = AMBIENT
        self.ambient_node: Any = None  # the graph's read of the mode backward was entered with
        # id(context manager) -> (it, the mode when it entered): which mode its exit restores.
        self.entered: dict[int, tuple[Any, Any]] = {}


_modes: "weakref.WeakKeyDictionary[Any, _Modes]" = weakref.WeakKeyDictionary()


def _context_manager() -> tuple[str, Any] | None:
    """``(method, self)`` of the outermost torch grad-mode context-manager frame making this
    call (``no_grad.__exit__`` calls ``set_grad_enabled.__init__``: the ``no_grad`` is the one),
    or None for a direct call of ``torch._C._set_grad_enabled``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_DIR):
        frame = frame.f_back
    found = None
    while frame is not None and frame.f_code.co_filename == _GRAD_MODE_FILE:
        found = (frame.f_code.co_name, frame.f_locals.get("self"))
        frame = frame.f_back
    return found


def switch(mode: Any, recorder: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Handle ``torch._C._set_grad_enabled(flag)`` while ``recorder`` records (see above)."""
    flag = bool(args[0])
    if getattr(mode, "phase", None) != "backward":
        if flag != torch.is_grad_enabled():
            recorder.record(func, args, kwargs, None)
        return func(*args, **kwargs)
    modes = _modes.get(recorder)
    if modes is None:
        modes = _modes[recorder] = _Modes()
    caller = _context_manager()
    new: Any = flag
    if caller is not None and caller[1] is not None:
        name, manager = caller
        if name == "__exit__" and id(manager) in modes.entered:
            new = modes.entered.pop(id(manager))[1]
        elif name != "__exit__":
            modes.entered.setdefault(id(manager), (manager, modes.current))
    if new != modes.current:
        if modes.current == AMBIENT and modes.ambient_node is None:
            modes.ambient_node = recorder.record(torch._C.is_grad_enabled, (), {}, False)
        value = modes.ambient_node if new == AMBIENT else new
        recorder.create_node("call_function", func, (value,), {})
        modes.current = new
    return func(*args, **kwargs)


def read(mode: Any) -> bool:
    """``torch.is_grad_enabled()`` while ``mode`` (a ``RecordingMode`` or None) records: the
    real value; a read by the user's backward at the mode backward was entered with is also a
    ``grad_mode_as_traced`` node (see the module docstring)."""
    value = torch._C.is_grad_enabled()
    if mode is None or getattr(mode, "phase", None) != "backward":
        return value
    if is_library_code(sys._getframe(2).f_code.co_filename):
        return value  # torch's own reads (no_grad.__enter__'s): their switches are recorded
    modes = _modes.get(mode.recorder)
    if modes is None or modes.current == AMBIENT:
        where = mode.where() or "backward"
        node = mode.recorder.create_node("call_function", grad_mode_as_traced,
                                         (value, f"{mode.describe()} reads torch.is_grad_enabled() at {where}"), {})
        node.meta[READS_GRAD_MODE] = True  # the runtime traces backward again for the other mode
    return value


def grad_mode_as_traced(traced: bool, what: str) -> None:
    """Run by a bwd graph where the user's backward read grad mode: the mode must be the one
    the graph was traced in (off: an ordinary backward), else its branch is not eager's."""
    if torch._C.is_grad_enabled() != traced:
        raise UnsupportedOperationError(
            f"{what}, and this backward runs with grad mode {'on' if not traced else 'off'} "
            "(backward(create_graph=True) or autograd.grad(..., create_graph=True)).",
            "minihop traced backward with grad mode off (an ordinary backward); what it did with "
            "the value it read (a branch, create_graph=torch.is_grad_enabled()) is fixed in the "
            "graph, and eager's backward would read the other value.",
            "Do not read torch.is_grad_enabled() in backward (eager passes create_graph through "
            "the grad mode: ops there are differentiated exactly when it is on), or run this "
            "Function eagerly (minihop.function(F, fallback='eager') decides before forward).")


@contextlib.contextmanager
def watching_applies(recorder: Any, on: bool) -> Iterator[list[type]]:
    """While the user's backward is traced into ``recorder`` (``on``): the Functions this thread
    applies (``Function.apply`` as found now, minihop's program tracer's included, still runs
    them); the nodes each one's forward recorded are marked as a grad-mode read naming it (the
    graph text is the user's ops only)."""
    found: list[type] = []
    if not on:
        yield found
        return
    held = torch.autograd.Function.__dict__["apply"]
    me = threading.get_ident()

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != me:
            return held.__get__(None, cls)(*args, **kwargs)
        found.append(cls)
        before = len(recorder.graph.nodes)
        try:
            result = held.__get__(None, cls)(*args, **kwargs)
            refused = applied_death_code(cls.__qualname__, result)
            if refused is not None:
                raise handlers.note(refused)  # (raised when the phase returns, if the user's code catches it)
            return result
        finally:
            made = list(recorder.graph.nodes)[before:] or \
                [n for n in recorder.graph.nodes if n.op == "placeholder"]  # (its forward made no op)
            for node in made:
                node.meta[READS_GRAD_MODE] = f"{cls.__qualname__}.apply"

    apply.minihop_watched = held.__func__  # type: ignore[attr-defined]  # (the methods key's: torch's)
    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield found
    finally:
        torch.autograd.Function.apply = held  # type: ignore[method-assign]


def refuse_through_applied(mode: Any, applied: list[type], result: Any, describe: str) -> None:
    """After backward was traced with grad on (``create_graph``) applying ``applied``: refused
    where its gradients reach such a Function's node (see the module docstring)."""
    from .tensor_state import refuse_inner_function_nodes  # (it imports this module's neighbours)

    if torch._C.is_grad_enabled():
        outputs = tuple(t for t in (result if issubclass(type(result), tuple) else (result,)) if issubclass(type(t), torch.Tensor))
        refuse_inner_function_nodes(outputs, f"{describe} (run with create_graph=True)", mode.where())
