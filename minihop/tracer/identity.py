"""What a fake copy cannot answer as the caller's value: which object it is, and a tensor's own state.

Place in the pipeline: tracer, asked by ``pystate.StateTracker`` (before the trace),
``opaque.Finder`` (while it runs) and ``session.Tracing`` (each tensor read). A capture is
traced on fake tensors: each tensor argument is a fake copy, another object than the caller's
tensor, with its own autograd state and no storage of the caller's; and the call key holds
tensors by their properties and objects by their contents, not by which object they are.
The reads that would differ, each made sound here:

- **a tensor argument the code can also reach as the caller's tensor** (``w is W[0]``, a dict
  keyed by tensors, ``any(w is t for t in PARAMS)``, ``w is m.weight`` of a module passed
  in): the code would hold the fake and the caller's tensor as two objects. Refused before
  tracing (MH104), by the heap watch's walk (``outside_aliases``); the tensors it reached
  outside the arguments are kept (weakly), and which tensors of a call are one is part of its
  sharing (``runtime.sharing``), so that no later call of another sharing reuses the capture;
- **``id`` or ``hash`` of a fake tensor** in the user's code: the fake's identity, never the
  caller's tensor's. Refused where it is called (``IdentityWatch``, MH104);
- **``id`` or ``hash`` of an object keyed by its contents** (a user's object, a function, a
  list): right for the call traced, unknown for the next one (another object with the same
  contents hits the key). The capture is single-use, with the line;
- **a tensor's autograd state, storage or layout** (``TENSOR_STATE``, ``TENSOR_STORAGE``,
  ``TENSOR_LAYOUT``: ``x.grad``, ``x._version``, ``x.data_ptr()``, ``x.stride()``), however the
  code reaches the tensor: of a fake copy, refused (``refuse_tensor_state``); of the caller's
  own tensor (a global's), answered by it and single-use in forward, refused in backward
  (``session.Tracing._on_state_read`` decides which).

- **``type()`` and ``isinstance`` of a traced value** (``type(x) is torch.Tensor``,
  ``isinstance(n, int)`` of a size made symbolic, ``isinstance(x, FakeTensor)``): the fake's
  class, ``FakeTensor``; a symbolic size's, ``torch.SymInt``. Where the analysed code names
  ``type`` or ``isinstance``, its globals bind ``TYPE``/``ISINSTANCE`` while it is traced
  (``TypeAsEager``), which answer as eager's value. Reads no stand-in answers (``v.__class__``,
  a name only a fake tensor has; in a symbolic trace ``match n: case int():``, ``n > 4 is
  True``, a ``singledispatch`` call) are refused (``kinds.py``; the automatic policy
  then captures static);
- **a fake tensor's text** (``str(x)``, ``f"{x}"``) taken by the user's code: ``FakeTensor(...)``
  where eager's shows the values. Refused (``TextAsEager``).

``IdentityWatch`` and the stand-ins are installed only where the analysed code names ``id``,
``hash``, ``type`` or ``isinstance`` (``names_identity``), so a Function that does not pays
nothing (but the text watch: one class attribute set per trace).

Invariant: no capture serves a call whose answer to one of these reads could differ from the
trace's, and none is traced where the trace's own answer would.
"""

from __future__ import annotations

import builtins
import functools
import sys
import threading
import types
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import UnsupportedOperationError
from . import handlers
from .atoms import ATOMS
from .ctx import ProxyCtx
from .bytecode import instructions

__all__ = ["ISINSTANCE", "KEY_HELD", "STAND_INS", "TENSOR_LAYOUT", "TENSOR_STATE", "TENSOR_STORAGE", "TYPE", "IdentityWatch", "TypeAsEager", "names_identity",
           "note_tensor", "stand_in",
           "outside_aliases", "outside_tensors", "refuse_identity_alias", "refuse_tensor_state",
           "tensor_read"]

