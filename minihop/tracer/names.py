"""Readable names for graph values, taken from the user's own code.

Place in the pipeline: tracer. Dynamo names a node after the local variable it is first
stored in; minihop reads the store off the bytecode after each recorded call
(``result_use``), falls back on the user's frame locals when forward/backward return
(``sys.setprofile``, only while that one call runs), and names inputs after argument paths
(``weird.b`` -> ``l_weird_b``), as Dynamo's sources do.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import inspect
import sys
import traceback
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

import torch

from ..graph_names import ident as _ident, input_name
from .bytecode import instructions
from .death_code import local_callbacks

__all__ = ["FrameSnapshot", "input_name", "capture_locals", "code_of", "name_hints", "result_use",
           "STORE", "DISCARD", "UNPACK"]


def code_of(fn: Any) -> CodeType | None:
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    return code if issubclass(type(code), CodeType) else None


def free_values(fn: Any) -> Iterator[tuple[str, str, Any, Callable[[], Any]]]:
    """``("closure" | "global", name, value, how to fetch it anew)`` for each bound closure
    cell and global that ``fn``'s code names."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        yield "closure", name, value, lambda c=cell: c.cell_contents
    # The globals named by code nested in it too (a lambda, a comprehension), which runs with them.
    for name in dict.fromkeys(n for inner in _nested(code) for n in inner.co_names):
        if name in fn.__globals__:
            yield "global", name, fn.__globals__[name], lambda g=fn.__globals__, n=name: g[n]


def _nested(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if issubclass(type(const), CodeType):
            yield from _nested(const)


@dataclasses.dataclass
class FrameSnapshot:
    """The user's frame as its call returned: locals and the returning line."""

    locals: dict[str, Any] = dataclasses.field(default_factory=dict)
    stack_trace: str | None = None
    # A weak reference among the locals whose callback is the user's (``death_code``)
    death_code: str | None = None


@contextlib.contextmanager
def capture_locals(fn: Any, sink: FrameSnapshot) -> Iterator[None]:
    """While active, fill ``sink`` from ``fn``'s frame as its (outermost) call returns.

    The profile hook only waits for that call to start, keeps its frame and turns itself off:
    left on, it ran for every Python and C call of every fake op (half of a capture). A frame
    that has finished keeps its locals and last line, read when the block ends."""
    code = code_of(fn)
    previous = sys.getprofile()
    if code is None or previous is not None:
        # Another profiler (cProfile, a debugger) owns the hook: leave it alone; nodes are
        # then named after their ops instead of the user's variables.
        yield
        return
    started: list[FrameType] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            started.append(frame)
            sys.setprofile(None)

    sys.setprofile(profile)
    try:
        yield
    finally:
        if sys.getprofile() is profile:  # (not once the user's code set one of its own: that stays)
            sys.setprofile(previous)
        if started:
            frame = started.pop()
            # Parameters name inputs, not the values an op returned in their place
            # (``y = y.contiguous()`` may return the same object).
            nparams = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
            params = set(code.co_varnames[:nparams])
            # Only tensors are named; holding any other local past the call would run its
            # ``__del__`` after the watches stop, where eager runs it as the call returns.
            found = frame.f_locals  # (a snapshot the frame keeps, past its own clearing: emptied below)
            sink.death_code = local_callbacks(found.values())
            sink.locals.update((k, v) for k, v in found.items() if k not in params and issubclass(type(v), torch.Tensor))
            found.clear()
            summary = traceback.FrameSummary(code.co_filename, frame.f_lineno, code.co_name)
            sink.stack_trace = "".join(traceback.format_list([summary]))
            del frame


def name_hints(locals_: dict[str, Any], node_of: Callable[[Any], Any],
               stored: dict[Any, str]) -> dict[Any, str]:
    """Map node -> local variable name: the name a value was first stored in as it was made
    (``stored``, Dynamo's rule), else a name it has in the frame's locals at return (a value
    stored later, by a caller), first name wins; ``node_of`` returns None if unknown."""
    hints: dict[Any, str] = dict(stored)
    for name, value in locals_.items():
        if name in ("ctx", "self", "cls") or name.startswith("_"):
            continue
        node = node_of(value)
        if node is not None and node not in hints and node.op != "placeholder":
            hints[node] = _ident(name)
    return hints


# What the instruction after a call does with its result: (kind, detail).
STORE, DISCARD, UNPACK = "store", "discard", "unpack"
_STORES = ("STORE_FAST", "STORE_DEREF")


def _offset(instruction: Any) -> int:
    return int(instruction.offset)


def result_use(frame: FrameType) -> tuple[str, Any] | None:
    """How the user's code at ``frame`` uses the value the call now running returns.

    ``(STORE, name)``: stored in a local (``r = x * y``); ``(DISCARD, None)``: dropped (a
    statement such as ``r.mul_(2)``); ``(UNPACK, names)``: unpacked into locals, a name or
    None per item (``a, b = x.chunk(2)``); None: used in an expression. Read off the bytecode
    after the frame's current instruction, as Dynamo sees the store when it interprets it.
    """
    found, index = instructions(frame.f_code)
    at = index.get(frame.f_lasti)
    if at is None:
        # Python 3.11 leaves a caller's f_lasti on the last inline-cache unit of its CALL while
        # the Python function it called runs (``F.relu(y, inplace=True)``, a library wrapper):
        # the call is the last instruction at or before it.
        at = bisect.bisect_right(found, frame.f_lasti, key=_offset) - 1
        if at < 0:
            return None
    following = found[at + 1:at + 17]  # enough to read an unpack's stores
    if not following:
        return None
    first = following[0]
    if first.opname in _STORES:
        return STORE, first.argval
    if first.opname == "POP_TOP":
        return DISCARD, None
    if first.opname == "UNPACK_SEQUENCE":
        items = following[1:1 + first.argval]
        return UNPACK, tuple(i.argval if i.opname in _STORES else None for i in items)
    return None
