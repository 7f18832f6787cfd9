"""Names that hold modules, and user modules' attributes, read by the user's code: guarded too.

Place in the pipeline: tracer, asked by ``pystate.StateTracker`` for each chain its code reads.
``MATHLIB.cos(p)``, ``F.relu(x)``, ``m.sqrt(v)`` (``import math as m``), ``Cfg.lib.cos(p)``: what
such a chain computes depends on which module the name holds, and a program can rebind it
(``MATHLIB = Shim``, ``globals()["m"] = shim``, ``Cfg.lib = shim``). What the module itself
holds is a library's state when it is a library's (torch, math: not followed), and the user's
state when it is the user's own module (a ``types.ModuleType`` it built, its own file): then the
attribute the code reads or calls there is a read like any other (``usermod.scale_fn(p)``).

So each chain yields ``StateRead`` places (``places_held``): every place of the user's state
(a global, a closure cell, an attribute of the user's object or class or module) that holds a
module, whose value the runtime compares by identity (``runtime.module_reads``: one check for
all of a capture's module-holding names), and the attribute of a user module the chain reads
last. Module arguments are keyed by identity with the call (``runtime.guards``), so a chain
from an argument yields only what it reads inside a user module.

Invariant: no chain through a name that holds a module at capture is left without the
identity of that module guarded, unless the name is an argument (in the call key).
"""

from __future__ import annotations

import builtins
import dataclasses
import sys
import types
import warnings
from typing import Any

import torch

from ..errors import SideEffectError
from ..spec import MISSING, Place, Root
from .heap import LIBRARY_MODULE
from ..library_state import library_object
from .library import is_library, is_user_module, module_data
from .roots import global_place, guarded_value, place_at, walk
from .userattr import UserAttribute

__all__ = ["ThroughLibrary", "builtin_places", "library_binding", "note_through_library", "places_held", "through_library"]


def places_held(root: Root, value: Any, steps: tuple[tuple[str, Any], ...]) -> list[Place]:
    """Places along ``root`` (its value ``value``), then ``steps`` (the chain's attributes and
    items, and the method it calls), that hold a module or that are a user module's attribute
    read last: each is guarded like any read place."""
    found: list[Place] = []
    if issubclass(type(value), types.ModuleType) and not root.uses_args:
        found.append(place_at(root, ()))  # MATHLIB, F, m: which module the name holds
    if not steps and is_user_module(value):
        # The user's module read whole (``getattr(cfg, "debug", False)``, passed to a helper):
        # its data attributes, keyed together (a name added or rebound is another value).
        found.append(Place(Root("value", f"module {value.__name__}", f"the attributes of module {value.__name__}",
                                lambda args, m=value: module_data(m)), ()))
    current = value
    for k, step in enumerate(steps):
        if issubclass(type(current), types.ModuleType) and is_library(current):
            # Below a library module its state is not the user's, but which function or
            # constant a name of it is bound to can be rebound by anyone (``F.gelu =
            # fast_gelu``, ``torch.tanh = ...``): the binding the chain ends on is read.
            found += library_binding(root, current, steps, k, user=True)
            break
        if current is MISSING or issubclass(type(current), UserAttribute):
            break
        following = walk(current, (step,))
        in_user_module = issubclass(type(current), types.ModuleType)
        holds_module = issubclass(type(following), types.ModuleType)
        if (holds_module and (in_user_module or not root.uses_args)) or (in_user_module and k == len(steps) - 1):
            # Cfg.lib, usermod.sub (an identity), usermod.scale_fn (the value read there);
            # an argument's own attributes are in the call key (but for a module's, keyed by identity).
            found.append(place_at(root, steps[:k + 1]))
        current = following
    return found