_NAMES = frozenset({"id", "hash", "type", "isinstance", "vars", "dir"})


@functools.lru_cache(maxsize=2048)
def names_identity(code: types.CodeType) -> frozenset[str]:
    """Which of the builtins ``id``, ``hash``, ``type``, ``isinstance``, ``vars`` and ``dir``
    ``code`` (or code nested in it) names."""
    found: set[str] = set()
    stack = [code]
    while stack:
        inner = stack.pop()
        stack += [c for c in inner.co_consts if issubclass(type(c), types.CodeType)]
        found |= {op.argval for op in instructions(inner)[0]
                  if op.opname in ("LOAD_GLOBAL", "LOAD_NAME") and op.argval in _NAMES}
    return frozenset(found)


_BUILTINS = {id(getattr(builtins, name)): name for name in _NAMES}


def refuse_identity_alias(function: str, phase: str, chain: Any, end: Any, where: str) -> None:
    """The code reaches the builtin ``id``, ``hash`` or ``type`` by another name than its own
    (``myid = id``, ``builtins.id``, ``T = type``): the watches above stand in for the names
    the code says, so a call through another is not seen. Refused (MH104)."""
    name = _BUILTINS.get(id(end))
    if name is None or getattr(builtins, name) is not end or (chain.root == name and not chain.steps):
        return
    raise UnsupportedOperationError(
        f"{function}.{phase} calls the builtin {name} as {chain.root}{''.join(f'.{k}' for _, k in chain.steps)}.",
        f"minihop answers {name}() of a traced tensor as eager would (or refuses it) where the code "
        f"names {name} itself; called by another name, it would give the fake copy's answer.",
        f"Call it as {name}(...), or run it eagerly with minihop.function(F, fallback='eager').", where=where)


class _TypeAsEager(type):
    """``TYPE``'s metaclass: calling it is ``type`` but for a fake tensor; ``isinstance`` and
    ``issubclass`` against it answer as against ``type``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and issubclass(type(args[0]), FakeTensor):
            # What the caller's tensor is: an argument's type is in the call key (a subclass
            # is refused), a Parameter's fake carries ``_is_param``; what ops make is a Tensor.
            return torch.nn.Parameter if getattr(args[0], "_is_param", False) else torch.Tensor
        if len(args) == 1 and not kwargs and type(args[0]) in _SYMBOLIC:
            return _SYMBOLIC[type(args[0])]  # a symbolic size or number: eager's is a plain one
        if len(args) == 1 and not kwargs and type(args[0]) is ProxyCtx:
            return args[0].__class__  # eager's ctx: the Function's ``FBackward``
        made = type(*args, **kwargs)
        return cls if made is type else made  # (``type(C) is type``: the name the code compares with)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, type)  # (the user's question, answered as eager's)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, type)


class TYPE(metaclass=_TypeAsEager):
    """``type`` as the user's code finds it while traced (``type(x) is torch.Tensor``): a fake
    tensor's type is ``FakeTensor``, the caller's tensor's is ``torch.Tensor``. Put in the
    globals of the analysed code that names ``type`` (``TypeAsEager``), and only there: torch's
    own code asks for the fake's real type."""


# A symbolic size or number (dynamic sizes, an automatic dynamic int) is eager's plain one.
_SYMBOLIC: dict[type, type] = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def ISINSTANCE(obj: Any, classinfo: Any) -> bool:
    """``isinstance`` as the user's code finds it while traced: a symbolic number answers as
    the plain one eager holds (``isinstance(x.shape[0], int)``, an automatic dynamic ``k``), a
    fake tensor as the caller's tensor (``isinstance(x, FakeTensor)`` is eager's False)."""
    eager = _SYMBOLIC.get(type(obj))
    if eager is None and issubclass(type(obj), FakeTensor):
        eager = torch.nn.Parameter if getattr(obj, "_is_param", False) else torch.Tensor
    # (the user's own question: eager's isinstance, which may ask ``obj.__class__``)
    return isinstance(obj, classinfo) if eager is None else issubclass(eager, classinfo)


