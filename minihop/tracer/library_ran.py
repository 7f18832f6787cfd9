"""Library code the traced call ran, and the names it resolved: read places like the user's.

Place in the pipeline: tracer, made by ``pystate.StateTracker``, fed by ``call_watch.CallWatch``
(installed where the code reaches an object whose methods run more code: a module, a user
object, a library's Python function or class), read by ``StateTracker.finish``. The user's code is analysed for what it reads; a
library's code is not followed (its state is not the user's). Yet what it computed depends on
which function each of its names was bound to when it ran, and anyone may rebind one after a
capture:
``nn.Linear.forward = lora_forward``, ``nn.Conv1d._conv_forward = ...``, ``F.gelu = fast_gelu``
under ``nn.GELU``; and on which constants of its own it read, which anyone may set
(``Distribution.set_default_validate_args``, ``register_kl``). So, for each library function
the call ran (reached from the user's code through library calls: not torch's tracing
machinery, which eager never runs, nor a collection's callback), these reads:

- its home, the class or module defining it, and its name there (``Linear.forward``): the
  capture holds while that name holds that very function;
- each library module's function its code names (``F.gelu`` in ``GELU.forward``), as a chain
  in the user's code is read (``module_reads``);
- each constant of its module (a flag) or of a class, read by the class's name or as
  ``self.x``/``cls.x`` in its method (``Distribution._validate_args``), by value; and torch's
  own containers so read (the KL registry), entry by entry (``library_state.Entries``).

The first two are in the one record of names holding modules and library functions
(``runtime.module_reads``): one ``is`` each per call; the others are value reads.

Invariant: only code that ran is read (a branch not taken reads nothing, as eager's would not),
in each phase that ran it (backward's reads are checked again when backward runs).
"""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

from ..library_state import Entries
from ..spec import MISSING, Place, Root
from .chains import code_facts
from .module_reads import library_binding
from .roots import global_place, place_at

__all__ = ["LibraryRan"]

# torch's tracing machinery: a mode's handler runs for each op on a fake tensor, and library
# code hands its own ops to it (``handle_torch_function``) where a real tensor would not. Neither
# it nor what it calls is the call's own code.
_MACHINERY = frozenset({"__torch_function__", "__torch_dispatch__"})
_MACHINERY_MODULES = ("torch.overrides", "torch._subclasses", "torch.utils._python_dispatch", "torch._dynamo",
                      "torch.fx", "torch._ops", "torch._library", "minihop")


class LibraryRan:
    """The library code objects that ran, per phase, each with its globals."""

    def __init__(self) -> None:
        # (code, phase) -> (its globals, where it is defined)
        self.ran: dict[tuple[types.CodeType, str], tuple[dict[str, Any], str]] = {}

    def note(self, frame: Any, phase: str) -> bool:
        """A library frame starts, called by the user's code or by library code kept: whether it
        is kept (the call's own code, not torch's tracing machinery)."""
        code = frame.f_code
        name = frame.f_globals.get("__name__") or ""
        if code.co_name in _MACHINERY or name.startswith(_MACHINERY_MODULES) \
                or any(getattr(c, "__code__", None) is code for c in gc.callbacks):
            return False  # (a collection's callback, hypothesis's: run by whatever allocated, not called)
        self.ran.setdefault((code, phase), (frame.f_globals, f'File "{code.co_filename}", line {code.co_firstlineno}'))
        return True

    def reads(self) -> list[tuple[Place, str, str]]:
        """``(place, phase, where)`` for each home and each module name the code that ran read."""
        return [(place, phase, where) for (code, phase), (g, where) in self.ran.items()
                for place in _places(code, g)]


# Per library code object, the places it reads (the same for every capture that runs it).
_PLACES: dict[types.CodeType, tuple[Place, ...]] = {}


def _places(code: types.CodeType, g: dict[str, Any]) -> tuple[Place, ...]:
    found = _PLACES.get(code)
    if found is not None:
        return found
    owner = _owner(code, g)
    places = _homes(code, g, owner)
    first = code.co_varnames[0] if code.co_argcount else None
    for chain in code_facts(code).chains:
        value = g.get(chain.root, MISSING) if chain.root_kind == "global" else MISSING
        described = f"{g.get('__name__')}:{chain.root}"
        if issubclass(type(value), types.ModuleType):
            steps = chain.steps if chain.method is None else (*chain.steps, ("attr", chain.method))
            root = global_place(g, chain.root, described).root  # (its global)
            places += [p for p in library_binding(root, value, steps, 0) if _stored(value, p.steps)]
        elif type(value) in _CONSTANT and not chain.steps:
            places.append(global_place(g, chain.root, described))  # a module's flag
        elif _registry(value, g.get("__name__")) and not chain.steps:
            places.append(_entries_place(global_place(g, chain.root, described)))  # torch's registry
        elif chain.steps[:1] and chain.steps[0][0] == "attr":
            # ``Distribution._validate_args`` read as ``self._validate_args`` in its method, or
            # through the class's global name
            cls = value if issubclass(type(value), type) else \
                owner if chain.root_kind == "fast" and chain.root == first else None
            held = _class_held(cls, chain.steps[0][1]) if issubclass(type(cls), type) else MISSING
            if type(held) in _CONSTANT:
                places.append(place_at(_class_root(cls), chain.steps[:1]))
            elif held is not MISSING and _registry(held, cls.__module__):  # (``Normal.arg_constraints``)
                places.append(_entries_place(place_at(_class_root(cls), chain.steps[:1])))
    _PLACES[code] = found = tuple(places)
    return found


