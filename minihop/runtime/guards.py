"""What a capture assumed about its arguments, as a hashable key.

Place in the pipeline: runtime. A capture is traced on fake tensors, so it is valid for every
call whose arguments have the same *properties*: for each tensor its shape, dtype, device,
layout and ``requires_grad``; for each non-tensor its value (baked into the graphs as a
constant); the structure around them; grad mode, autocast and the default dtype. ``call_key`` computes exactly that, and
the cache and ``Capture.__call__`` compare keys.

Rule for values that are not hashable and not containers: they are keyed by identity
(``id``), so a different object means a new capture, never a stale one.
"""

from __future__ import annotations

import abc
import enum
import functools
import logging
import sys
import types
import weakref
from collections.abc import MutableMapping, MutableSequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..arguments import is_dynamo_mark, marks
from ..library_state import (READ_ONLY_VIEWS, STATE, Entries, Same, float_bits, c_method_owner, global_module_hooks, library_object, minihops,
                             module_attributes, native_state, own_attr, own_dict, state_of, subclass_attributes, torch_tensor_entries,
                             view_items)
from ..spec import AUTOCAST_DEVICES
from ..structure import PLAIN_CALLABLES, attributes
from ..user_code import plain_atom, plain_items, plain_pairs
from .function_keys import function_key

__all__ = ["argument_key", "autocast_key", "call_key", "masked_key", "describe_autocast", "class_attributes", "function_class_state", "library_name",
           "unmet_marks", "value_key"]

_HASHABLE_ATOMS = (str, bytes, int, float, bool, complex, type(None), enum.Enum, torch.dtype,
                   torch.device, torch.layout, torch.memory_format, type, Same)


def python_attributes(tensor: torch.Tensor) -> tuple[tuple[str, Any], ...]:
    """The Python attributes set on a tensor (``x.scale = 2.0``), as keys: code may read
    them, and a fake copy carries them. Dynamo's marks are left out (checked on their own)."""
    found = tensor.__dict__
    if not found:
        return ()
    own = torch_tensor_entries() if issubclass(type(tensor), FakeTensor) else ()  # (a trace's value: what the user set)
    return tuple(sorted((k, value_key(v)) for k, v in found.items() if not is_dynamo_mark(k) and k not in own))


