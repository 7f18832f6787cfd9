"""What code reads and writes, by name: chains of loads in its bytecode.

Place in the pipeline: tracer, read by ``pystate`` (which resolves each chain to the Python
state it names, guards its reads and watches its writes). ``code_facts(code)`` decodes a code
object once (``bytecode.instructions``) into the chains of attribute loads and constant
subscripts that start at a global, a closure variable or a parameter (``CFG.scale``,
``LOG.append``, ``F.calls += 1``), the names it stores to, and the parameters that escape into
other code; code nested in it (comprehensions, generator expressions, lambdas, inner ``def``s)
counts as its own. Facts are names only, no values, so they are cached per code object.

Invariant: a chain a function's code runs is among its facts (reading more than the code will
read only costs a guard; reading less would be a stale answer).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any

from .bytecode import Instruction, instructions
from .imports import Callee, bindings, rebased

__all__ = ["STATE_DEPENDENT_CALLS", "Chain", "CodeFacts", "code_facts", "constant_global"]

# Instructions that start a chain of attribute reads, and what they read from.
_ROOTS = {"LOAD_GLOBAL": "global", "LOAD_DEREF": "deref", "LOAD_FAST": "fast",
          "LOAD_NAME": "global", "LOAD_CLASSDEREF": "deref"}
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "add",
                       "discard", "setdefault", "popitem", "appendleft", "extendleft", "sort",
                       "reverse", "__setitem__", "__delitem__", "__iadd__"})
# Of those, the ones whose effect depends on what the container holds (``heap.changes`` sees only
# what the traced call's did, nothing where it did nothing): their receiver is a read.
STATE_DEPENDENT_CALLS = _MUTATORS - {"append", "extend", "appendleft", "extendleft", "add", "update", "insert",
                                     "__setitem__", "__iadd__"}

@dataclasses.dataclass(frozen=True)
class Chain:
    """``root.step.step...`` as the code reads it (``steps`` are ("attr", name) or
    ("item", constant)); ``use`` is how the code uses the value at its end."""

    root_kind: str  # "global", "deref", "fast", or "import" (``root``: a module's name, see imports)
    root: str
    steps: tuple[tuple[str, Any], ...]
    use: str  # "value", "receiver" (of a store or a mutating call), "increment" (of +=)
    line: int | None
    method: str | None = None  # the method called on the chain's value (``np.random.rand()``)
    callee: Callee | None = None  # "import": the import function called (``importlib.import_module``)
    # Read by a function or generator the code defines (a lambda, an inner def): it may run
    # later, kept on ctx and called by backward (``ctx.fn = lambda g: g * CFG.s``).
    deferred: bool = False
    # Its value is not called where it is loaded (``ctx.fn = helper``, ``partial(helper)``): a
    # function so handed on may run later, when backward calls it.
    handed: bool = False


@dataclasses.dataclass(frozen=True)
class CodeFacts:
    """What one code object reads and writes, by name (no values: cached per code object)."""

    chains: tuple[Chain, ...]
    stores: tuple[tuple[str, int | None], ...]  # (attribute or name written, line)
    escaping: frozenset[str]  # locals used other than as the root of a chain (passed on)
    reassigned: frozenset[str]  # locals assigned in the code (not the caller's values)
    targets: tuple[Chain, ...] = ()  # ``root.a.b = ...``: the attributes stored, as chains


def _is_inplace(ins: Instruction) -> bool:
    return ins.opname == "BINARY_OP" and ins.argrepr.endswith("=") and ins.argrepr not in ("==", "!=", "<=", ">=")


_INLINE = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})


@functools.lru_cache(maxsize=2048)
def code_facts(code: types.CodeType) -> CodeFacts:
    """Read ``code``'s bytecode for chains of loads, stores and escaping locals."""
    ins = instructions(code)[0]
    chains: list[Chain] = []
    targets: list[Chain] = []
    stores: list[tuple[str, int | None]] = []
    escaping: set[str] = set()
    reassigned = {i.argval for i in ins if i.opname in ("STORE_FAST", "DELETE_FAST")}
    line: int | None = code.co_firstlineno
    i = 0
    while i < len(ins):
        op = ins[i]
        if op.lineno is not None:
            line = op.lineno
        if op.opname in ("STORE_ATTR", "STORE_GLOBAL", "STORE_DEREF", "DELETE_ATTR", "DELETE_GLOBAL"):
            stores.append((str(op.argval), line))
        if op.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") or \
                op.opname in ("STORE_DEREF", "DELETE_DEREF") and op.argval in code.co_freevars:
            # A global or closure variable the code rebinds is a root of the heap watch whether
            # or not the code reads it (``global G; G = y``, ``nonlocal cache; cache = y``): the
            # receiver of a store, watched, not a read.
            chains.append(Chain("global" if op.opname.endswith("GLOBAL") else "deref", str(op.argval), (),
                                "receiver", line))
        kind = _ROOTS.get(op.opname)
        if kind is None:
            i += 1
            continue
        root = str(op.argval)
        if op.opname == "LOAD_GLOBAL" and root == "globals" and constant_global(ins, i + 1):
            # ``globals()["SCALE"]``: a read of that global, as ``SCALE`` is.
            chains.append(Chain("global", str(ins[i + 3].argval), (), "value", line))
            i += 5
            continue
        steps: list[tuple[str, Any]] = []
        j = i + 1
        use = "value"
        method = None
        while j < len(ins):
            nxt = ins[j]
            if nxt.opname == "LOAD_ATTR":
                steps.append(("attr", nxt.argval))
                j += 1
            elif nxt.opname == "LOAD_METHOD":
                use = "receiver" if nxt.argval in _MUTATORS else "value"
                method = str(nxt.argval)
                if use == "receiver":  # ``LOG.append(...)``: a write to the container
                    stores.append((str(steps[-1][1]) if steps else root, line))
                j += 1
                break
            elif (nxt.opname == "LOAD_CONST" and j + 3 < len(ins) and ins[j + 1].opname == "COPY"
                  and ins[j + 2].opname == "COPY" and ins[j + 3].opname == "BINARY_SUBSCR"
                  and issubclass(type(nxt.argval), (int, str))):
                # ``root[k] += expr``: LOAD_CONST k; COPY 2; COPY 2; BINARY_SUBSCR; <expr>;
                # BINARY_OP +=; SWAP 3; SWAP 2; STORE_SUBSCR
                end = _subscript_augmented_end(ins, j + 4)
                if end is not None:
                    chains.append(Chain(kind, root, tuple(steps), "receiver", line))
                    chains.append(Chain(kind, root, (*steps, ("item", nxt.argval)),
                                        "increment" if ins[end - 4].argrepr in ("+=", "-=") else "value", line))
                    stores.append((str(nxt.argval), line))
                    use = "done"
                break
            elif (nxt.opname == "LOAD_CONST" and j + 1 < len(ins) and ins[j + 1].opname == "BINARY_SUBSCR"
                  and issubclass(type(nxt.argval), (int, str, bool, type(None), tuple))):
                steps.append(("item", nxt.argval))
                j += 2
            elif nxt.opname == "COPY" and nxt.arg == 1 and j + 1 < len(ins) and ins[j + 1].opname == "LOAD_ATTR":
                # ``root.a += expr``: COPY 1; LOAD_ATTR a; <expr>; BINARY_OP +=; SWAP 2; STORE_ATTR a
                attr = ins[j + 1].argval
                end = _augmented_end(ins, j + 2, attr)
                if end is not None:
                    chains.append(Chain(kind, root, tuple(steps), "receiver", line))
                    chains.append(Chain(kind, root, (*steps, ("attr", attr)),
                                        "increment" if ins[end - 3].argrepr in ("+=", "-=") else "value", line))
                    steps = []
                    use = "done"
                break
            elif (nxt.opname == "LOAD_CONST" and j + 1 < len(ins)
                  and ins[j + 1].opname in ("STORE_SUBSCR", "DELETE_SUBSCR")):
                stores.append((str(nxt.argval), line))  # ``root[k] = v``: the user's own store of k
                break
            elif nxt.opname in ("STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR"):
                use = "receiver"
                if nxt.opname == "STORE_ATTR":
                    targets.append(Chain(kind, root, (*steps, ("attr", nxt.argval)), "store", line))
                break
            else:
                break
        if kind in ("global", "deref") and not steps and use == "value" and j < len(ins):
            # ``N += k`` on a global (or nonlocal): LOAD_GLOBAL N; <expr>; BINARY_OP +=; STORE_GLOBAL N
            end = _global_increment_end(ins, j, root, "STORE_GLOBAL" if kind == "global" else "STORE_DEREF")
            if end is not None:
                use = "increment"
        if use != "done":
            if kind == "fast" and not steps and use == "value":
                escaping.add(root)
            # (3.11: a call loads NULL first: ``LOAD_GLOBAL (NULL + f)``, ``PUSH_NULL``, or a
            # method's ``LOAD_METHOD``)
            called = method is not None or (not steps and (op.opname == "LOAD_GLOBAL" and bool(op.arg & 1)
                                                          or i and ins[i - 1].opname == "PUSH_NULL"))
            chains.append(Chain(kind, root, tuple(steps), use, line, method, handed=use == "value" and not called))
        i = j if j > i + 1 else i + 1
    # A local an import binds (``import numpy as np`` in forward) holds that module: its chains
    # are the module's, as a global's would be (imports.py), and so is the import's own read.
    imported: dict[str, list[Any]] = {}
    for b in bindings(ins, code.co_firstlineno):
        imported.setdefault(b.name, []).append(b)
        chains.append(Chain("import", b.module, b.steps, "value", b.line, None, b.callee))
    chains = [c for chain in chains for c in rebased(chain, imported, code.co_cellvars)] if imported else chains
    # A chain from a local that is not a parameter reads what the code itself made.
    params = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    chains = [c for c in chains if c.root_kind != "fast" or c.root in params]
    # A parameter an inner function or comprehension captures escapes into it.
    escaping |= params & set(code.co_cellvars)
    # Code nested in this one (a generator expression, a comprehension, a lambda, an inner
    # def) runs as part of it: what it reads of globals and closures is read here too. Its
    # own parameters and locals are not the Function's, so its chains from those are left out.
    for const in code.co_consts:
        if issubclass(type(const), types.CodeType):
            inner = code_facts(const)
            later = const.co_name not in _INLINE  # (a comprehension runs where it is written)
            chains += [dataclasses.replace(r, deferred=True) if later and not r.deferred else r
                       for c in inner.chains if c.root_kind != "fast"
                       for r in (rebased(c, imported, code.co_cellvars) if imported else (c,))]
            stores += inner.stores
            targets += [t for t in inner.targets if t.root_kind != "fast"]
    return CodeFacts(tuple(chains), tuple(stores), frozenset(escaping), frozenset(reassigned),
                     tuple(targets))


