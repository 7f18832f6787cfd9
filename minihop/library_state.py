"""What a library object holds, for the heap watch: so that a change to it is seen, never guessed.

Shared by the tracer's heap watch (``tracer.holders.contents_of``: what changed while tracing) and
the runtime's guards (``runtime.guards.value_key``: what changed between calls), so that both
see the same state of an object of a library class (the standard library's, torch's, a
package's) that is not a plain holder of the user's values.
Such an object keeps state minihop does not model (a ``queue.Queue``'s deque and counters, an
``io.StringIO``'s buffer, a distribution's lazily cached tensors), and user code changes it by
calling its methods (``Q.put(t)``, ``BUF.write(s)``). Unknown means unsafe: ``state_of`` takes
everything the object shows of itself — its attributes and what it hands ``pickle``
(``__reduce_ex__``: the C-level state of ``StringIO``, ``array``) — and the heap watch refuses
any change to it (``heap.RULES``: "a library object's own state changed"), putting it back first
(``put_back``), so a trace leaves it as it found it and ``fallback="eager"`` runs once.

What is left out (``kept_by_library``): ``logging``'s objects, whose caches change as messages
are sent (messages are minihop's to replay or refuse: ``messages.MessageWatch``). An object
``pickle`` cannot reduce shows nothing of its state (``unseen``: a file, a ``SimpleQueue``):
code reaching one is refused before tracing (``tracer.iterators``).

Place in the pipeline: the shared layer (beside ``structure``), imported by the tracer and the
runtime, which never import each other. Also here, as both need them: which modules are a
library's (``library_module``), the identity box keys hold objects in (``Same``), what of an
``nn.Module`` and of a tensor is the user's state (``module_attributes``, ``tensor_attributes``)
and how an attribute is written back past a user's ``__setattr__`` (``set_attr``, ``del_attr``).

Invariant: two states compare equal only if every attribute is the same object and every
value the object hands ``pickle`` is equal (floats by their bits, other objects by identity).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import operator
import random
import struct
import sys
import sysconfig
import threading
import types
import weakref
from collections.abc import MutableMapping, MutableSequence, MutableSet
from typing import Any

__all__ = ["Entries", "LIBRARY_PACKAGES", "float_bits", "STATE", "LibraryState", "global_module_hooks", "kept_by_library", "library_module", "library_object",
           "module_attributes", "plain_holder", "set_attr", "del_attr", "tensor_attributes", "torch_tensor_entries", "put_back", "Same", "state_of", "unseen",
           "READ_ONLY_VIEWS", "c_method_owner", "ITEMS_IN_DATA", "minihops", "native_state", "own_attr", "own_dict", "subclass_attributes", "view_items"]

# Which code is a library's (torch, the standard library, minihop, installed packages, the
# test runner), by a module's name and where its file is installed: its module state is not
# the user's, and its objects keep state of their own.
LIBRARY_PACKAGES = frozenset({"torch", "minihop", "numpy", "sympy", "typing_extensions",
                              "functorch", "builtins", "_pytest", "pytest", "pluggy",
                              *sys.stdlib_module_names})
_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})

STATE = "<its own state>"  # the key of what ``__reduce_ex__`` shows, beside the attributes


def float_bits(value: float) -> str:
    """A float as keys and the heap watch compare it: its ``hex`` (-0.0 is not 0.0), a NaN's by
    its IEEE bits (``hex`` writes every NaN as "nan"; code reads its sign and payload back)."""
    text = float.hex(value)
    return text if text != "nan" else struct.pack("<d", value).hex()


@functools.lru_cache(maxsize=1)
def _module_bookkeeping() -> frozenset[str]:
    import torch
    return frozenset(k for k in vars(torch.nn.Module()) if k.startswith("_"))


def module_attributes(module: Any) -> dict[str, Any]:
    """An ``nn.Module``'s own attributes: its ``__dict__`` less nn.Module's bookkeeping (the
    parameter, buffer, submodule and hook dicts). What its code reads of itself is all of the
    rest, a leading underscore or not (``training``, ``eps``, the user's ``self._calls``)."""
    skip = _module_bookkeeping()
    return {k: v for k, v in vars(module).items() if k not in skip and not k.startswith("_minihop")}


def global_module_hooks() -> tuple[tuple[int, ...], ...]:
    """The hooks registered for every module (``register_module_forward_pre_hook``,
    ``register_module_forward_hook``), by their handles' ids (never reused, where a function's
    id may be): any module's call runs them, one the code builds inside forward too."""
    import torch
    hooks = torch.nn.modules.module
    return tuple(hooks._global_forward_pre_hooks), tuple(hooks._global_forward_hooks)


@functools.lru_cache(maxsize=1)
def torch_tensor_entries() -> frozenset[str]:
    """The ``__dict__`` entries torch itself gives a tensor, real or fake (a fake's mode, its
    memos): never the user's attributes, and keying them would walk the whole mode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.empty(0))
        made = fake.new_empty(1)
    return frozenset(vars(fake)) | frozenset(vars(made)) | frozenset(vars(torch.empty(0)))


def tensor_attributes(t: Any) -> dict[str, Any]:
    """The attributes user code set on tensor ``t`` (``x.scale = 2.0``, ``out._soft = soft``)."""
    found = t.__dict__
    if not found:
        return {}
    internal = torch_tensor_entries()
    return {k: v for k, v in found.items() if k not in internal and not k.startswith("__")}


@functools.lru_cache(maxsize=4096)
def library_module(name: str) -> bool:
    top = name.split(".")[0]
    if top in LIBRARY_PACKAGES:
        return True
    module = sys.modules.get(top)
    file = getattr(module, "__file__", None) or ""
    return bool(file) and file.startswith(_INSTALLED)


def plain_holder(value: Any) -> bool:
    """A library object that only holds the user's values as attributes (``SimpleNamespace``,
    ``argparse.Namespace``, ``threading.local``): watched like the user's own objects. Other
    library objects keep their own bookkeeping (a logger's cache), which is not the user's."""
    return issubclass(type(value), (types.SimpleNamespace, threading.local)) or \
        (type(value).__module__ == "argparse" and type(value).__name__ == "Namespace")


def library_object(value: Any) -> bool:
    """An object of a library class whose state is its own: watched and keyed by ``state_of``
    (minihop's own values, such as a symbolic size's marker, are keyed where they are made)."""
    module = type(value).__module__
    return issubclass(type(module), str) and library_module(module) and module.split(".")[0] != "minihop" \
        and not plain_holder(value) and not kept_by_library(value)


# Read-only views of a dict: what code reads through one is that dict's items now.
READ_ONLY_VIEWS = (types.MappingProxyType, type({}.keys()), type({}.values()), type({}.items()))

# Library objects pickle cannot reduce that still hold no state a call leaves behind: a lock
# (released by the ``with`` that took it), a weak reference, a read-only view.
_NO_STATE_LEFT = (type(threading.Lock()), type(threading.RLock()), weakref.ref, *READ_ONLY_VIEWS)


# Builtin classes whose objects a key and the heap watch see whole (as values, items or
# attributes): a user subclass of one keeps no state past those.
# (``threading.local`` and ``SimpleNamespace`` hold only attributes: ``plain_holder``)
_SEEN_WHOLE = (object, int, float, complex, str, bytes, bytearray, tuple, list, dict, set, frozenset,
               threading.local, types.SimpleNamespace)
_NATIVE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
_VALUES = (str, bytes, int, float, complex, tuple, list, dict, set, frozenset)
_BUILTIN_VALUES = frozenset({*_VALUES, bool, type(None)})


def subclass_attributes(value: Any) -> dict[str, Any] | None:
    """The ``__dict__`` of a user's subclass of a builtin value or container (``class
    Knob(float)``, ``class Pair(tuple)``, ``class Stack(list)``, ``class Ring(deque)``,
    ``class Cfg(UserDict)``) or of an enum's member, when it holds something the user set:
    attributes its value, items or pairs do not show (``k.extra``), keyed and watched beside
    them."""
    cls = type(value)
    if issubclass(type(value), enum.Enum):
        # An enum's member holds its own entries (``_value_``, ``_name_``): what the user set on
        # it besides (``Mode.A.scale = 2.0``) is state like an object's.
        own = own_dict(value) or {}
        return own if any(not (k.startswith("_") and k.endswith("_")) for k in own) else None
    if cls in _BUILTIN_VALUES or not issubclass(type(value), _ITEMS) or library_module(cls.__module__ or ""):
        return None
    own = own_dict(value)
    return own if issubclass(type(own), dict) and own else None


# Values keyed and watched by their value or items (``array``, ``deque``, ``UserDict`` too):
# a user's subclass of one keeps its own attributes beside them.
_ITEMS = (*_VALUES, MutableSequence, MutableMapping, MutableSet)
# ... where the items themselves are an attribute (``.data``): watched as attributes instead.
ITEMS_IN_DATA = (collections.UserDict, collections.UserList, collections.UserString)


def native_state(cls: type) -> bool:
    """Whether objects of the user's class ``cls`` keep state in a library class written in C
    (``class Buf(io.BytesIO)``, a ctypes ``Structure`` or array, an ``Exception``): state their
    attributes do not show, as a library object's. Keyed and watched as one (``state_of``: what
    they hand ``pickle``); refused where pickle cannot show it (``unseen``)."""
    found = _NATIVE.get(cls)
    if found is None:
        found = _NATIVE[cls] = any(_in_c(b) for b in cls.__mro__ if b not in _SEEN_WHOLE)
    return found


def _in_c(cls: type) -> bool:
    if not cls.__flags__ & (1 << 9):  # not a heap type: a static C type
        return True
    module = sys.modules.get(cls.__module__ or "")
    file = getattr(module, "__file__", None)
    # (a C extension module's class, ``_random.Random``: its module is no Python file)
    return library_module(cls.__module__ or "") and not (issubclass(type(file), str) and file.endswith(".py"))


def view_items(view: Any) -> tuple[tuple[Any, Any], ...]:
    """The items of the dict behind a read-only view (``MappingProxyType(d)``, ``d.keys()``)."""
    mapping = view if issubclass(type(view), types.MappingProxyType) else view.mapping
    return tuple(mapping.items())


def minihops(value: Any) -> bool:
    """A value of minihop's own on a user's class or object (``minihop.function(F)``, the
    ``apply`` ``@minihop.captured`` puts on a class): not the user's state."""
    # (by the classes' own dicts: a user's ``__getattr__`` must not run)
    if issubclass(type(value), staticmethod):
        value = value.__func__
    cls = type(value.__self__) if issubclass(type(value), types.MethodType) else type(value)
    return any(own_dict(k).get("_minihop_own") is True for k in cls.__mro__)