def value_key(value: Any, _open: frozenset[int] = frozenset()) -> Any:
    """The key of one value (a tensor's properties, a constant's value, ...)."""
    if issubclass(type(value), torch.Tensor):
        return ("T", type(value), tuple(value.shape), value.dtype, value.device, value.layout,
                value.requires_grad, python_attributes(value))
    if issubclass(type(value), float) and ((plain := plain_atom(value)) == 0.0 or plain != plain):
        # 0.0 == -0.0 and nan != nan in Python: keyed by their bits, so -0.0 never hits a
        # 0.0 capture (copysign, 1/x tell them apart), a NaN capture is hit again, and only
        # by a NaN of the same sign and payload (``struct.pack`` reads them back).
        return ("F", type(value), float_bits(plain))
    if issubclass(type(value), complex) and any(p == 0.0 or p != p for p in (value.real, value.imag)):
        return ("F", type(value), float_bits(value.real), float_bits(value.imag))
    if issubclass(type(value), type) and issubclass(value, torch.autograd.Function) and value.__module__ != "torch.autograd.function":
        # Another Function (``Inner.apply`` inside forward, one passed in): which forward,
        # backward and setup_context it runs, with their code and defaults, and its other class
        # attributes, as a user class's (read through it where no chain names them too).
        return ("Fn", id(value), Same(value), *(_callee_key(getattr(getattr(value, m), "__func__", getattr(value, m)))
                                                for m in FN_METHODS),
                (("cycle", id(value)),) if id(value) in _open else function_class_state(value, _open))
    if issubclass(type(value), type) and not issubclass(value, torch.autograd.Function) and \
            not library_name(own_attr(value, "__module__")) and id(value) not in _open:
        # A user's class: what its code reads of it (``cls.scale``, ``getattr(cls, name)``)
        # is its class attributes, keyed whole.
        return ("C", id(value), _class_state(value, _open | {id(value)}))
    if issubclass(type(value), _HASHABLE_ATOMS):
        # (a ``str`` or ``float`` subclass's value as the builtin's: keys compare it without the
        # subclass's ``__eq__``, the user's code, which runs only where the user's code runs it)
        return ("V", type(value), plain_atom(value), *_own(value, _open))
    if id(value) in _open:
        return ("cycle", type(value), id(value))  # an object that contains itself
    if type(value) is Entries:
        return value  # (a library's container: compared entry by entry, by identity)
    if issubclass(type(value), (tuple, list)):
        inner = _open | {id(value)}
        items = plain_items(value)  # (not a subclass's own ``__iter__``)
        return (type(value), tuple(value_key(v, inner) for v in items), *_of_class(value, _open), *_own(value, _open))
    if issubclass(type(value), dict):
        inner = _open | {id(value)}
        # Keys by their own keys too: {-0.0: v} is not {0.0: v}, nor (0.0,) (-0.0,).
        return (type(value), tuple((value_key(k, inner), value_key(v, inner))
                                   for k, v in plain_pairs(value)),
                *_of_class(value, _open), *_own(value, _open))
    if issubclass(type(value), (set, frozenset)):
        # A set's members compare by ==, so frozenset({-0.0}) == frozenset({0.0}): keyed each,
        # in its iteration order: equal sets built in another order iterate in another order
        # ({9, 1} and {1, 9} collide in an 8-slot table), and code that loops over one does too.
        inner = _open | {id(value)}
        return (type(value), tuple(value_key(v, inner) for v in plain_items(value)), *_own(value, _open))
    if issubclass(type(value), torch.nn.Module):
        # Its tensors are graph inputs: a replaced parameter of another shape needs a new capture.
        # What its forward (torch's own, in library code) reads is the rest of its state: each
        # submodule's identity, training flag, plain attributes (eps, p, momentum, ...) and hooks.
        inner = _open | {id(value)}
        return ("M", type(value), id(value), tuple(
            (name, value_key(t)) for name, t in (*value.named_parameters(), *value.named_buffers())),
            tuple(_module_state(name, m, inner) for name, m in value.named_modules()),
            global_module_hooks())
    if issubclass(type(value), types.MethodType):
        # A bound method computes with its object: keyed by its function and that object.
        inner = _open | {id(value)}
        return ("bound", _callee_key(value.__func__), value_key(value.__self__, inner))
    if c_method_owner(value) is not None:
        # A C method bound to an object (``GET = CFG.get``, ``pop = queue.popleft``) computes
        # with that object as a bound method does: keyed by it.
        return ("bound C", value.__name__, value_key(value.__self__, _open | {id(value)}))
    if issubclass(type(value), functools.partial):
        # What it is called with is part of what it computes (``partial(surrogate, alpha=2.0)``).
        inner = _open | {id(value)}
        return ("partial", _callee_key(value.func), value_key(value.args, inner), value_key(value.keywords, inner))
    if issubclass(type(value), types.FunctionType):
        # Its defaults, code and names too: the caller may replace them; and what the user set
        # on it (``act.scale = 2.0``, read as ``fn.scale``), by value.
        own = {k: v for k, v in own_dict(value).items() if not k.startswith("_minihop")}
        return function_key(value) if not own else (*function_key(value), ("attributes", tuple(
            (k, value_key(v, _open | {id(value)})) for k, v in own.items())))
    if issubclass(type(value), (*PLAIN_CALLABLES, type)):
        return ("id", type(value), id(value))
    if issubclass(type(value), logging.Logger):
        # What code can take from a logger is whether it logs (``isEnabledFor``): its level as
        # its parents set it, and the process-wide ``logging.disable(level)`` (its manager's).
        # Its handlers are not the graphs' business: messages are replayed or refused on their own.
        return ("logger", id(value), value.getEffectiveLevel(), value.disabled,
                getattr(getattr(value, "manager", None), "disable", 0), Same(value))
    if issubclass(type(value), weakref.ref):
        # What code gets by calling it (a WeakValueDictionary's entries are these): its object.
        return ("weak", type(value), value_key(value(), _open | {id(value)}))
    if issubclass(type(value), READ_ONLY_VIEWS):
        # ``MappingProxyType(d)``, ``d.keys()``: what they show is their dict's items now.
        return ("view", type(value), value_key(view_items(value), _open | {id(value)}))
    # (by its type: ``isinstance`` against an ABC asks ``value.__class__``, which a user's
    # ``__getattribute__`` answers)
    if issubclass(type(value), (MutableSequence, MutableMapping)):
        # Whatever class holds them (``array``, ``bytearray``, ``UserDict``, ``deque``): its
        # items, as a list's or a dict's (a new one holding the same is the same key).
        inner = _open | {id(value)}
        items = value.items() if issubclass(type(value), MutableMapping) else enumerate(value)
        return ("items", type(value), tuple((value_key(k, inner), value_key(v, inner)) for k, v in items),
                *_own(value, _open))
    if library_object(value) or native_state(type(value)):
        # A library object (a queue, a buffer), or a user's over a C class (``class
        # Buf(io.BytesIO)``, a ctypes ``Structure``): what the heap watch sees of it, keyed
        inner = _open | {id(value)}
        state = state_of(value)
        # (and by identity, as before: what pickle shows may leave out what it computes with,
        # an ``operator.methodcaller``'s keywords)
        return ("L", type(value), id(value), Same(value), tuple(
            (k, v.frozen if k == STATE else value_key(v, inner)) for k, v in state.items()), *_of_class(value, _open))
    if minihops(value):  # (``self.op = minihop.function(F)``: what it runs is keyed when it runs)
        return ("id", type(value), id(value), Same(value))
    attrs = attributes(value)
    cls = type(value)
    of_class = _of_class(value, _open)
    if attrs:
        inner = _open | {id(value)}
        return ("O", cls, tuple((k, value_key(v, inner)) for k, v in attrs.items()), *of_class)
    try:
        hash(value)
    except TypeError:
        # By identity, the object held (weakly where it can be: ``Same``).
        return ("id", cls, id(value), Same(value), *of_class)
    if cls.__eq__ is object.__eq__ and cls.__hash__ is object.__hash__:
        return ("id", cls, id(value), Same(value), *of_class)  # (its == is identity: not kept alive)
    return ("V", cls, value, *of_class)


