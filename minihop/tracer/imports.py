"""Modules the user's code imports inside itself: a local name bound to a module is a root.

Place in the pipeline: tracer. ``chains.code_facts`` asks ``bindings`` which locals an import
binds (``import numpy as np``, ``from numpy import random as npr``, ``from numpy.random import
rand``, ``import numpy.random``, ``rng = importlib.import_module("random")``,
``rng = __import__("random")``, in the function or in code nested in it), and ``rebased``
turns each chain from such a local into a chain from the module (root kind "import"), so
``np.random.rand()`` after a local import is the chain a global ``np`` would give.
``roots.resolve_root`` asks ``module_root`` for its root: the module an import of that name
gets, ``sys.modules[name]``, read anew on every call. From there the same rules apply as to a
global naming the module: a process-wide generator's function is watched and its draw refused
(``hidden``), a user module's attributes are read places, which module the name holds is
guarded (``module_reads``).

Invariant: every chain from a local an import statement or an import call with a constant
name binds is among the code's facts, rebased on that module (a local bound by imports of
several modules: one chain per module; reading more only costs a guard).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys
from typing import Any, NamedTuple

from ..spec import MISSING, Root

__all__ = ["Binding", "bindings", "callee_value", "module_root", "rebased"]

_STORES = ("STORE_FAST", "STORE_DEREF")
_LOADS = {"LOAD_GLOBAL": "global", "LOAD_FAST": "fast", "LOAD_DEREF": "deref"}
# The function an import call calls: (root kind, root name, attribute steps to it).
Callee = tuple[str, str, tuple[tuple[str, Any], ...]]


class Binding(NamedTuple):
    """A local ``name`` bound to ``module`` (as written: leading dots for a relative import),
    then ``steps`` (the attributes ``from`` takes); ``callee`` is the function an import call
    calls (``importlib.import_module``), or None for an import statement."""

    name: str
    module: str
    steps: tuple[tuple[str, Any], ...]
    callee: Callee | None
    line: int | None


def bindings(ins: tuple[Any, ...], first_line: int | None) -> list[Binding]:
    """The locals the instructions ``ins`` bind by an import statement or an import call."""
    found: list[Binding] = []
    line = first_line
    for k, op in enumerate(ins):
        if op.lineno is not None:
            line = op.lineno
        if op.opname == "IMPORT_NAME" and k >= 2:
            found += _statement(ins, k, line)
        elif op.opname == "LOAD_CONST" and issubclass(type(op.argval), str) and k + 3 < len(ins) \
                and ins[k + 1].opname == "PRECALL" and ins[k + 1].arg == 1 and ins[k + 2].opname == "CALL" \
                and ins[k + 2].arg == 1 and ins[k + 3].opname in _STORES:
            callee = _callee(ins, k)
            if callee is not None:
                found.append(Binding(str(ins[k + 3].argval), op.argval, (), callee, line))
    return found


def _statement(ins: tuple[Any, ...], k: int, line: int | None) -> list[Binding]:
    """``LOAD_CONST level; LOAD_CONST fromlist; IMPORT_NAME m`` at ``k - 2``, then what it
    stores: the top package (``import a.b``), the module (``from m import ...``), or
    attributes taken with ``IMPORT_FROM`` (``import a.b as c`` takes ``b`` of ``a``)."""
    level, fromlist = ins[k - 2].argval, ins[k - 1].argval
    if not issubclass(type(level), int):
        return []
    name = "." * level + str(ins[k].argval)
    module = name if fromlist is not None or level else name.split(".")[0]
    steps: tuple[tuple[str, Any], ...] = ()
    pushed: tuple[tuple[str, Any], ...] | None = None
    found: list[Binding] = []
    m = k + 1
    while m < len(ins):
        op = ins[m]
        if op.opname == "IMPORT_FROM":
            pushed = (*steps, ("attr", op.argval))
        elif op.opname in _STORES:
            found.append(Binding(str(op.argval), module, steps if pushed is None else pushed, None, line))
            if pushed is None:
                break  # the module itself stored: the statement is done
            pushed = None
        elif op.opname == "SWAP" and op.arg == 2 and pushed is not None and m + 1 < len(ins) \
                and ins[m + 1].opname == "POP_TOP":
            steps, pushed = pushed, None  # ``import a.b.c as d``: now taking from ``a.b``
            m += 1
        else:
            break
        m += 1
    return found


def _callee(ins: tuple[Any, ...], k: int) -> Callee | None:
    """The function called with the constant at ``k``: ``name`` or ``name.attr``."""
    before = ins[k - 1] if k >= 1 else None
    if before is not None and before.opname in _LOADS:
        return (_LOADS[before.opname], str(before.argval), ())
    if before is not None and before.opname in ("LOAD_METHOD", "LOAD_ATTR") and k >= 2 \
            and ins[k - 2].opname in _LOADS:
        return (_LOADS[ins[k - 2].opname], str(ins[k - 2].argval), (("attr", before.argval),))
    return None


def rebased(chain: Any, found: dict[str, list[Binding]], cellvars: tuple[str, ...]) -> list[Any]:
    """``chain`` from a local an import binds, as chains from each module bound there (its
    ``root_kind`` "import"); any other chain as it is. A closure variable of code nested in
    this one is this code's local (``cellvars``)."""
    if not (chain.root_kind == "fast" or chain.root_kind == "deref" and chain.root in cellvars):
        return [chain]
    bound = found.get(chain.root)
    if not bound:
        return [chain]
    return [chain.__class__(**{**vars(chain), "root_kind": "import", "root": b.module,
                               "steps": (*b.steps, *chain.steps), "callee": _callee_rebased(b.callee, found)})
            for b in bound]