class TextAsEager:
    """While traced, a fake tensor's text asked by the user's code (``f"{x}"``, ``str(x)``,
    ``repr([x])``): eager's is the caller's tensor's data, the fake's says ``FakeTensor(...)``.
    Refused (MH104) where the user's code (``codes``) asks, through ``Tensor.__format__`` or
    not; torch's own formatting (its error messages) and minihop's message replay (which
    formats the call's values when it runs) are left alone."""

    def __init__(self, codes: set[types.CodeType], function: str) -> None:
        self.codes, self.function, self.thread = codes, function, threading.get_ident()
        self.held = FakeTensor.__dict__.get("__repr__")

        def _repr(tensor: Any, *args: Any, **kwargs: Any) -> str:  # (a function: ``x.__repr__()`` binds it)
            return self.text(tensor, *args, **kwargs)

        self._repr = _repr
        FakeTensor.__repr__ = _repr  # type: ignore[method-assign,assignment]

    def text(self, tensor: Any, *args: Any, **kwargs: Any) -> str:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename == _TENSOR_FILE:
            frame = frame.f_back
        if frame is not None and frame.f_code in self.codes and threading.get_ident() == self.thread:
            raise handlers.note(UnsupportedOperationError(
                f"{self.function} takes the text of a tensor (str, repr, format or an f-string), "
                f"line {frame.f_lineno}.",
                "Eager's text shows the tensor's values; a traced tensor has none, and the text "
                "would be a constant of the capture.",
                "Send it as a message (print(x), logging's lazy arguments: replayed with each "
                "call's values), or run it eagerly with minihop.function(F, fallback='eager').",
                where=f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'), frame)
        return torch.Tensor.__repr__(tensor, *args, **kwargs)

    def stop(self) -> None:
        if FakeTensor.__dict__.get("__repr__") is self._repr:
            if self.held is None:
                del FakeTensor.__repr__
            else:
                FakeTensor.__repr__ = self.held  # type: ignore[method-assign]


_TENSOR_FILE = torch.Tensor.__format__.__code__.co_filename  # (``Tensor.__format__`` asks for the text)


def _refuse_listing(name: str, what: str = "a tensor's") -> UnsupportedOperationError:
    frame = sys._getframe(2)
    where = f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'
    return handlers.note(UnsupportedOperationError(
        f"The traced code lists {what} attributes with {name}() ({where}).",
        "A traced tensor is a fake copy (its __dict__ holds the tracer's entries, its class has methods "
        "eager's lacks) and ctx minihop's recorder (eager's is autograd's node): the listing is not eager's.",
        "Read the attributes it needs by name (getattr(x, 'scale', None)), or run it eagerly with "
        "minihop.function(F, fallback='eager').", where=where), frame)


def VARS(*args: Any) -> Any:
    """``vars`` as the user's code finds it while traced: of a fake tensor refused (MH104);
    ``vars()`` is the caller's locals, as eager's."""
    if not args:
        return sys._getframe(1).f_locals
    if len(args) == 1 and issubclass(type(args[0]), FakeTensor):
        raise _refuse_listing("vars")
    if len(args) == 1 and type(args[0]) is ProxyCtx:
        args[0].__class__  # noqa: B018  (noted as asked: under torch.func eager's ctx is a wrapper)
    return vars(*args)


def DIR(*args: Any) -> Any:
    """``dir`` as the user's code finds it while traced: of a fake tensor refused (MH104);
    ``dir()`` is the caller's local names, as eager's."""
    if not args:
        return sorted(sys._getframe(1).f_locals)
    if len(args) == 1 and (issubclass(type(args[0]), FakeTensor) or type(args[0]) is ProxyCtx):
        # (eager's ctx lists autograd's own names: no stand-in has them)
        raise _refuse_listing("dir", "ctx's" if type(args[0]) is ProxyCtx else "a tensor's")
    return dir(*args)


STAND_INS = {"type": TYPE, "isinstance": ISINSTANCE, "vars": VARS, "dir": DIR}


def stand_in(value: Any) -> bool:
    """Whether ``value`` is one of the stand-ins bound in the user's globals while traced."""
    return value is TYPE or value is ISINSTANCE or value is VARS or value is DIR


# The stand-ins other watches swap in for the user's functions while traced (``hidden.ReadWatch``:
# an ``lru_cache`` helper uncached, a clock read): id -> the user's function they stand for, so
# that what keeps the user's bindings to put them back (``call_watch.CallWatch``) keeps that.
SWAPPED_IN: dict[int, Any] = {}


# The attributes only a fake tensor has (read by code that asks whether it is traced).
_FAKE_ONLY = frozenset(n for n in dir(FakeTensor) if n not in dir(torch.Tensor) and n != "constant") | frozenset(
    {"fake_mode", "fake_device", "real_tensor", "pytype", "dispatch_keys"})


class TypeAsEager:
    """``TYPE`` bound as ``type`` and ``ISINSTANCE`` as ``isinstance`` in each namespace given
    for the names its code uses (one that binds no such name of its own), until ``stop``. The
    heap watch does not see them there (``heap.snapshot``)."""

    def __init__(self, namespaces: Iterable[tuple[dict[str, Any], frozenset[str]]],
                 codes: set[types.CodeType] = frozenset(), function: str = "") -> None:  # type: ignore[assignment]
        self.text = TextAsEager(codes, function) if codes else None
        self.bound: list[tuple[dict[str, Any], str]] = []
        self.done: set[tuple[int, str]] = set()
        for g, names in namespaces:
            self.bind(g, names)

    def unanalysed(self, code: types.CodeType, g: dict[str, Any]) -> None:
        """The user's ``code``, which no analysis reached, is called (``call_watch.CallWatch``: a
        callback in a list passed in, one found by a computed name): its names stand in too,
        and its text of a tensor is refused as analysed code's is."""
        self.bind(g, names_identity(code))
        if self.text is not None:
            self.text.codes.add(code)

    def bind(self, g: dict[str, Any], names: frozenset[str]) -> None:
        """The stand-ins for ``names`` in the namespace ``g`` (where it binds none of its own):
        for analysed code before the trace, for code no analysis reached when it is called
        (``call_watch.CallWatch``: a callback in a list passed in, one found by a computed name)."""
        for name in sorted(names & STAND_INS.keys()):
            if name not in g and (id(g), name) not in self.done:
                self.done.add((id(g), name))
                g[name] = STAND_INS[name]
                self.bound.append((g, name))

    def stop(self) -> None:
        for g, name in self.bound:
            if g.get(name) is STAND_INS[name]:
                del g[name]
        self.bound = []
        if self.text is not None:
            self.text.stop()
            self.text = None


def note_tensor(reached: dict[int, list[Any]], tensor: torch.Tensor, place: Any, key_of: str = "") -> None:
    """The heap walk reached ``tensor`` at ``place`` (a ``Place``; ``key_of``: as a dict's key)."""
    entry = reached.setdefault(id(tensor), [tensor, None, None])
    if place.uses_args and entry[1] is None:
        entry[1] = place
    elif not place.uses_args and entry[2] is None:
        entry[2] = key_of + place.description


def outside_aliases(function: str, reached: dict[int, list[Any]], real_args: tuple[Any, ...] | None,
                    argnames: tuple[str, ...]) -> None:
    """Refuse a call one of whose tensor arguments the code can also reach as the caller's
    tensor: outside its arguments, or held by another argument the trace keeps as it is (a
    module's parameter). ``reached``: the heap walk's ``[tensor, argument place, outside
    place]``, the arguments' tensors being the trace's fakes, ``real_args`` the caller's."""
    if real_args is None:
        return
    caller_s = {id(t): outside or inside.describe(argnames) for t, inside, outside in reached.values()
                if not issubclass(type(t), FakeTensor)}
    for fake, inside, _ in reached.values():
        if inside is None or not issubclass(type(fake), FakeTensor) or not caller_s:
            continue
        try:
            real = inside.get(real_args)
        except Exception:  # (a place the caller's arguments do not have: nothing to compare)
            continue
        other = caller_s.get(id(real))
        if other is None:
            continue
        arg = inside.describe(argnames)
        raise UnsupportedOperationError(
            f"{function} is called with {arg}, which is also {other}, a tensor its code can reach "
            "as the caller's.",
            "A capture is traced on a fake copy of each tensor argument: the code would hold "
            "the copy and the caller's tensor as two objects, so an identity test (`is`, a "
            "dict keyed by tensors, id()) or an in-place write through one would not be seen "
            "through the other, as eager sees it.",
            f"Pass {arg}.clone() (or reach the tensor only through one of them), or run it "
            "eagerly with minihop.function(F, fallback='eager').")


def outside_tensors(tensors: dict[int, list[Any]]) -> tuple[weakref.ref[torch.Tensor], ...]:
    """Weak references to the tensors reached outside the arguments: no call may pass one."""
    return tuple(weakref.ref(t) for t, _, outside in tensors.values() if outside is not None)


# A tensor's state that its key does not hold (read through getattr with a name from a variable).
TENSOR_STATE = frozenset({"grad", "is_leaf", "grad_fn", "_version", "_base", "retains_grad",
                          "output_nr", "_backward_hooks", "_is_zerotensor"})  # (autograd's efficient zeros)
# ... where its data lives (a fake tensor has no storage of the caller's): read as identity ...
TENSOR_STORAGE = frozenset({"data_ptr", "untyped_storage", "storage", "_cdata", "is_set_to", "is_shared", "is_pinned"})
# ... and how it lies there (a fake copy keeps it; the key holds it for tensor arguments only).
TENSOR_LAYOUT = frozenset({"stride", "is_contiguous", "is_non_overlapping_and_dense", "storage_offset", "_is_view",
                           "dim_order"})
# What a tensor argument's key holds (its type, shape, dtype, device, layout, requires_grad),
# what follows from it alone, and what is answered elsewhere (its autograd state: refused of a
# fake copy). Any other question of a traced tensor (``is_conj()``, ``is_inference()``, one no
# list names) may have an answer the key does not fix: the capture then guards its arguments'
# strides and flags too (``session.Tracing._on_query``, ``runtime.assumptions.layout_key``).
KEY_HELD = frozenset({
    "size", "shape", "dim", "ndim", "numel", "nelement", "dtype", "device", "layout", "__len__",
    "is_floating_point", "is_complex", "element_size", "is_cuda", "is_cpu", "is_sparse", "get_device",
    "requires_grad", "itemsize", "nbytes", "is_signed", "type", "is_meta", "is_quantized",
    "is_mkldnn", "is_nested", "is_sparse_csr", "is_mps", "is_xpu", "is_xla", "is_ipu", "is_vulkan",
    "__iter__", "__hash__", "__reversed__", "_version", "grad", "is_leaf", "grad_fn",
    "_base", "retains_grad", "output_nr", "_backward_hooks", "register_hook", "retain_grad",
    "backward", "__setstate__", "__dir__", "__contains__", "_is_zerotensor",
})


def tensor_read(name: str, attr: str) -> str:
    """``x.grad``, or ``.grad of a tensor`` where the tensor has no name."""
    return f"{name}.{attr}" if " " not in name else f".{attr} of {name}"


def refuse_tensor_state(function: str, phase: str, name: str, attr: str, where: str,
                        whose: str = "a tensor argument") -> None:
    """A tensor argument's autograd state or storage read by the code (``x.grad``,
    ``x.is_leaf``, ``x.data_ptr()``): the trace's fake tensor has its own (no grad, a leaf, no
    storage of the caller's), so the traced branch could differ from eager's on this very
    call; refused (MH104)."""
    what = "the storage" if attr in TENSOR_STORAGE else "the layout" if attr in TENSOR_LAYOUT else "the autograd state"
    raise UnsupportedOperationError(
        f"{function}.{phase} reads {tensor_read(name, attr)}, {what} of {whose}.",
        "A capture is traced on fake tensors, whose .grad, .is_leaf, .grad_fn and storage are "
        "not the caller's tensor's, and the call key does not hold them: the traced code could "
        "take another branch than eager does.",
        "Pass what it decides as an argument (e.g. a bool), or run it eagerly with "
        "minihop.function(F, fallback='eager').", where=where)


def _by_contents(obj: Any) -> bool:
    """Whether ``hash(obj)`` is computed from what the object holds, not from its identity."""
    if issubclass(type(obj), ATOMS):
        return True
    if issubclass(type(obj), (tuple, frozenset)):
        return all(_by_contents(v) for v in obj)
    return not issubclass(type(obj), torch.Tensor) and type(obj).__hash__ is not object.__hash__ \
        and not issubclass(type(obj), (type, types.FunctionType, types.ModuleType))


def _holds_fake(obj: Any) -> bool:
    """A fake tensor, or a tuple or frozenset holding one (``hash((w, 1))``)."""
    if issubclass(type(obj), FakeTensor):
        return True
    return issubclass(type(obj), (tuple, frozenset)) and any(_holds_fake(v) for v in obj)


def _keyed_by_identity(obj: Any) -> bool:
    """An object whose identity the call key holds already (a class, a module, a value)."""
    return obj is None or issubclass(type(obj), (bool, type, torch.nn.Module, types.ModuleType))


class IdentityWatch:
    """``id`` and ``hash`` (the builtins) while the analysed ``codes`` are traced: of a fake
    tensor, refused (raised where it is called, and kept for ``refusal``); of an object whose
    identity the key does not hold, a reason to be single-use."""

    def __init__(self, codes: Iterable[types.CodeType], function: str) -> None:
        self.codes = set(codes)
        self.function = function
        self.thread = threading.get_ident()
        self.real_id, self.real_hash = builtins.id, builtins.hash
        self.found: list[str] = []
        self.refused: list[UnsupportedOperationError] = []
        builtins.id, builtins.hash = self.id, self.hash  # type: ignore[assignment]

    def id(self, obj: Any) -> int:
        self._read("id", obj, sys._getframe(1))
        return self.real_id(obj)

    def hash(self, obj: Any) -> int:
        self._read("hash", obj, sys._getframe(1))
        return self.real_hash(obj)

    def _read(self, which: str, obj: Any, frame: Any) -> None:
        if frame.f_code not in self.codes or threading.get_ident() != self.thread:
            return
        where = f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'
        if _holds_fake(obj):
            error = UnsupportedOperationError(
                f"{self.function} calls {which}() of a tensor of the trace (line {frame.f_lineno}).",
                "A capture is traced on fake tensors: the identity read is the fake copy's, "
                "never the caller's tensor's, and a call key holds tensors by their properties, "
                "not by which object they are.",
                "Key what it caches by something the Function is given (a name, a step number), "
                "or run it eagerly with minihop.function(F, fallback='eager').", where=where)
            self.refused.append(error)
            raise error
        if which == "hash" and _by_contents(obj) or which == "id" and _keyed_by_identity(obj):
            return
        if len(self.found) < 8:
            self.found.append(f"calls {which}() of a {type(obj).__name__} object: the call key holds it by "
                              f"its contents, not its identity ({where})")

    def stop(self) -> None:
        if builtins.id == self.id:
            builtins.id = self.real_id
        if builtins.hash == self.hash:
            builtins.hash = self.real_hash