def constant_global(ins: tuple[Instruction, ...], k: int) -> bool:
    """``PRECALL 0; CALL 0; LOAD_CONST name; BINARY_SUBSCR`` at ``k``: ``globals()[name]``."""
    return (k + 3 < len(ins) and ins[k].opname == "PRECALL" and ins[k + 1].opname == "CALL"
            and ins[k + 1].arg == 0 and ins[k + 2].opname == "LOAD_CONST"
            and issubclass(type(ins[k + 2].argval), str) and ins[k + 3].opname == "BINARY_SUBSCR")


def _augmented_end(ins: tuple[Instruction, ...], start: int, attr: str) -> int | None:
    """The index after ``SWAP 2; STORE_ATTR attr`` closing an augmented assignment."""
    for k in range(start, min(len(ins) - 2, start + 40)):
        if _is_inplace(ins[k]) and ins[k + 1].opname == "SWAP" and ins[k + 2].opname == "STORE_ATTR" \
                and ins[k + 2].argval == attr:
            return k + 3
        if ins[k].opname in ("RETURN_VALUE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE"):
            return None
    return None


def _subscript_augmented_end(ins: tuple[Instruction, ...], start: int) -> int | None:
    """The index after ``SWAP 3; SWAP 2; STORE_SUBSCR`` closing ``root[k] op= expr``."""
    for k in range(start, min(len(ins) - 3, start + 40)):
        if _is_inplace(ins[k]) and ins[k + 1].opname == "SWAP" and ins[k + 1].arg == 3 \
                and ins[k + 2].opname == "SWAP" and ins[k + 3].opname == "STORE_SUBSCR":
            return k + 4
        if ins[k].opname in ("RETURN_VALUE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE"):
            return None
    return None


def _global_increment_end(ins: tuple[Instruction, ...], start: int, name: str, store: str) -> int | None:
    for k in range(start, min(len(ins) - 1, start + 40)):
        if _is_inplace(ins[k]) and ins[k].argrepr in ("+=", "-=") and ins[k + 1].opname == store \
                and ins[k + 1].argval == name:
            return k + 2
        if ins[k].opname in ("RETURN_VALUE", "STORE_FAST", "POP_TOP"):
            return None
    return None
