"""The user's ``try``/``except`` around an op, and refusals the user's code caught.

Place in the pipeline: tracer, asked by ``recorder.RecordingMode`` for each op it records and
by ``session.Tracing.run`` when a phase of the user's code returns.

- **An op inside ``try: ... except RuntimeError:``** (or ``except Exception``, a bare
  ``except``, ``except torch.linalg.LinAlgError``): eager's op may raise for some values
  (``cholesky`` of a matrix that is not positive definite, ``inv`` of a singular one,
  ``multinomial`` of negative weights, ``_assert_async``) and the handler then takes another
  path; a fake tensor has no values, so the trace never raises there and the capture would
  run the ``try`` path on every call, raising where eager recovers. Refused (MH104) where the
  handler may catch what torch raises: any class but a few Python ones torch never raises for
  data (``SAFE``); and inside a ``with`` block whose manager may swallow the exception
  (``contextlib.suppress``, a user class whose ``__exit__`` may return true, a
  ``@contextmanager`` with an ``except`` around its ``yield``). A ``try``/``finally``, torch's
  managers (``no_grad``, ``autocast``), locks and managers that return None catch nothing.
- **A refusal the user's code caught**: minihop refuses from inside the user's code (an op
  that cannot be traced, a tensor's text, the refusal above); an ``except`` there would swallow
  it and the trace would go on down the handler's path. Each refusal raised into the user's
  code is noted (``note``); one noted when the phase returns normally is raised then.

Invariant: what the user's code runs between its method's frame and the op is read from the
live frames (the exception table of each, 3.11's); library frames are passed through.
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import functools
import inspect
import sys
import threading
import types
from typing import Any

from ..errors import MinihopError, UnsupportedOperationError
from . import operators
from .frames import TORCH_DIR, is_library_code

__all__ = ["SAFE", "caught", "note", "refuse_op_in_handler", "start"]

# Exception classes torch does not raise for a tensor's values: a handler catching only these
# cannot take another path than the trace for data the trace did not see.
SAFE = frozenset({"KeyError", "AttributeError", "ImportError", "ModuleNotFoundError", "NameError",
                  "UnboundLocalError", "StopIteration", "StopAsyncIteration", "TypeError", "ZeroDivisionError"})

_state = threading.local()
_OPERATORS = operators.__file__


@functools.lru_cache(maxsize=1024)
def _guarded(code: types.CodeType) -> tuple[tuple[int, int, str], ...]:
    """``(start, end, what)`` for each range of ``code`` an ``except`` handler may catch
    torch's errors in (``what``: the classes it names, or "a bare except")."""
    ins = {i.offset: i for i in dis.get_instructions(code)}
    order = sorted(ins)
    found, managers = [], {}
    for entry in dis.Bytecode(code).exception_entries:
        what = _catches(ins, order, entry.target)
        if what == "with":  # (its manager's ``__exit__`` may swallow: judged when it runs)
            # (a with body split around an inner block has more ranges: the first names it)
            what = managers.setdefault(entry.target, "with " + ".".join(_manager_path(ins, order, entry.start)))
        if what is not None:
            found.append((entry.start, entry.end, what))
    return tuple(found)


def _manager_path(ins: dict[int, Any], order: list[int], start: int) -> list[str]:
    """The names a ``with`` statement's manager expression starts with (``torch.no_grad``,
    ``contextlib.suppress``, ``self.lock``): the loads after the statement's start, up to the
    ``BEFORE_WITH`` just before ``start``."""
    k = order.index(start) - 1 if start in ins else -1
    if k < 0 or ins[order[k]].opname != "BEFORE_WITH":
        return []
    j = k - 1
    while j > 0 and ins[order[j]].starts_line is None and ins[order[j - 1]].opname not in ("BEFORE_WITH", "POP_TOP",
                                                                                          "STORE_FAST", "STORE_NAME"):
        j -= 1
    path: list[str] = []
    for op in (ins[order[i]] for i in range(j, k)):
        if not path and op.opname in ("LOAD_GLOBAL", "LOAD_FAST", "LOAD_DEREF", "LOAD_NAME"):
            path.append(str(op.argval))
        elif path and op.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            path.append(str(op.argval))
        elif path:
            break
    return path


def _catches(ins: dict[int, Any], order: list[int], target: int) -> str | None:
    """What the handler at ``target`` catches that torch may raise, or None (a ``with``
    block's exit, a ``finally``, a cleanup, or only ``SAFE`` classes)."""
    first = ins.get(target)
    if first is None or first.opname != "PUSH_EXC_INFO":
        return None  # (a cleanup handler: it re-raises)
    k = order.index(target) + 1
    names: list[str] = []
    while k < len(order):
        op = ins[order[k]]
        if op.opname == "WITH_EXCEPT_START":
            return "with"
        if op.opname == "RERAISE":
            return None  # (a finally, or no clause left)
        if op.opname == "POP_TOP" and not names:
            return "a bare except"
        if op.opname == "CHECK_EG_MATCH":
            return "an except* clause"
        if op.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_DEREF", "LOAD_FAST"):
            names.append(str(op.argval))
        elif op.opname == "CHECK_EXC_MATCH":
            if not set(names) <= SAFE:
                return "except " + ", ".join(n for n in names if n not in SAFE)
            jump = ins[order[k + 1]] if k + 1 < len(order) else None
            if jump is None or not jump.opname.startswith("POP_JUMP") or jump.argval not in ins:
                return None
            k, names = order.index(jump.argval), []  # the next clause (or the re-raise)
            continue
        k += 1
    return None


