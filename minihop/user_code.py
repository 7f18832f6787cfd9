"""Which Python code of the user's a read would run: what minihop must never run itself.

Place in the pipeline: the structure layer, asked by the tracer's analysis (``roots.walk``,
``userattr``), its heap watch (``holders``), every check (``place.walk_plain``) and the keys
of a call's values (``runtime.guards``). Reading ``obj.name`` or ``obj[key]`` is not always a
lookup: a property, a module's ``__getattr__``, a subclass's ``__getitem__``/``__missing__``,
a key's ``__hash__``/``__eq__``, a ``defaultdict``'s factory run code, which may count calls,
draw numbers or write state. Eager runs it once per read of the user's code; minihop's own
reads (finding what the code reads, snapshots, checks, keys) must run it never, so they read
such a step as unknown, or go through the nearest library class's methods
(``library_base``, ``plain_atom``).
"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Callable, Iterable
from typing import Any

from .errors import MinihopError, UnsupportedArgumentError, UnsupportedOutputError
from .library_state import library_module, own_dict

__all__ = ["answers_own_class", "class_answering_refusal", "lazy_module_refusal", "tensor_code", "tensor_code_refusal", "item_served_by_code", "key_code", "library_base", "plain_atom", "plain_items",
           "plain_pairs", "served_by_user_code"]


def answers_own_class(value: Any) -> str | None:
    """The code of the user's (or of a proxy library's) that asking ``value`` its class runs,
    or None: a ``__getattribute__`` of the user's, or a ``__class__`` its class overrides (a
    forwarding proxy's property). ``isinstance(value, C)`` asks it whenever ``type(value)`` is
    not a ``C``: eager's ``Function.apply`` does so for each argument and returned value, a
    capture's calls never do, and minihop's own code asks only ``type(value)``."""
    cls = type(value)
    hook = getattr(cls, "__getattribute__", object.__getattribute__)
    if hook is not object.__getattribute__ and _user(hook, library_module):
        return f"{cls.__qualname__}.__getattribute__"
    return next((f"{klass.__qualname__}.__class__" for klass in cls.__mro__[:-1] if "__class__" in klass.__dict__),
                None)


def class_answering_refusal(function: str, values: Iterable[Any], what: str) -> MinihopError | None:
    """The refusal of a call whose argument (``what``: "argument") or of a forward whose
    returned value (``what``: "returned value") answers its class with its own code, or None.
    Eager's ``Function.apply`` asks each one ``isinstance(v, torch.Tensor)``, running that code
    (a count, a lazy object's set-up, a log line) on every call; a capture's run never asks."""
    for value in values:
        torch_code = tensor_code(value, 0) if what == "argument" else None
        if torch_code is not None:
            return tensor_code_refusal(f"{function}.apply got", torch_code)
        code = answers_own_class(value)
        if code is not None:
            error = UnsupportedOutputError if what == "returned value" else UnsupportedArgumentError
            return error(
                f"{function} got an {what} of class {type(value).__qualname__}, which answers "
                f"Python's question of its class with its own code ({code}): a forwarding proxy, "
                "a lazy object, a mock, or an object that counts what is read of it.",
                "Eager's Function.apply asks every argument and returned value its class "
                "(isinstance), running that code each call; a capture's graphs never do, so what "
                "the code counts or sets up would differ from eager.",
                "Pass the object it stands for (or the values forward reads of it), or run the "
                "Function eagerly with minihop.function(F, fallback='eager').")
    return None


def tensor_code(value: Any, depth: int) -> str | None:
    """The ``__torch_function__`` or ``__torch_dispatch__`` of the user's that a tensor subclass
    runs (on ``x.shape`` and ``x.dtype`` too), for a tensor ``value`` or one in its lists,
    tuples and dicts (a few levels down), or None."""
    cls = type(value)
    if cls in _NO_TENSOR:
        return None
    import torch
    if issubclass(cls, torch.nn.Module):  # (its own dicts: no ``__getattr__`` of the user's runs)
        held = [*own_dict(value).get("_parameters", {}).values(), *own_dict(value).get("_buffers", {}).values()]
        return next(filter(None, (tensor_code(v, depth) for v in held)), None) or (next(filter(None, (
            tensor_code(m, depth + 1) for m in own_dict(value).get("_modules", {}).values())), None) if depth < 8 else None)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return None
    if issubclass(cls, torch.Tensor):
        for name in ("__torch_function__", "__torch_dispatch__"):
            if _user(getattr(cls, name, None), library_module):  # (torch's own, or ``_disabled_torch_function_impl``: none)
                return f"{cls.__qualname__}.{name}"
        return None
    if depth < 4 and cls in (list, tuple, dict):
        items = value.values() if cls is dict else value
        return next(filter(None, (tensor_code(v, depth + 1) for v in items if type(v) not in _NO_TENSOR)), None)
    return None


_NO_TENSOR = frozenset({int, float, bool, str, bytes, complex, type(None)})  # (nothing below them: skipped fast)


def tensor_code_refusal(found: str, code: str, where: str | None = None) -> UnsupportedArgumentError:
    """The refusal of a tensor subclass with code of its own (``tensor_code``), where ``found``
    ("F got", "F.forward reads W, which holds") meets it."""
    return UnsupportedArgumentError(
        f"{found} a {code.rsplit('.', 1)[0]} (a tensor subclass) with code of its own ({code}).",
        "minihop traces on plain fake tensors, and even reading such a tensor's shape or dtype (for a key, "
        "a guard, a snapshot) runs that code: what it counts or records would differ from eager's.",
        "Pass plain tensors (t.as_subclass(torch.Tensor)), or run the Function eagerly with "
        "minihop.function(F, fallback='eager').", where=where)


def lazy_module_refusal(function: str, args: Iterable[Any]) -> MinihopError | None:
    """The refusal of a call with a module argument whose parameters are not made yet
    (``nn.LazyLinear`` before its first call), or None: they have no shape to key or trace,
    and eager's first call makes them (drawing from the random stream)."""
    import torch  # (only here: the rest of this module reads plain Python objects)
    for a in args:
        if issubclass(type(a), torch.nn.Module) and any(
                issubclass(type(t), torch.nn.parameter.UninitializedTensorMixin)
                for m in a.modules() for t in (*m._parameters.values(), *m._buffers.values())):
            return UnsupportedArgumentError(
                f"{function} got a module argument, a {type(a).__qualname__}, whose parameters are not "
                "made yet (a lazy module before its first call).",
                "Its parameters have no shape for minihop to key or trace; eager's first call makes "
                "them from the input's shape, drawing from torch's random stream.",
                "Call the module once before (or pass a module whose parameters are made), or run "
                "the Function eagerly with minihop.function(F, fallback='eager').")
    return None


def library_base(cls: type) -> type:
    """The first class of ``cls``'s MRO that is not the user's: whose methods run no user code."""
    return next(c for c in cls.__mro__ if library_module(getattr(c, "__module__", None) or "builtins"))


_EXACT = frozenset({tuple, list, dict, set, frozenset})


def plain_items(value: Any) -> Any:
    """A tuple's, list's or set's items (a dict's keys), iterated as the builtin does: past a
    subclass's own ``__iter__``."""
    cls = type(value)
    return value if cls in _EXACT else library_base(cls).__iter__(value)


def plain_pairs(value: Any) -> Any:
    """A dict's ``(key, value)`` pairs, past a subclass's own ``items``."""
    return value.items() if type(value) is dict else library_base(type(value)).items(value)


# A builtin scalar's own value, read past a subclass's methods (``class Mode(str)`` with its own
# ``__eq__``): the C slot of the builtin copies the value and calls nothing.
_UNWRAP = ((bool, bool), (int, int.__int__), (float, float.__float__), (complex, complex.__complex__),
           (str, str.__str__), (bytes, bytes.__bytes__))


def plain_atom(value: Any) -> Any:
    """``value`` if its type is a builtin scalar's, else the builtin value it holds (for keys:
    comparing and hashing those runs no ``__eq__``/``__hash__`` of the user's)."""
    for base, unwrap in _UNWRAP:
        if issubclass(type(value), base):
            return value if type(value) is base else unwrap(value)
    return value


# Descriptors whose __get__ runs no Python code of anyone's.
_PURE = (types.FunctionType, staticmethod, classmethod, types.BuiltinFunctionType,
         types.MethodDescriptorType, types.WrapperDescriptorType, types.GetSetDescriptorType,
         types.MemberDescriptorType, types.ClassMethodDescriptorType, types.MethodWrapperType)


_PLAIN_KEYS = (str, int, float, bool, type(None), bytes)


def item_served_by_code(obj: Any, key: Any, library: Callable[[str], bool]) -> str | None:
    """What code ``obj[key]`` would run besides a plain lookup (for a message), or None: the
    user's ``__getitem__``, ``__missing__``, a key's ``__hash__``/``__eq__``, or a
    ``defaultdict``'s factory (which also inserts the key)."""
    cls = type(obj)
    if cls is not dict and cls is not list and cls is not tuple:
        getitem = getattr(cls, "__getitem__", None)
        if getitem is not None and _user(getitem, library):
            return f"{cls.__qualname__}.__getitem__"
    if not issubclass(type(obj), dict):
        return None
    what = key_code(key, library)
    if what is not None:
        return what
    missing = getattr(cls, "__missing__", None) if cls is not dict else None
    if missing is not None and not dict.__contains__(obj, key) and (
            _user(missing, library) or issubclass(type(obj), collections.defaultdict)):  # (which inserts the key)
        return f"{cls.__qualname__}.__missing__"
    return None


def key_code(key: Any, library: Callable[[str], bool]) -> str | None:
    """The user's ``__hash__`` or ``__eq__`` a dict lookup of ``key`` would run, or None."""
    kind = type(key)
    if kind in _PLAIN_KEYS:
        return None
    if kind is tuple:
        return next((w for w in (key_code(k, library) for k in key) if w is not None), None)
    for name in ("__hash__", "__eq__"):
        if _user(getattr(kind, name, None), library):
            return f"{kind.__qualname__}.{name}"
    return None


def _user(fn: Any, library: Callable[[str], bool]) -> bool:
    fn = getattr(fn, "__func__", fn)
    return issubclass(type(fn), types.FunctionType) and not library(getattr(fn, "__module__", None) or "")


def _getter(found: Any) -> Any:
    """The Python function reading ``found`` (a class attribute) runs, or None."""
    if issubclass(type(found), _PURE):
        return None
    if issubclass(type(found), property):
        return found.fget
    if issubclass(type(found), functools.cached_property):
        return found.func
    return getattr(type(found), "__get__", None)


def served_by_user_code(obj: Any, name: str, library: Callable[[str], bool]) -> str | None:
    """What user code ``getattr(obj, name)`` would run (for a message), or None if none."""
    if issubclass(type(obj), types.ModuleType):
        # A module's own ``__getattr__`` (PEP 562) serves the names its dict lacks.
        space = obj.__dict__
        hook = space.get("__getattr__") if name not in space else None
        return f"{obj.__name__}.__getattr__" if hook is not None and _user(hook, library) else None
    cls = type(obj)
    hook = getattr(cls, "__getattribute__", None)
    if hook is not object.__getattribute__ and hook is not type.__getattribute__ and _user(hook, library):
        return f"{cls.__qualname__}.__getattribute__"
    owners = obj.__mro__ if issubclass(type(obj), type) else ()
    for klass in (*owners, *cls.__mro__):
        found = klass.__dict__.get(name, _NOTHING)
        if found is _NOTHING:
            continue
        if not owners and klass is not None and name in (own_dict(obj) or {}) and \
                not hasattr(type(found), "__set__"):
            return None  # the instance's own value shadows a non-data descriptor
        getter = _getter(found)
        if getter is not None and _user(getter, library):
            return f"{type(found).__qualname__} {klass.__qualname__}.{name}"
        return None
    if name in (own_dict(obj) or {}):
        return None
    hook = getattr(cls, "__getattr__", None)
    if hook is not None and _user(hook, library):
        return f"{cls.__qualname__}.__getattr__"
    return None


_NOTHING = object()