def _own(value: Any, _open: frozenset[int]) -> tuple[Any, ...]:
    """A user's subclass of a builtin value carries attributes its methods and the user's code
    read (``k.extra`` of a ``class Knob(float)``): keyed too."""
    own = subclass_attributes(value)
    if own is None:
        return ()
    inner = _open | {id(value)}
    return (("attributes", tuple((k, value_key(v, inner)) for k, v in own.items())),)


def _of_class(value: Any, _open: frozenset[int]) -> tuple[Any, ...]:
    """A user's object's methods read its class's attributes too (``type(self).factor``,
    ``self.factor`` not set on the object; a ``NamedTuple``'s method): its class is keyed
    with its state. A library class is not the user's state: nothing."""
    return () if library_name(type(value).__module__) else (value_key(type(value), _open),)


FN_METHODS = ("forward", "backward", "setup_context")  # what another Function's key holds


def _callee_key(fn: Any) -> Any:
    """What a bound method or a partial calls: a function by ``function_key``, else by id."""
    return function_key(fn) if issubclass(type(fn), types.FunctionType) else id(fn)


def library_name(module: Any) -> bool:
    """Whether ``module`` (a module's name) is torch's, the standard library's or minihop's."""
    top = str(module or "").split(".")[0]
    return top in ("torch", "builtins", "minihop") or top in sys.stdlib_module_names