# What a library module's name is bound to that a capture keys by (identity for a function,
# a class or a C callable; value for a constant): a module's other objects (a file, a
# mapping: ``sys.stdout``, ``os.environ``) are watched or refused as what they hold.
_BOUND = (types.FunctionType, types.BuiltinFunctionType, type, int, float, bool, str, complex,
          type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
# ... and, read by the user's code, a plain container anyone may change in place (``"--debug"
# in sys.argv``, ``sys.path``), by value (not ``sys.modules``: ``through_library``'s).
_CONTAINERS = (list, tuple, set, frozenset, dict)


def library_binding(root: Root, module: types.ModuleType, steps: tuple[tuple[str, Any], ...],
                     k: int, user: bool = False) -> list[Place]:
    """The place of the name the chain reads last below library ``module`` (at ``steps[k]``),
    through library submodules (``torch.nn.functional.gelu``), where it is bound to a
    function or a constant: its identity or value is what the capture computed with. Read by
    the ``user``'s code, also a plain container there (``sys.argv``) and a value read through
    the library's objects (``logging.root.level``, ``torch.backends.cuda.matmul.allow_tf32``)."""
    current = module
    for j in range(k, len(steps)):
        if steps[j][0] != "attr":
            return []
        following = walk(current, (steps[j],))
        if issubclass(type(following), types.ModuleType):
            if not is_library(following):
                return []  # the user's module under a library's: ``_through_library``
            current = following
            continue
        bound = issubclass(type(following), _BOUND) or type(following).__name__ in _C_CALLABLES or \
            user and type(following) in _CONTAINERS and following is not sys.modules
        if not bound and user and j + 1 < len(steps) and following is not MISSING and not callable(following):
            current = following  # (an object of the library's: what the chain reads of it)
            continue
        return [place_at(root, steps[:j + 1])] if bound else []
    return []


# torch's own callables that are neither functions nor classes (``torch._C._VariableFunctions``' ops
# are builtins; these wrap them).
_C_CALLABLES = frozenset({"OpOverloadPacket", "OpOverload", "method_descriptor", "builtin_function_or_method"})


_BUILTINS = Root("value", "builtins", "builtins", lambda args: builtins, home=builtins)


def builtin_places(g: dict[str, Any], name: str) -> list[Place]:
    """A builtin the code names (``len``, ``max``): which object the name finds depends on the
    code's globals not defining it (``len = my_len`` after a capture) and on ``builtins``
    (``builtins.max = ...``). Both are read, in the record of names by identity."""
    return [global_place(g, name, name), place_at(_BUILTINS, (("attr", name),))]


@dataclasses.dataclass(frozen=True)
class ThroughLibrary:
    """What a chain from a library module reaches of the user's modules (``through_library``)."""

    root: Root | None = None  # the user's module, found again through the chain on each call
    held: Any = None  # (its value now)
    counter: str | None = None  # ``sys.modules["cfg"].n += 1``: the counter ``n``
    read: Place | None = None  # what the chain reads below it (``.S[0]``)
    computed: bool = False  # ``sys.modules`` read whole (``sys.modules[__name__]``): unknown
    unseen: str | None = None  # a library module written whose attributes are not its namespace


def _attributes_run_code(module: Any) -> bool:
    """A library module of its library's own ``ModuleType`` subclass whose attribute writes run
    that class's code (its own ``__setattr__``, a property): torch's config modules keep their
    values in a dict of their own, ``torch.utils.deterministic`` in C. A write there changes
    nothing in the namespace the heap watch compares, and nothing minihop can put back."""
    for klass in type(module).__mro__:
        if klass is types.ModuleType:
            return False
        if "__setattr__" in vars(klass) or any(hasattr(type(v), "__set__") for v in vars(klass).values()):
            return True
    return False


def through_library(root: Root, value: Any, chain: Any) -> ThroughLibrary:
    """A chain from a library module that reaches the user's module (``sys.modules["cfg"]``):
    that module is a root of its own, watched as its globals are, and what the chain reads
    below it is a read place. ``sys.modules`` itself taken as a value is indexed by a computed
    name (``sys.modules[__name__].S``): any module's state, which no place bounds."""
    steps = chain.steps
    computed = value is sys and steps == (("attr", "modules"),) and chain.use == "value" and chain.method is None
    for k in range(1, len(steps)):
        try:
            held = walk(value, steps[:k])
        except Exception:
            break
        if is_user_module(held):
            name = place_at(root, steps[:k]).description
            found = Root("value", name, name, lambda args, v=value, s=steps[:k]: walk(v, s))
            rest = steps[k:]
            if chain.use == "increment" and len(rest) == 1 and rest[0][0] == "attr":
                return ThroughLibrary(found, held, counter=rest[0][1])
            read = rest and chain.use == "value" and guarded_value(walk(held, rest))
            return ThroughLibrary(found, held, read=place_at(found, rest) if read else None)
    if chain.use in ("receiver", "increment") or chain.handed:
        # A library module's own namespace the code writes (``sys.n += 1``,
        # ``torch.nn.functional.k = v``) or hands to a call (``setattr(sys, "k", v)``): its
        # names are watched (not what they hold; see heap.LIBRARY_MODULE).
        owner_steps = steps if chain.use != "increment" else steps[:-1]
        try:
            owner = walk(value, owner_steps) if owner_steps else value
        except Exception:
            owner = None
        if issubclass(type(owner), types.ModuleType) and not is_user_module(owner) and _attributes_run_code(owner):
            return ThroughLibrary(unseen=place_at(root, owner_steps).description)
        if issubclass(type(owner), types.ModuleType) and not is_user_module(owner) or \
                issubclass(type(owner), type) and is_library(owner):  # (or a library class's: ``json.JSONEncoder.x = v``)
            name = place_at(root, owner_steps).description  # (an increment there is refused too: no counter)
            return ThroughLibrary(Root("value", LIBRARY_MODULE, name, lambda args, m=owner: m), owner)
    held = walk(value, steps) if steps and all(kind == "attr" for kind, _ in steps) else None
    if issubclass(type(held), (list, dict, set)) and not any(held is p for p in (sys.modules, sys.path, warnings.filters)) \
            or (chain.method is not None or chain.use == "receiver") and library_object(held) \
            and not issubclass(type(held), (types.ModuleType, type)) and (type(held).__module__ or "").split(".")[0] != "torch":
        # A plain container a library module holds (``sys.argv.append(s)``), or an object of a
        # library's whose method the code calls there (``sys.stderr.write(s)`` where the caller
        # put an ``io.StringIO``: a file is refused, ``iterators``): the heap watch's, as the
        # user's own containers are (sys.path and warnings' filters: process settings).
        name = place_at(root, steps).description
        return ThroughLibrary(Root("value", name, name, lambda args, v=value, s=steps: walk(v, s)), held)
    return ThroughLibrary(computed=computed)


def note_through_library(tracker: Any, root: Root, value: Any, chain: Any, phases: tuple[str, ...], seen: set[str],
                         code: Any) -> None:
    """A chain from a library module that reaches the user's module, recorded in ``tracker``
    (a ``pystate.StateTracker``): a root of its own (``through_library``), its counter or its
    read place; or an unknown read."""
    found, phase = through_library(root, value, chain), phases[0]
    where = f'(File "{code.co_filename}", line {chain.line})'
    if found.computed:
        tracker.opaque.unknown(phase, f"{phase} reads sys.modules by a computed name, any module's state {where}")
    if found.unseen is not None:
        raise SideEffectError(
            f"{tracker.name}.{phase} writes an attribute of {found.unseen}, a library module whose attributes are "
            f"kept by its own code (a __setattr__ or properties of its class), not in its namespace {where}.",
            "minihop watches a library module's namespace for writes; this one's state lives elsewhere (a config "
            "dict, torch's C settings), so the write would be made once, while tracing, and never on the calls the "
            "graphs run, nor put back.",
            "Set it outside the Function, or run it eagerly with minihop.function(F, fallback='eager').")
    if found.root is None:
        return
    if found.root.description not in seen:
        seen.add(found.root.description)
        tracker.roots.append((found.root, found.held))
    if found.counter is not None:
        tracker.increments.add((phase, found.counter, found.counter))  # (as the heap names a module's global)
    if found.read is not None:
        tracker._add_read(found.read, phases, code, chain.line)
