"""What the user's code asks a traced value that no stand-in answers as eager: refused.

Place in the pipeline: tracer, asked by ``pystate.StateTracker`` for each analysed code object
and each library function its chains call, before the trace runs. The trace runs the user's
code on values that are not the caller's: fake tensors, and with symbolic sizes
(``dynamic=True``, or automatic dynamic shapes once a size changed) ``torch.SymInt`` sizes and
numbers; and minihop's tracer calls forward and backward, not eager's ``Function.apply``.
``type()`` and ``isinstance`` are answered as eager's by stand-ins (``identity.TypeAsEager``); a
tensor's text is refused where it is taken (``identity.TextAsEager``). What is left, found in
the bytecode or among the functions called, is refused here (MH104):

- ``v.__class__`` (a fake tensor's is ``FakeTensor``), ``v.__dict__`` (a fake's holds the
  tracer's entries) and a name only a fake tensor has (``hasattr(x, "fake_mode")``), in any
  trace (``vars(x)``/``dir(x)`` are stand-ins that refuse a fake, ``identity.VARS``);
- in a symbolic trace, ``match n: case int():`` (C's isinstance), ``(n > 4) is True`` (a
  ``SymBool`` is not ``True``), a ``functools.singledispatch`` call (it dispatches on
  ``n.__class__``) and numpy reached (``np.array([n])`` is an object array): the automatic
  policy then captures the Function static (``cache._traced``);
- the frames of its callers (``sys._getframe``, ``inspect.stack``, ``traceback.extract_stack``,
  ``f.f_back``): minihop's while traced; and who holds a value (``sys.getrefcount``,
  ``gc.get_referrers``, ``weakref.getweakrefcount``): the trace's references are counted too.

Invariant: over-approximate, never under: a read is refused where its value could be one of
these, whatever it turns out to be (``cfg.__class__`` too; ``self.__class__`` is the user's own).
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import torch

from ..errors import UnsupportedOperationError
from .bytecode import instructions
from .identity import _FAKE_ONLY, _SYMBOLIC
from .library import autograd_state, reads_trace_modes, torch_io

__all__ = ["numpy_value", "reads_stack", "refuse_class_reads", "symbolic"]


@functools.lru_cache(maxsize=1024)
def _class_reads(code: types.CodeType) -> tuple[tuple[str, str, int | None], ...]:
    """Where ``code`` (or code nested in it) reads the class of a value by means no stand-in
    answers: ``v.__class__`` (but ``self.__class__``/``cls.__class__``), ``match v: case
    int():`` (``MATCH_CLASS``, C's isinstance) and ``v is True`` (a symbolic bool is another
    object than ``True``), and a caller's frame (``f.f_back``): each ``(kind, what, line)``, kind
    "class" (any trace), "symbolic" (a symbolic trace only) or "frame"."""
    found: list[tuple[str, str, int | None]] = []
    stack = [code]
    while stack:
        inner = stack.pop()
        stack += [c for c in inner.co_consts if issubclass(type(c), types.CodeType)]
        ops = instructions(inner)[0]
        for k, op in enumerate(ops):
            if op.opname == "MATCH_CLASS":
                found.append(("symbolic", "match ... case C()", op.lineno))
            elif op.opname in ("LOAD_ATTR", "LOAD_METHOD") and op.argval in ("f_back", "tb_frame"):
                found.append(("frame", f".{op.argval}, a caller's frame", op.lineno))
            elif op.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_CONST") and op.argval in _FAKE_ONLY:
                found.append(("class", f".{op.argval}, which only a traced tensor has", op.lineno))
            elif op.opname == "IS_OP" and k and ops[k - 1].opname == "LOAD_CONST" and \
                    type(ops[k - 1].argval) in (bool, int, float):
                found.append(("symbolic", f"is {ops[k - 1].argval!r}", op.lineno))  # (a SymBool is not True)
            elif op.opname in ("LOAD_ATTR", "LOAD_METHOD") and op.argval in ("__class__", "__dict__") and not (
                    k and ops[k - 1].opname == "LOAD_FAST" and ops[k - 1].argval in ("self", "cls")):
                # (``x.__dict__`` of a fake holds the tracer's entries too: ``vars``/``dir`` are
                # stand-ins, ``identity.VARS``)
                found.append(("class", f".{op.argval}", op.lineno))
    return tuple(dict.fromkeys(found))


def _stack_readers() -> frozenset[int]:
    import gc
    import inspect
    import traceback
    import weakref
    # (and who holds a value: the trace's own references and fakes are counted too)
    return frozenset(id(f) for f in (sys._getframe, inspect.currentframe, inspect.stack, inspect.getouterframes,
                                     inspect.trace, traceback.extract_stack, traceback.format_stack,
                                     traceback.print_stack, traceback.walk_stack, sys.getrefcount,
                                     gc.get_referrers, gc.get_referents, weakref.getweakrefcount, weakref.getweakrefs))


_STACK_READERS = _stack_readers()


def reads_stack(end: Any) -> bool:
    """Whether ``end`` (what the code calls) reads the interpreter's stack or who holds a
    value: while traced, the callers of the user's forward and backward are minihop's frames,
    not eager's ``apply``, and the trace holds references of its own."""
    return id(end) in _STACK_READERS