def _class_state(cls: type, inner: frozenset[int], skip: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    """A user class's attributes, its bases' included: data by value, methods (functions,
    static and class methods, properties) by the function objects themselves, so that
    ``Ops.act = staticmethod(torch.tanh)`` rebinding one is a different key (the class's
    identity does not change). The key holds those objects, so their ids are never reused."""
    found = class_attributes(cls, skip)
    state = (*((k, code_key(v, inner) if issubclass(type(v), CODE) else value_key(v, inner)) for k, v in found.items()),
             # (and its names: code dispatches on ``type(cfg).__name__``, which its dict lacks)
             ("__name__", ("V", str, own_attr(cls, "__name__"))), ("__qualname__", ("V", str, own_attr(cls, "__qualname__"))),
             # (and a user metaclass's: ``Cls.k`` finds ``Meta.k`` where no class in the MRO has k)
             *((("metaclass", value_key(type(cls), inner)),) if user_metaclass(cls) else ()))
    if issubclass(type(cls), abc.ABCMeta):
        # ``Kind.register(Other)`` changes what ``isinstance(x, Kind)`` answers, in place.
        registered = frozenset(id(r()) for r in abc._get_dump(cls)[0])  # type: ignore[attr-defined]
        return (*state, ("abc registry", registered))
    return state


def class_attributes(cls: type, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The attributes a user class's key holds, by name (a base's overridden by its subclass's)."""
    found: dict[str, Any] = {}
    for klass in user_bases(cls):
        for k, v in own_dict(klass).items():
            # Its dunder methods too: ``Act.__call__``, ``__getitem__``, ``__float__`` rebound
            # change what ``act(x)``, ``cfg[k]``, ``float(knob)`` compute (the class's identity
            # does not change); its data dunders (``__dict__``, ``__doc__``, a dataclass's
            # fields) do not; nor does what minihop put there (``@captured``'s apply, a cache).
            if (not (k.startswith("__") and k.endswith("__")) or v is None or issubclass(type(v), CODE) or callable(v)) \
                    and k not in skip and not (k.startswith("_minihop") or type(v) not in PLAIN and minihops(v)):
                found[k] = v
    return found


CODE = (types.FunctionType, staticmethod, classmethod, property)


def user_metaclass(cls: type) -> bool:
    """Whether ``cls``'s metaclass is a user's class (its attributes answer ``cls.name``)."""
    return type(cls) is not type and not library_name(type(cls).__module__)
_BASES: weakref.WeakKeyDictionary[type, tuple[Any, tuple[type, ...]]] = weakref.WeakKeyDictionary()


def user_bases(cls: type) -> tuple[type, ...]:
    """``cls``'s MRO, base first, without library classes: found once per MRO (a guard asks on
    every call; ``__bases__`` assigned makes a new one)."""
    mro = own_attr(cls, "__mro__")  # (past a metaclass's own __getattribute__, as every read of a class here)
    held = _BASES.get(cls)
    if held is None or held[0] is not mro:
        held = _BASES[cls] = (mro, tuple(k for k in reversed(mro) if not library_name(own_attr(k, "__module__"))))
    return held[1]

FN_OWN = frozenset({*FN_METHODS, "_backward_cls"})  # (keyed above; the node class torch made)


def function_class_state(cls: type, _open: frozenset[int] = frozenset()) -> tuple[Any, ...]:
    """A Function class's attributes but its methods (``value_key``'s ``Fn`` key holds those)."""
    return _class_state(cls, _open | {id(cls)}, FN_OWN)


def code_key(v: Any, inner: frozenset[int]) -> tuple[Any, ...]:
    """A method kept on a class, by what runs when it is called or read (a
    ``staticmethod(partial(...))`` by its partial's function, arguments and keywords too: they
    change in place)."""
    if issubclass(type(v), property):
        return ("code", *(None if f is None else _callee_key(f) for f in (v.fget, v.fset, v.fdel)))
    called = getattr(v, "__func__", v)
    return ("code", _callee_key(called) if issubclass(type(called), types.FunctionType) else value_key(called, inner))


def _module_state(name: str, module: torch.nn.Module, inner: frozenset[int]) -> tuple[Any, ...]:
    plain = tuple((k, value_key(v, inner)) for k, v in module_attributes(module).items()
                  if not issubclass(type(v), torch.Tensor))
    hooks = tuple(id(h) for d in (module._forward_pre_hooks, module._forward_hooks) for h in d.values())
    # A user module's class: its methods (``MyMod.forward`` rebound) and class attributes; any
    # class's forward, the code the trace analysed (a library class's, set by the user too).
    return (name, type(module), id(module), module.training, plain, hooks, Same(getattr(type(module), "forward", None)),
            *_of_class(module, inner))


PLAIN = (int, float, bool, str, type(None))  # compared directly by the generated checks
_any_autocast = torch._C._is_any_autocast_enabled
_default_dtype = torch.get_default_dtype


def autocast_key() -> tuple[Any, ...] | None:
    """The autocast state a capture depends on: None when autocast is off everywhere, else
    ``((device, dtype), ..., cache_enabled)`` for each device where it is on. The graphs are
    traced with it (dtypes in their metadata, Python branches on them), so it is part of the key."""
    if not _any_autocast():
        return None
    on = tuple((d, torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES
               if _autocast_enabled(d))
    return (*on, torch.is_autocast_cache_enabled())


def _autocast_enabled(device: str) -> bool:
    try:
        return torch.is_autocast_enabled(device)
    except RuntimeError:  # a device type this build does not know
        return False


def masked_key(value: Any, masked: frozenset[str]) -> Any:
    """``value``'s key without the attributes in ``masked`` (counters the Function itself
    increments on an argument object: every call changes them, and the replayed write keeps
    them as eager does; see ``tracer.roots.arg_masks``)."""
    attrs = attributes(value)
    if not attrs or issubclass(type(value), (torch.Tensor, *_HASHABLE_ATOMS, tuple, list, dict, torch.nn.Module)):
        return value_key(value)
    return ("O", type(value), tuple((k, value_key(v)) for k, v in attrs.items() if k not in masked),
            *_of_class(value, frozenset()))


def unmet_marks(args: tuple[Any, ...], dynamic: dict[int, tuple[int, ...]]) -> tuple[int, int] | None:
    """The first (argument position, dimension) marked with ``mark_dynamic`` that ``dynamic``
    (a capture's dynamic dimensions) leaves static, if any."""
    for i, a in enumerate(args):
        found = marks(a)
        for d in sorted(found[0] if found else ()):
            if d not in dynamic.get(i, ()):
                return i, d
    return None


def call_key(args: tuple[Any, ...], dynamic: dict[int, tuple[int, ...]] | None = None,
             masks: dict[int, frozenset[str]] | None = None) -> tuple[Any, ...]:
    """The properties of a call that a capture depends on (args already bound to positions):
    ``(grad mode, per-argument keys, autocast state, default dtype)``: any op making a float
    without a dtype reads the last (``torch.ones(n)``), user's code or library's, so all keys hold it.

    ``dynamic`` maps an argument position to its dynamic dimensions, whose sizes are left out
    of the key (the capture's shape guards check them instead; ``()`` for an int argument: its
    value is left out); ``masks`` an argument
    position to attributes left out of its key (``masked_key``).
    """
    if not dynamic and not masks:
        return (torch.is_grad_enabled(), tuple(value_key(a) for a in args), autocast_key(), _default_dtype())
    return (torch.is_grad_enabled(), tuple(argument_key(a, i, dynamic, masks) for i, a in enumerate(args)),
            autocast_key(), _default_dtype())


def argument_key(a: Any, i: int, dynamic: dict[int, tuple[int, ...]] | None = None,
                 masks: dict[int, frozenset[str]] | None = None) -> Any:
    """The key of argument ``a`` at position ``i`` in ``call_key``."""
    k = masked_key(a, masks[i]) if masks and i in masks else value_key(a)
    dims = (dynamic or {}).get(i)
    if dims and k[0] == "T":
        k = (*k[:2], tuple(None if d in dims else n for d, n in enumerate(k[2])), *k[3:])
    elif dims == () and k[0] == "V" and k[1] is int:
        k = ("V", int, None)  # a dynamic int: its value is a SymInt, checked by the shape guards
    return k


def describe_autocast(rest: tuple[Any, ...]) -> str:
    state = rest[0] if rest else None
    if state is None:
        return "off"
    return ", ".join(f"{d} {dtype}" for d, dtype in state[:-1]) + f" (cache {'on' if state[-1] else 'off'})"