def c_method_owner(method: Any) -> Any:
    """The object a C method is bound to and computes with (``d.get``'s ``d``,
    ``dq.popleft``'s ``dq``, ``w.mul``'s ``w``), or None: a module's function (``math.sin``),
    a class's (``dict.fromkeys``), a random generator's draw (``random.random``: its stream
    is modelled on its own, ``tracer.hidden``)."""
    if not issubclass(type(method), types.BuiltinMethodType):
        return None
    owner = method.__self__
    if owner is None or issubclass(type(owner), (types.ModuleType, type, random.Random)) or \
            (type(owner).__module__ or "").startswith("numpy"):
        return None
    return owner


def unseen(value: Any) -> bool:
    """A library object whose state minihop can neither see nor put back (an open file,
    ``sys.stdout``, a ``queue.SimpleQueue``, a database connection): pickle cannot reduce it.
    Code that reaches one is refused before it is traced (``tracer.iterators``): what the trace
    did to it would stay done, once, where eager does it on every call. torch's own objects
    (streams, process groups) are minihop's to model, and are not."""
    if _forwarding_proxy(value):
        return True
    if callable(value) or issubclass(type(value), (type, types.ModuleType, _NO_STATE_LEFT)) or \
            not (library_object(value) or native_state(type(value))):
        return False
    if (type(value).__module__ or "").split(".")[0] == "torch" or any(
            k.__name__ == "TensorBase" and k.__module__ == "torch._C" for k in type(value).__mro__):
        return False  # (a tensor subclass too: its pickling would run its own code)
    try:
        value.__reduce_ex__(4)
    except Exception:
        return True
    return False