def _callee_rebased(callee: Callee | None, found: dict[str, list[Binding]]) -> Callee | None:
    """An import call through a local an import statement bound (``import importlib as il``;
    ``il.import_module("x")``): the callee from that module."""
    if callee is None or callee[0] != "fast":
        return callee
    bound = [b for b in found.get(callee[1], ()) if b.callee is None]
    if len(bound) != 1:
        return callee  # not one module: unresolved (a local), not an import
    return ("import", bound[0].module, (*bound[0].steps, *callee[2]))


def callee_value(fn: Any, callee: Callee) -> Any:
    """The function an import call calls, as ``fn``'s code finds it now (MISSING: unknown)."""
    kind, name, steps = callee
    if kind == "global":
        g = fn.__globals__
        value = g[name] if name in g else getattr(builtins, name, MISSING)
    elif kind == "import":
        resolved = _absolute(fn, name)
        value = MISSING if resolved is None else sys.modules.get(resolved, MISSING)
    elif kind == "deref" and name in fn.__code__.co_freevars:
        try:
            value = fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents
        except ValueError:
            value = MISSING
    else:
        return MISSING
    for _, attr in steps:
        value = getattr(value, attr, MISSING)
    return value


def module_root(fn: Any, chain: Any) -> Root | None:
    """The root of an import chain: the module ``sys.modules`` holds under the name imported,
    read anew on every call. None where the import call is not one (a user's function) or
    the name does not resolve (a relative import outside a package)."""
    name: str | None = chain.root
    if chain.callee is not None:
        called = callee_value(fn, chain.callee)
        if called is builtins.__import__:
            name = chain.root.split(".")[0]  # ``__import__("a.b")`` returns ``a``
        elif called is not importlib.import_module or chain.root.startswith("."):
            return None
    else:
        name = _absolute(fn, chain.root)
    if name is None:
        return None
    text = f"sys.modules[{name!r}]"
    return Root("value", text, text, lambda args, n=name: sys.modules.get(n, MISSING))


def _absolute(fn: Any, name: str) -> str | None:
    """``name`` as an import in ``fn``'s module resolves it (``.helpers`` in a package)."""
    if not name.startswith("."):
        return name
    g = getattr(fn, "__globals__", {})
    package = g.get("__package__") or None
    try:
        return importlib.util.resolve_name(name, package) if package else None
    except (ImportError, ValueError):
        return None
