"""The Python attributes of a tensor argument that backward may read: read places of backward.

Place in the pipeline: tracer, asked by ``pystate.StateTracker`` once forward has run (with
ctx as forward left it). A tensor argument's own attributes (``x.scale = 2.0``) are in the call
key, so forward's reads of them are guarded. Backward reads them later, off the tensor it gets
back from ``ctx.saved_tensors`` or ctx (``getattr(x, "scale", 1.0)``), and the caller may set,
change or delete one between forward and ``.backward()``: eager's backward reads it then. The
read goes through a local the bytecode chains do not follow (it is not a parameter), so every
name backward's code loads as an attribute or names as a constant (the ``getattr`` spelling)
that is not the tensor's own (``torch.Tensor``'s methods and properties) nor ctx's may be one:
each tensor argument's entries of those names are one read place of backward, ``arg.__dict__``:
checked when backward runs, another value (or one set since) traces backward again, as eager's
backward would take that path (and forward saves what such a backward may use).

Traced again for a call (``as_called``), each tensor argument's fake takes the attributes
the call's tensor has then. And a saved *output* comes back to eager's backward as a new tensor
object, without the attributes forward set on it (an input or an intermediate comes back as
itself): ``saved_outputs_bare`` hides them while backward is traced.

A tensor the code reaches outside its arguments (a global, a module's weight) has its own
attributes too, which no key holds: ``attributes_place`` makes them one read place of the chain.

Invariant: over-approximate, never under, for every tensor argument (one without attributes
at the call too: an attribute first set between forward and backward is a change): a name it
does not hold reads as missing, twice.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch

from ..library_state import del_attr, set_attr, tensor_attributes
from ..spec import MISSING, Place, Root
from ..structure import argname
from .names import code_of
from .roots import place_at, value_place, walk

__all__ = ["as_called", "attributes_place", "saved_outputs_bare", "tensor_attribute_reads"]


def attributes_place(root: Root, value: Any, named: tuple[tuple[str, Any], ...],
                     code: types.CodeType | None = None) -> list[Place]:
    """The Python attributes of a tensor a chain names outside the arguments (a global's, a
    module's weight, an item of a global list), as one read place, where ``code`` (whose chain
    it is) names ``getattr`` or ``hasattr``: only an argument's attributes are in the call key,
    and a lifted tensor's guard is on its shape, dtype, device and grad, so
    ``hasattr(P, "lr_scale")`` or ``getattr(W[0], "k", 1.0)`` would be baked in. (An attribute
    load is a chain of its own, ``P.lr_scale``; ``vars(P)`` and ``P.__dict__`` are refused.)"""
    if root.uses_args or code is None or not _names_getattr(code):
        return []
    try:
        end = walk(value, named)
    except Exception:
        return []
    if not issubclass(type(end), torch.Tensor):
        return []
    place = place_at(root, named)

    def attributes(args: tuple[Any, ...]) -> Any:
        t = place.get(args)
        return tuple(sorted(tensor_attributes(t).items())) if issubclass(type(t), torch.Tensor) else MISSING
    return [value_place(f"{place.description}'s Python attributes", attributes)]


@functools.lru_cache(maxsize=512)
def _names_getattr(code: types.CodeType) -> bool:
    """Whether ``code`` (or code nested in it) names ``getattr`` or ``hasattr``."""
    return bool({"getattr", "hasattr"} & set(code.co_names)) or any(
        _names_getattr(c) for c in code.co_consts if issubclass(type(c), types.CodeType))


@functools.lru_cache(maxsize=1)
def _not_user_names() -> frozenset[str]:
    """What a tensor or ctx answers itself: never a user attribute."""
    from torch.autograd.function import BackwardCFunction, FunctionCtx

    return frozenset(dir(torch.Tensor)) | frozenset(dir(BackwardCFunction)) | frozenset(dir(FunctionCtx))


@functools.lru_cache(maxsize=512)
def _loaded_names(code: types.CodeType) -> frozenset[str]:
    """Every attribute name ``code`` (and code nested in it) loads, but along a chain from a
    global or a closure's cell (``torch.empty_like``, ``F.gelu``, ``lin.weight``: such a chain
    is a read of its own, guarded where it is read), and, where it names ``getattr`` or
    ``hasattr``, its identifier constants (``getattr(w, "tag", 1.0)``)."""
    found: set[str] = set()
    from_named = False
    for i in dis.get_instructions(code):
        if i.opname in ("LOAD_ATTR", "LOAD_METHOD"):  # (one of such a chain keeps it one)
            if not from_named:
                found.add(str(i.argval))
        else:
            from_named = i.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF")
    spelled = "getattr" in code.co_names or "hasattr" in code.co_names
    for const in code.co_consts:
        if spelled and issubclass(type(const), str) and const.isidentifier():
            found.add(const)
        elif issubclass(type(const), types.CodeType):
            found |= _loaded_names(const)
    return frozenset(found)


def tensor_attribute_reads(analysed: tuple[tuple[str, Any, Any, Any], ...], args: tuple[Any, ...],
                           argnames: tuple[str, ...], ctx: Any) -> list[tuple[Place, types.CodeType | None]]:
    """Backward's read places ``arg.__dict__`` (of the names it may read) of each tensor argument."""
    # Every tensor argument, with attributes or not: one may be set between forward and
    # ``.backward()`` (``getattr(w, "tag", 1.0)`` read then, missing at the call).
    tensors = [i for i, a in enumerate(args) if issubclass(type(a), torch.Tensor)]
    if not tensors:
        return []
    skip = _not_user_names() | frozenset(vars(ctx))
    codes = [code for phase, fn, _facts, _params in analysed
             if phase == "backward" and (code := code_of(fn)) is not None]
    names = tuple(sorted(frozenset().union(*map(_loaded_names, codes)) - skip))
    if not names:
        return []
    # One read per tensor argument, of all those names at once: what it holds of them (for a
    # tensor without attributes, the usual case, an empty ``__dict__`` answers at once).
    found: list[tuple[Place, types.CodeType | None]] = []
    for i in tensors:
        root = Root("arg", i, argname(i, argnames), lambda call, i=i: call[i])
        found.append((Place(root, (("attr", "__dict__"),), read=_reader(i, names)), codes[0]))
    return found