def _stored(module: types.ModuleType, steps: tuple[tuple[str, Any], ...]) -> bool:
    """Whether each name along ``steps`` is stored in its module: one a module computes on each
    read (``torch._VF.dropout``, its ``__getattr__``) binds nothing anyone could rebind there."""
    current: Any = module
    for _, name in steps:
        if issubclass(type(current), types.ModuleType) and name not in vars(current):
            return False
        current = getattr(current, name, None)
    return True


def _owner(code: types.CodeType, g: dict[str, Any]) -> Any:
    """The module or class whose namespace defines the function of ``code`` by its qualified
    name (``Linear`` for ``Linear.forward``), or None (a nested or generated function's)."""
    module = sys.modules.get(g.get("__name__") or "")
    parts = code.co_qualname.split(".")
    if module is None or any(p.startswith("<") for p in parts):
        return None
    holder: Any = module
    for part in parts[:-1]:
        holder = vars(holder).get(part) if issubclass(type(holder), (type, types.ModuleType)) else None
        if not issubclass(type(holder), type):
            return None
    return holder


def _class_root(cls: type) -> Root:
    owner = f"{cls.__module__}:{cls.__qualname__}"
    # (``home``: the class itself, read directly by the record's generated check)
    return Root("value", owner, owner, lambda args, h=cls: h, home=cls)


# A library's own constants its code reads (a module's flag; a class's default that its methods
# read as ``self._validate_args``, set by ``Distribution.set_default_validate_args``): anyone may
# set one between calls, and what the code computed depends on it. Guarded by value (torch's
# containers entry by entry: ``_registry``; other libraries' are their caches, not guarded).
_CONSTANT = (bool, int, float, str, bytes, complex, type(None))


def _class_held(cls: type, name: Any) -> Any:
    """What ``cls`` (a library class) holds as ``name``, itself or by a base (no descriptor run)."""
    for k in cls.__mro__:
        held = vars(k)
        if name in held:
            return held[name]
    return MISSING


# torch's own containers its code reads (``torch.distributions.kl._KL_REGISTRY``, which
# ``register_kl`` fills; ``Normal.arg_constraints``): guarded entry by entry, by identity
# (``library_state.Entries``). Other libraries' are their caches (``linecache.cache``,
# ``sys.modules``), changed by any call: not guarded (reads.md's open items).
def _registry(value: Any, module: Any) -> bool:
    return type(value) in (dict, list, set) and len(value) <= 1024 and issubclass(type(module), str) \
        and module.split(".")[0] == "torch"


def _entries_place(place: Place) -> Place:
    return Place(place.root, place.steps, lambda args, f=place.get: Entries(f(args)))


def _homes(code: types.CodeType, g: dict[str, Any], holder: Any) -> list[Place]:
    """The places of the function whose code ``code`` is, where its module defines it
    (``torch.nn.modules.linear:Linear.forward``), under each name that holds it there
    (``Module.__call__`` is ``Module._wrapped_call_impl``: ``m(x)`` looks up the first); none
    for a nested or generated function."""
    if holder is None:
        return []
    name = code.co_qualname.rsplit(".", 1)[-1]
    found = vars(holder).get(name)
    if not issubclass(type(found), types.FunctionType) or found.__code__ is not code:
        return []  # (a staticmethod, a property, a decorated function: its wrapper ran too)
    module = g.get("__name__")
    owner = module if issubclass(type(holder), types.ModuleType) else f"{module}:{code.co_qualname.rsplit('.', 1)[0]}"
    # (``home``: the holder itself, read directly by the record's generated check)
    root = Root("value", owner, owner, lambda args, h=holder: h, home=holder)
    names = [name, *(n for n, v in vars(holder).items() if v is found and n != name and n.isidentifier())]
    return [place_at(root, (("attr", n),)) for n in names]