def _forwarding_proxy(value: Any) -> bool:
    """A proxy whose class answers ``__wrapped__`` (``wrapt.ObjectProxy``, a lazy object): it
    hands out what it wraps as its own (its ``__dict__`` is the wrapped object's) and keeps its
    own state where it cannot be seen nor put back. Asked of its class only: a proxy's own
    properties are code of its author, never run here."""
    return not issubclass(type(value), type) and any("__wrapped__" in vars(k) for k in type(value).__mro__[:-1])


def kept_by_library(value: Any) -> bool:
    """Objects whose changes are not the user's state: ``logging``'s (a logger's level cache)."""
    return (type(value).__module__ or "").split(".")[0] == "logging"


@dataclasses.dataclass(frozen=True, eq=False)
class LibraryState:
    """What ``__reduce_ex__`` showed (``raw``, to put back) and its frozen form (compared)."""

    frozen: Any
    raw: Any

    def __eq__(self, other: object) -> bool:
        return issubclass(type(other), LibraryState) and self.frozen == other.frozen

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "its own state"


class Entries:
    """What a library's container holds, as one value compared by identity, entry by entry
    (``torch.distributions.kl._KL_REGISTRY``: a ``register_kl`` between calls is seen). Its key
    is itself (``runtime.guards.value_key``): keying 87 entries value by value cost 0.8 ms a call."""

    __slots__ = ("parts",)

    def __init__(self, held: Any) -> None:
        # (a dict's keys and values apart: each compared by ``map(operator.is_)``, in C)
        self.parts = (tuple(dict.keys(held)), tuple(dict.values(held))) if issubclass(type(held), dict) else \
            (tuple(held),) if issubclass(type(held), (list, set, frozenset)) else ((held,),)

    def __eq__(self, other: object) -> bool:
        return issubclass(type(other), Entries) and len(self.parts) == len(other.parts) and all(
            len(a) == len(b) and all(map(operator.is_, a, b)) for a, b in zip(self.parts, other.parts))

    def __hash__(self) -> int:
        return len(self.parts[0])

    def __repr__(self) -> str:
        return f"<{len(self.parts[0])} entries>"