def refuse_op_in_handler(function: str, stop: types.CodeType) -> None:
    """The op being recorded runs inside a ``try`` whose ``except`` may catch torch's errors,
    in the user's code between the method's frame (``stop``'s caller: the tracer's ``run``)
    and the op: refused (MH104)."""
    frames, frame = [], sys._getframe(2)
    while frame is not None and frame.f_code is not stop:
        frames.append(frame)
        frame = frame.f_back
    if frame is None:
        return  # (an op minihop records outside the user's method: no user frame to read)
    for frame in frames:
        code = frame.f_code
        if not is_library_code(code.co_filename) and not code.co_filename.startswith("<frozen"):
            for start, end, what in _guarded(code):
                if start <= frame.f_lasti < end and not (what.startswith("with") and _passes_through(frame, what)):
                    where = f'File "{code.co_filename}", line {frame.f_lineno}'
                    raise UnsupportedOperationError(
                        f"{function} runs an op inside " + (f"a {what} block, whose manager may swallow the "
                                                            "exception" if what.startswith("with") else
                                                            f"a try whose handler catches {what}") + f" ({where}).",
                        "Eager's op may raise for some values (a matrix that is not positive definite, "
                        "a singular one, invalid weights) and the handler then takes another path; the "
                        "trace runs on fake tensors, which have no values and never raise there, so "
                        "the capture would always take the try path.",
                        "Test the condition explicitly (torch.linalg.cholesky_ex's info, a mask), "
                        "or run it eagerly with minihop.function(F, fallback='eager').", where=where)


_PASSING_MODULES = ("torch", "minihop", "threading", "_thread", "warnings")


def _passes_through(frame: Any, what: str) -> bool:
    """Whether the manager of a ``with`` block (``what``: "with " and the names its expression
    starts with) lets exceptions through: torch's (``no_grad``, ``autocast``), a lock, a
    user class whose ``__exit__`` returns only None, a ``contextlib.contextmanager`` whose
    generator catches nothing. Unknown (``contextlib.suppress``, a method's result): no."""
    names = what[len("with "):].split(".") if what != "with " else []
    if not names:
        return False
    scope = {**frame.f_globals, **frame.f_locals}
    value = scope.get(names[0], getattr(builtins, names[0], None))
    try:
        for name in names[1:]:
            value = inspect.getattr_static(value, name)
    except AttributeError:
        return False
    value = getattr(value, "__func__", value)  # (a staticmethod found statically)
    if value is contextlib.nullcontext:
        return True
    owner = value if issubclass(type(value), (type, types.FunctionType)) else type(value)
    module = getattr(value, "__module__", None) or getattr(owner, "__module__", None) or ""
    if module.split(".")[0] in _PASSING_MODULES:
        return True
    wrapped = getattr(value, "__wrapped__", None)
    if issubclass(type(value), types.FunctionType) and issubclass(type(wrapped), types.FunctionType) \
            and wrapped.__code__.co_flags & inspect.CO_GENERATOR:
        return not _guarded(wrapped.__code__)  # (``@contextmanager``: no except around its yield)
    exit_ = getattr(owner, "__exit__", None) if issubclass(type(owner), type) else None
    return issubclass(type(exit_), types.FunctionType) and _returns_none(exit_.__code__)


def _returns_none(code: types.CodeType) -> bool:
    """Whether every ``return`` of ``code`` returns the constant None or False (an
    ``__exit__`` that never swallows the exception)."""
    ops = list(dis.get_instructions(code))
    return all(k and ops[k - 1].opname == "LOAD_CONST" and ops[k - 1].argval in (None, False)
               for k, op in enumerate(ops) if op.opname == "RETURN_VALUE")


def start() -> None:
    """A phase of the user's code starts: no refusal noted yet."""
    _state.noted = []


def note(error: MinihopError, frame: Any = None) -> MinihopError:
    """A refusal raised into the user's code (``frame``: the user's frame it is raised in; by
    default the caller of the torch call raising it): noted where that is the user's code
    (torch's frames between are passed through; minihop's own calls catch what they expect).
    Returned, to be raised."""
    noted = getattr(_state, "noted", None)
    if noted is None:
        return error
    frame = frame or sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(TORCH_DIR)
                                 or frame.f_code.co_filename == _OPERATORS):  # (``x * 2``'s slot)
        frame = frame.f_back
    if frame is not None and not is_library_code(frame.f_code.co_filename):
        noted.append(error)
    return error


def caught() -> MinihopError | None:
    """The first refusal raised into the user's code in this phase, which the user's code
    then caught (the phase returned normally); and the notes are cleared."""
    noted, _state.noted = getattr(_state, "noted", None), None
    return noted[0] if noted else None
