"""Where the user's code is: the frames of a running trace or an error that are the user's.

Place in the pipeline: tracer, asked by every part of it that points at the user's source (a
recorded node's ``stack_trace``, an error's ``where``). The user's frames are those outside
torch, minihop and the standard ``operator`` module, and not ``exec``'d code without a file.

Invariant: a frame given as the user's is never one of torch's or minihop's own; the walk
starts above its caller, so moving a caller inside minihop changes nothing it finds.
"""

from __future__ import annotations

import linecache
import operator
import os
import sys
import traceback
from types import FrameType

import torch

__all__ = ["TORCH_DIR", "format_frame", "is_library_code", "stack_trace", "user_frame",
           "user_frame_object", "user_frame_of"]

TORCH_DIR = os.path.dirname(torch.__file__)
_MINIHOP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (TORCH_DIR, _MINIHOP_DIR, os.path.dirname(operator.__file__))


def user_frame_of(error: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``error``'s traceback that belongs to the user's code."""
    found = None
    for frame in traceback.extract_tb(error.__traceback__):
        if not frame.filename.startswith(_SKIP_DIRS) and not frame.filename.startswith("<"):
            found = frame
    return found


def is_library_code(filename: str) -> bool:
    """Whether ``filename`` is torch's, minihop's or the standard operator module's."""
    return filename.startswith(_SKIP_DIRS)


def user_frame_object() -> tuple[FrameType | None, bool]:
    """The innermost frame of the user's code, and whether it is the innermost frame outside
    torch and minihop (False when code without a file, ``exec``'s ``<string>``, came first:
    the frame found is then not the one whose next instruction takes the result)."""
    f = sys._getframe(2)
    direct = True
    while f is not None:
        filename = f.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS):
            if not filename.startswith("<"):
                return f, direct
            direct = False
        f = f.f_back  # type: ignore[assignment]
    return None, False


def user_frame() -> traceback.FrameSummary | None:
    """The innermost frame that belongs to the user's code (not torch's, not minihop's)."""
    f, _ = user_frame_object()
    return None if f is None else traceback.FrameSummary(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


def stack_trace(frame: FrameType) -> str:
    """``traceback.format_list`` of the frame's summary, written directly (once per recorded
    op: building the summary and the stack of one frame cost more than the text)."""
    code, lineno = frame.f_code, frame.f_lineno
    line = linecache.getline(code.co_filename, lineno).strip() if lineno is not None else ""
    head = f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n'
    return f"{head}    {line}\n" if line else head


def format_frame(frame: traceback.FrameSummary | None) -> str | None:
    if frame is None:
        return None
    return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}: {(frame.line or "").strip()}'