def numpy_value(end: Any) -> bool:
    """Whether ``end`` (what the code names) is numpy's: it takes a symbolic size for an object
    (``np.array([n]).dtype`` is ``object`` where eager's is ``int64``)."""
    module = end.__name__ if issubclass(type(end), types.ModuleType) else getattr(end, "__module__", None)
    return issubclass(type(module), str) and (module == "numpy" or module.startswith("numpy."))


def symbolic(args: tuple[Any, ...]) -> bool:
    """Whether a trace on ``args`` (fake) holds symbolic values: sizes, numbers."""
    return any(type(a) in _SYMBOLIC or issubclass(type(a), torch.Tensor) and any(type(d) in _SYMBOLIC for d in a.shape)
               for a in args)


def refuse_class_reads(function: str, phase: str, code: types.CodeType, args: tuple[Any, ...],
                       calls: str | None = None) -> None:
    """The code reads what a traced value answers unlike the caller's: a value's class
    (``x.__class__``: a fake tensor's is ``FakeTensor``, a symbolic size's ``torch.SymInt``;
    in a symbolic trace ``match n: case int():``, ``n > 4 is True``, and what it ``calls``:
    "singledispatch" or "numpy") or the frames of its callers and who holds a value
    (``f.f_back``; ``calls="stack"``: ``sys._getframe``, ``inspect.stack``,
    ``sys.getrefcount``: minihop's while traced). Refused (MH104): under the automatic policy a
    symbolic trace refused is captured static instead."""
    called = {"stack": ("frame", "sys._getframe, inspect.stack, sys.getrefcount or the like"),
              "numpy": ("symbolic", "numpy, which takes a symbolic size for an object"),
              "singledispatch": ("symbolic", "a singledispatch call")}
    found = [*([(*called[calls], None)] if calls else []), *_class_reads(code)]
    found = [(kind, what, line) for kind, what, line in found if kind != "symbolic" or symbolic(args)]
    if not found:
        return
    kind, what, line = found[0]
    where = f'File "{code.co_filename}"' + (f", line {line}" if line else "")
    at = f", line {line})." if line else ")."
    if kind == "frame":
        raise UnsupportedOperationError(
            f"{function}.{phase} reads the interpreter's view of its callers or of who holds a value ({what}{at}",
            "While it is traced, forward and backward are called by minihop's tracer, not by eager's "
            "Function.apply and autograd engine, and the trace holds references of its own: what "
            "these show is not eager's.",
            "Pass what it needs as an argument, or run it eagerly with minihop.function(F, fallback='eager').",
            where=where)
    raise UnsupportedOperationError(
        f"{function}.{phase} asks what kind of object a value is ({what}{at}",
        "A traced value is not the caller's kind of object: a tensor is a fake copy (its "
        "__class__ is FakeTensor), a size or number may be symbolic (torch.SymInt, where eager's "
        "is int). type() and isinstance() are answered as eager's; this read is not.",
        "Use type(x) or isinstance(x, ...), or run it eagerly with minihop.function(F, fallback='eager').",
        where=where)


def refuse_torch_io(function: str, phase: str, code: types.CodeType, line: int | None, fn: Any) -> None:
    """Where ``fn`` is one of torch's file or process readers and writers (``library.torch_io``:
    ``torch.load``, ``torch.save``, ``torch.from_file``), reads whether torch's modes are on
    or a tensor is fake (``library.reads_trace_modes``), or sets up autograd engine state no op
    holds (``library.autograd_state``: forward AD, saved-tensor hooks): refused (MH104)."""
    what = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    if reads_trace_modes(fn):
        named = f"{getattr(fn, '__module__', None) or ''}.{getattr(fn, '__name__', '')}".lstrip(".")
        raise UnsupportedOperationError(
            f"{function}.{phase} calls or names {named}, which tells whether torch's modes or a torch.func "
            f'transform are on, or a tensor is fake or wrapped (File "{code.co_filename}", line {line}).',
            "minihop traces under modes of its own (its recorder, FakeTensorMode), on fake tensors, outside "
            "any torch.func transform and under its own code watch (sys.gettrace): the code would read there "
            "what eager does not (has_torch_function((x,)) answers True; eager, False).",
            "Drop the check from the Function (eager answers it the same way on every call of plain tensors), "
            "or run it eagerly with minihop.function(F, fallback='eager').")
    if autograd_state(fn):
        raise UnsupportedOperationError(
            f"{function}.{phase} calls or names torch.autograd's {getattr(fn, '__module__', '')}.{what}, which sets up "
            f'or reads autograd engine state outside any op (File "{code.co_filename}", line {line}).',
            "A captured graph records tensor operations: a forward-AD level entered, saved-tensor hooks pushed or "
            "a version counter bumped while traced act on minihop's fake tensors once, and the graph's run "
            "would not enter the level (its dual ops then fail), run the hooks, or bump the caller's counter.",
            "Do it outside the Function, or run it eagerly with minihop.function(F, fallback='eager').")
    if not torch_io(fn):
        return
    raise UnsupportedOperationError(
        f"{function}.{phase} calls torch's {what}, which reads or writes files, processes or the profiler's "
        f'record (File "{code.co_filename}", line {line}).',
        "While it is traced, tensors are fake: what torch.load or from_file reads is data no trace "
        "holds, and a file torch.save writes (or a profiler range record_function opens) would be written "
        "once, never on the calls the graphs run.",
        "Load, save or profile outside the Function and pass the tensors in, or run it eagerly with "
        "minihop.function(F, fallback='eager').")