def _reader(i: int, names: tuple[str, ...]) -> Any:
    """``call -> ((name, value), ...)``: which of ``names`` argument ``i`` holds, with their values."""
    def held(call: tuple[Any, ...]) -> tuple[tuple[str, Any], ...]:
        tensor = call[i]
        if not tensor.__dict__:
            return ()
        attrs = tensor_attributes(tensor)
        return tuple((name, attrs[name]) for name in names if name in attrs)
    return held


def as_called(fake_args: tuple[Any, ...], call_args: tuple[Any, ...]) -> None:
    """Before backward is traced again for a call: each tensor argument's fake carries the
    attributes the call's tensor has now (a value read there is what eager's backward reads)."""
    for fake, real in zip(fake_args, call_args):
        if issubclass(type(fake), torch.Tensor) and issubclass(type(real), torch.Tensor) and fake is not real:
            now, want = tensor_attributes(fake), tensor_attributes(real)
            for name in now.keys() - want.keys():
                del_attr(fake, name)
            for name, value in want.items():
                set_attr(fake, name, value)


@contextlib.contextmanager
def saved_outputs_bare(saved: Any, outputs: list[Any], args: tuple[Any, ...]) -> Iterator[None]:
    """While backward is traced: each tensor ``save_for_backward`` got that forward also returns
    (not an argument) shows none of the attributes forward set on it, as eager's unpacked one
    (``y.n = 3; ctx.save_for_backward(y); return y``: backward's ``y.n`` is eager's
    ``AttributeError``). Put back however backward ended."""
    returned = {id(o) for o in outputs if issubclass(type(o), torch.Tensor)} - {id(a) for a in args}
    hidden = []
    for t in saved or ():
        if issubclass(type(t), torch.Tensor) and id(t) in returned and not any(t is h for h, _ in hidden):
            attrs = tensor_attributes(t)
            if attrs:
                hidden.append((t, attrs))
                for name in attrs:
                    del_attr(t, name)
    try:
        yield
    finally:
        for t, attrs in hidden:
            for name, value in attrs.items():
                set_attr(t, name, value)