class _KeyRef(weakref.ref):
    """A key's weak reference: minihop's own (not one ``tracer.death_code`` counts as the user's)."""
    __slots__ = ()


class Same:
    """An object a key or a frozen state holds, equal only to that very object (never by
    ``==``: a tensor's is elementwise). Shared with ``runtime.function_keys``.

    Held weakly where its type takes weak references: a key must not keep the caller's object
    alive after the caller lets go (eager frees it then, running its ``__del__``); dead, it equals none."""

    __slots__ = ("_ref", "_strong", "_id")

    def __init__(self, obj: Any) -> None:
        self._id = id(obj)
        weak = type(obj).__weakrefoffset__ != 0
        self._ref, self._strong = (_KeyRef(obj), None) if weak else (None, obj)

    @property
    def obj(self) -> Any:  # (None once a weakly held one died)
        return self._strong if self._ref is None else self._ref()

    def __eq__(self, other: object) -> bool:
        if not issubclass(type(other), Same) or other._id != self._id:
            return False
        if self._ref is None or other._ref is None:
            return self._ref is None and other._ref is None and self._strong is other._strong
        return (mine := self._ref()) is not None and mine is other._ref()

    def __hash__(self) -> int:
        return self._id

    def __repr__(self) -> str:
        alive = self.obj is not None or self._ref is None
        return f"<{type(self.obj).__name__ if alive else 'dead object'} at {self._id:#x}>"


_OWN_DICT = ("the object's attributes",)  # stands for its __dict__, compared as attributes


def _frozen(value: Any, own: Any, depth: int = 0) -> Any:
    if value is own and own is not None:
        return _OWN_DICT
    if issubclass(type(value), float):
        return ("float", float_bits(value))  # -0.0 and 0.0 differ; a NaN equals itself
    if value is None or issubclass(type(value), (bool, int, str, bytes, complex)):
        return (type(value), value)
    if depth < 4 and issubclass(type(value), (tuple, list)):
        return (type(value), tuple(_frozen(v, own, depth + 1) for v in value))
    if depth < 4 and type(value) is dict:
        return (dict, tuple((_frozen(k, own, depth + 1), _frozen(v, own, depth + 1)) for k, v in value.items()))
    return Same(value)


