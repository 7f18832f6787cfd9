"""The user's bytecode, read once per code object.

Place in the pipeline: tracer. ``names.result_use`` (how a call's result is stored) and
``chains.code_facts`` (what a function reads and writes) both walk a code object's
instructions; ``instructions`` decodes them once and remembers them per code object.

Invariant: for every instruction, ``opname``, ``arg``, ``argval`` and ``offset`` are what
``dis.get_instructions`` gives (caches hidden), ``lineno`` is its ``positions.lineno``, and
``argrepr`` is dis's for names, constants, locals, comparisons and ``BINARY_OP`` (``+=``),
the only ones minihop reads. ``dis`` builds more (jump labels, line starts, a position
record and a nine-field record per instruction): about three times the cost, which was a
tenth of capturing a long Function the first time.
"""

from __future__ import annotations

import dis
import functools
import sys
from types import CodeType
from typing import Any, NamedTuple

from ..errors import UnsupportedOperationError

__all__ = ["Instruction", "instructions", "SUPPORTED_PYTHON", "check_python"]

# The Python versions whose bytecode the analysis (this module, ``chains``, ``names``,
# ``pystate``) is written and tested for: 3.12 and 3.13 renamed and removed instructions it
# reads (PRECALL, LOAD_METHOD, POP_JUMP_FORWARD_IF_*) and dis internals, so reads it no longer
# recognised would go unguarded, silently. setup.cfg's python_requires says the same.
SUPPORTED_PYTHON = ((3, 11),)


def check_python() -> None:
    """Refuse to run on a Python whose bytecode the analysis was not written for."""
    found = tuple(sys.version_info[:2])
    if found not in SUPPORTED_PYTHON:
        raise UnsupportedOperationError(
            f"minihop runs on Python {', '.join('.'.join(map(str, v)) for v in SUPPORTED_PYTHON)}; "
            f"this is Python {'.'.join(map(str, found))}.",
            "minihop reads the bytecode of a Function's forward and backward to guard the "
            "Python state they use; other versions' bytecode differs, and a read it did not "
            "recognise would go unguarded (a silently stale capture).",
            "Use Python 3.11, or run the Function eagerly (F.apply).")


check_python()  # at import, before the dis internals below (other versions lack some)


class Instruction(NamedTuple):
    """One instruction: the fields of ``dis.Instruction`` minihop reads."""

    opname: str
    arg: int | None
    argval: Any
    argrepr: str
    offset: int
    lineno: int | None


_OPNAME = dis._all_opname  # type: ignore[attr-defined]  # specialised ops by name, as dis
_DEOPT = tuple(dis._deoptop(op) for op in range(256))  # type: ignore[attr-defined]
_CACHES = tuple(dis._inline_cache_entries[_DEOPT[op]] for op in range(256))  # type: ignore[attr-defined]
_CONST = frozenset(dis.hasconst)
_NAME = frozenset(dis.hasname)
_LOCAL = frozenset(dis.haslocal) | frozenset(dis.hasfree)
_COMPARE = frozenset(dis.hascompare)
_JABS = frozenset(dis.hasjabs)
_JREL = frozenset(dis.hasjrel)
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_BINARY_OP = dis.opmap["BINARY_OP"]
_FORMAT_VALUE = dis.opmap["FORMAT_VALUE"]
_EXTENDED_ARG = dis.EXTENDED_ARG
_INT_OVERFLOW = 2 ** 31


@functools.lru_cache(maxsize=1024)
def instructions(code: CodeType) -> tuple[tuple[Instruction, ...], dict[int, int]]:
    """``code``'s instructions and offset -> index among them (``dis._unpack_opargs``'s walk)."""
    raw = code.co_code
    names, consts, local = code.co_names, code.co_consts, code._varname_from_oparg  # type: ignore[attr-defined]
    lines = [p[0] for p in code.co_positions()]  # one per code unit, caches included
    found: list[Instruction] = []
    extended = 0
    caches = 0
    for offset in range(0, len(raw), 2):
        if caches:
            caches -= 1
            continue
        op = raw[offset]
        deop = _DEOPT[op]
        caches = _CACHES[op]
        arg: int | None = None
        argval: Any = None
        argrepr = ""
        if deop >= dis.HAVE_ARGUMENT:
            arg = raw[offset + 1] | extended
            extended = (arg << 8) if deop == _EXTENDED_ARG else 0
            if extended >= _INT_OVERFLOW:
                extended -= 2 * _INT_OVERFLOW
            argval = arg
            if deop in _CONST:
                argval, argrepr = dis._get_const_info(deop, arg, consts)  # type: ignore[attr-defined]
            elif deop in _NAME:
                if deop == _LOAD_GLOBAL:
                    argval = argrepr = names[arg >> 1]
                    if arg & 1:
                        argrepr = "NULL + " + argrepr
                else:
                    argval = argrepr = names[arg]
            elif deop in _JABS:
                argval = arg * 2
            elif deop in _JREL:
                argval = offset + 2 + (-arg if dis._is_backward_jump(deop) else arg) * 2  # type: ignore[attr-defined]
            elif deop in _LOCAL:
                argval = argrepr = local(arg)
            elif deop in _COMPARE:
                argval = argrepr = dis.cmp_op[arg]
            elif deop == _FORMAT_VALUE:
                argval = (dis.FORMAT_VALUE_CONVERTERS[arg & 0x3][0], bool(arg & 0x4))  # type: ignore[attr-defined]
            elif deop == _BINARY_OP:
                argrepr = dis._nb_ops[arg][1]  # type: ignore[attr-defined]
        else:
            extended = 0
        found.append(Instruction(_OPNAME[op], arg, argval, argrepr, offset, lines[offset // 2]))
    result = tuple(found)
    return result, {ins.offset: i for i, ins in enumerate(result)}