def state_of(value: Any) -> dict[str, Any]:
    """``value``'s attributes (dunders left out) and, under ``STATE``, what ``__reduce_ex__``
    shows beyond them; an object pickle cannot reduce shows its attributes only."""
    own = own_dict(value)
    found = {k: v for k, v in own.items() if not (k.startswith("__") and k.endswith("__"))} \
        if issubclass(type(own), dict) else {}
    try:
        reduced = value.__reduce_ex__(4)
    except Exception:  # a lock, a C object of a package: its attributes are what can be seen
        return found
    if issubclass(type(reduced), tuple) and len(reduced) >= 2:
        raw = reduced[1:3]
        found[STATE] = LibraryState(_frozen(raw, own), raw)
    return found


def put_back(value: Any, state: LibraryState) -> None:
    """Give ``value`` the state ``state`` showed again, where its class can take it."""
    setstate = getattr(value, "__setstate__", None)
    if not callable(setstate):
        return
    held = state.raw[1] if len(state.raw) == 2 else None
    if held is not None and held is not own_dict(value):
        setstate(held)
    elif len(state.raw) == 1 and issubclass(type(state.raw[0]), tuple) and len(state.raw[0]) == 2 \
            and state.raw[0][0] is type(value) and issubclass(type(state.raw[0][1]), tuple):
        # (``_unpickle(cls, state)``'s protocol, ctypes' objects': ``__setstate__(*state)``)
        setstate(*state.raw[0][1])


def _answers_in_python(cls: type) -> bool:
    """Whether reading an attribute of a ``cls`` object may run Python code: its class's (or
    metaclass's) own ``__getattribute__`` or ``__getattr__``. Other lookups are C's (a bound
    method's forwards to its function, as Python's own ``getattr`` does)."""
    return type(getattr(cls, "__getattribute__", None)) is types.FunctionType or hasattr(cls, "__getattr__")


def own_dict(value: Any) -> dict[str, Any] | None:
    """``value``'s instance dict (a class's or module's namespace), or None if it has none:
    past a ``__getattribute__``/``__getattr__`` of the user's, read as ``object.__getattribute__``
    reads it (``getattr(value, "__dict__")`` would run it, and count, log or answer what it likes)."""
    try:
        found = object.__getattribute__(value, "__dict__") if _answers_in_python(type(value)) \
            else getattr(value, "__dict__")
    except (AttributeError, TypeError):
        return None
    return found if issubclass(type(found), (dict, types.MappingProxyType)) else None


def own_attr(value: Any, name: str, default: Any = None) -> Any:
    """``getattr(value, name, default)`` for what Python itself keeps of an object (a class's
    or function's ``__module__``, ``__qualname__``, ``__mro__``), past a ``__getattribute__`` of
    the user's class or metaclass and past a ``__getattr__`` (which runs for a name an object
    lacks): read as ``object.__getattribute__`` reads it where one of those would run."""
    if not _answers_in_python(type(value)):
        return getattr(value, name, default)
    try:
        return object.__getattribute__(value, name)
    except AttributeError:
        return default


def set_attr(obj: Any, name: str, value: Any) -> None:
    """Set what a watched object holds as ``name``, putting it back: ``object.__setattr__``
    past a user's own ``__setattr__``; a thread-local's needs its own; a module's parameter or
    buffer lives in its own dict (``holders.contents_of``)."""
    held = _module_slot(obj, name)
    if held is not None:
        held[name] = value
        return
    setter = type.__setattr__ if issubclass(type(obj), type) else setattr if plain_holder(obj) else object.__setattr__
    setter(obj, name, value)


def del_attr(obj: Any, name: str) -> None:
    held = _module_slot(obj, name)
    if held is not None:
        del held[name]
        return
    deleter = type.__delattr__ if issubclass(type(obj), type) else delattr if plain_holder(obj) else object.__delattr__
    deleter(obj, name)


def _module_slot(obj: Any, name: str) -> dict[str, Any] | None:
    """The ``_parameters`` or ``_buffers`` dict of module ``obj`` that holds ``name``, if any."""
    import torch
    if issubclass(type(obj), torch.nn.Module):
        return next((held for held in (obj._parameters, obj._buffers) if name in held), None)
    return None
