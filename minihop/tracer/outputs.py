"""Forward's return value: what it may hold, and the tensors it left outside it.

Place in the pipeline: tracer, called by ``trace._trace_body`` once forward has run, while its
outputs are flattened into fwd outputs: values no graph can pass are refused (tensors in sets,
iterators, numbers read from data), a tensor forward put outside its return value (an
attribute, a global container) becomes a hidden fwd output with the write the runtime repeats
(``OutsideWrite``), and returned tensors eager's autograd would treat otherwise are refused.

Invariant: every tensor forward leaves where the caller can reach it is a fwd output (hidden if
not returned) or was made before the call; nothing returned is a fake the graphs cannot make.
"""

from __future__ import annotations

import collections.abc
import enum
import types
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..errors import InplaceInputError, UnsupportedArgumentError, UnsupportedOutputError
from ..spec import OutsideWrite
from ..library_state import own_dict
from ..structure import format_path, iter_leaves
from .function_parts import FunctionParts
from .outside import OutsideTensor
from .session import Tracing

__all__ = ["check_returned", "hidden_outputs", "refuse_hidden_tensors", "refuse_returned_state",
           "refuse_unbacked_numbers", "saved_node"]


def hidden_outputs(t: Tracing, found: tuple[OutsideTensor, ...],
                   flat: list[torch.Tensor],
                   top: list[bool], fake_args: tuple[Any, ...]) -> tuple[OutsideWrite, ...]:
    """Each tensor forward put outside its return value becomes a hidden fwd output (appended
    to ``flat``, not top-level); returns the writes the runtime repeats on every call."""
    arg_ids = {id(a) for a in fake_args if issubclass(type(a), torch.Tensor)}
    index = {id(v): i for i, v in enumerate(flat)
             if not (top[i] and id(v) in arg_ids)}  # an input returned as is comes back as a view
    writes: list[OutsideWrite] = []
    for w in found:
        if not t.is_traced(w.value):
            writes.append(OutsideWrite(w.location, None, w.value))
            continue
        i = index.get(id(w.value))
        if i is None:
            flat.append(w.value)
            top.append(False)
            i = index[id(w.value)] = len(flat) - 1
        writes.append(OutsideWrite(w.location, i))
    return tuple(writes)


def refuse_returned_state(name: str, out: Any, before: dict[int, Any], argnames: tuple[str, ...],
                          from_args: dict[int, Any], ctx: Any = None) -> None:
    """A mutable value forward returns that existed before it and is no argument's (a global
    dict, an object a global holds): eager's caller gets that very object, a capture's output
    is rebuilt from the traced one on every call (a copy, or the traced call's object). Refused.
    (An argument's is the call's own, ``from_args``; what forward made itself is made afresh
    for each call: ``OutputSpec.rebuild``.)"""
    # What forward keeps on ctx (``ctx.info = info``, in a list there too): eager's backward
    # reads the very object the caller got, edits included; a capture's are two.
    on_ctx: set[int] = set()
    stack = [v for k, v in vars(ctx).items() if not k.startswith("_minihop")] if ctx is not None else []
    while stack:
        v = stack.pop()
        if issubclass(type(v), (list, dict, set)) or own_dict(v) is not None and not issubclass(type(v), (type, torch.nn.Module, *_IMMUTABLE)):
            if id(v) not in on_ctx and len(on_ctx) < 1000:
                on_ctx.add(id(v))
                stack += list(v.values()) if issubclass(type(v), dict) else list(v) if issubclass(type(v), (list, set)) else []
        elif issubclass(type(v), tuple):
            stack += list(v)
    todo, seen = [((), out)], set()
    while todo:
        path, value = todo.pop()
        if id(value) in seen or issubclass(type(value), (torch.Tensor, *_IMMUTABLE)) or \
                id(value) in from_args and not issubclass(type(value), tuple):
            continue  # (an argument's own object is returned as the call's: OutputSpec "arg")
        seen.add(id(value))
        if id(value) in on_ctx and not issubclass(type(value), tuple):
            raise UnsupportedOutputError(
                f"{name}.forward returns, at output{format_path(path, argnames)}, a {type(value).__name__} "
                "it also keeps on ctx.",
                "Eager's backward reads that very object, with the caller's edits to the returned one; "
                "a capture rebuilds its outputs on every call, so the two would be different objects.",
                "Keep a copy on ctx (ctx.info = dict(info)), or run it eagerly with "
                "minihop.function(F, fallback='eager').")
        entry = before.get(id(value))
        if entry is not None and entry.obj is value and not issubclass(type(value), tuple):
            raise UnsupportedOutputError(
                f"{name}.forward returns, at output{format_path(path, argnames)}, a {type(value).__name__} "
                "that existed before the call (a global's, or one the caller holds).",
                "Eager returns that very object, so the caller's edits to it are edits to the "
                "original; a capture rebuilds its outputs on every call and would hand out another.",
                "Return a copy made in forward (list(opts), dict(cfg)), return only tensors and "
                "values made in forward, or run it eagerly with minihop.function(F, fallback='eager').")
        if issubclass(type(value), (tuple, list, set, frozenset)):
            todo += [((*path, ("item", i)), v) for i, v in enumerate(value)]
        elif issubclass(type(value), dict):
            todo += [((*path, ("key", k)), v) for k, v in value.items()]
        elif own_dict(value) is not None and not issubclass(type(value), (type, torch.nn.Module)):
            todo += [((*path, ("attr", k)), v) for k, v in own_dict(value).items()]


_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), type, torch.dtype, torch.device,
              torch.Size, torch.nn.Module, enum.Enum, types.ModuleType, types.FunctionType,
              types.BuiltinFunctionType, types.MethodType)


def refuse_unbacked_numbers(t: Tracing, out: Any) -> None:
    """A number read from data returned as a Python value would be replayed as its symbol:
    its read becomes a value read (``Retrace``), or the trace is refused."""
    for _path, leaf in iter_leaves((out,)):
        if issubclass(type(leaf), (torch.SymInt, torch.SymFloat, torch.SymBool)) and free_unbacked_symbols(leaf):
            raise t.unbacked.escape(leaf.node.expr, None, "forward returns it as a Python number")


def saved_node(t: Tracing, value: Any) -> fx.Node | None:
    """The fwd node of a value passed to ``ctx.save_for_backward`` (None for None)."""
    if not issubclass(type(value), torch.Tensor):
        return None
    node = t.fwd.node_of.get(id(value))
    if node is None and id(value) in t.sources:
        node = t.input_node(value)  # an input forward only saved
    return node


def refuse_hidden_tensors(parts: FunctionParts, values: tuple[Any, ...], what: str) -> None:
    """Tensors inside sets (or other unordered containers) cannot be passed through a graph."""
    for path, leaf in iter_leaves(values):
        if what == "output" and issubclass(type(leaf), collections.abc.Iterator):
            raise UnsupportedOutputError(
                f"{parts.name}.forward returns a {type(leaf).__name__} (an iterator).",
                "An iterator made while tracing runs on minihop's fake tensors; replaying the "
                "graphs cannot make it again, so it would hand out fake values.",
                "Return a tuple or list (tuple(gen)) instead.")
        if issubclass(type(leaf), (set, frozenset)) and any(issubclass(type(v), torch.Tensor) for v in leaf):
            where = (format_path((("arg", path[0][1]), *path[1:]), parts.argnames) if what == "argument"
                     else "the returned value")
            error = UnsupportedArgumentError if what == "argument" else UnsupportedOutputError
            raise error(
                f"{parts.name} {'gets' if what == 'argument' else 'returns'} a "
                f"{type(leaf).__name__} holding tensors ({where or 'forward output'}).",
                "A set has no order, so its tensors cannot be matched to graph inputs or "
                "outputs from one call to the next.",
                "Use a tuple, list or dict instead.")


def check_returned(t: Tracing, parts: FunctionParts, flat: list[torch.Tensor], top: list[bool],
                   dirty: Any, where: str | None, arg_ids: set[int]) -> None:
    """Refuse what forward returned that eager's autograd would treat otherwise: a tensor it
    reached outside its arguments (lifted) or never passed to an op (a global returned as
    is), returned as is; an input marked dirty but not returned (eager raises)."""
    for v, is_top in zip(flat, top, strict=True):
        source = t.sources.get(id(v))
        if source is None and id(v) not in arg_ids and id(v) not in t.fwd.node_of:
            # No op of the trace made it and no argument is it: a tensor held outside
            # (``return y, BUF``), which eager returns itself (at the top level, made an
            # output of the node in place).
            raise UnsupportedOutputError(
                f"{parts.name}.forward returns a tensor it neither made nor was given "
                f"({_held_name(parts.forward, v)}){'' if is_top else ' inside a container'}.",
                "Eager returns that very tensor (at the top level, it rewrites the tensor's own "
                "autograd history in place: it becomes the output of the Function's node); a "
                "capture returns tensors its graph makes, so it would return another one.",
                "Return a copy of it (.clone()), or pass the tensor as a direct argument.",
                where=where)
        if is_top and source is not None and source.lifted:
            raise UnsupportedOutputError(
                f"{parts.name}.forward returns {source.description}, a tensor it reached "
                "through an object, container, closure or module, as one of its outputs.",
                "Eager does not see that tensor as an input, so it rewrites the tensor's own "
                "autograd history in place (it stops being a leaf); minihop does not copy that.",
                f"Return {source.description}.clone(), or pass the tensor as a direct argument.",
                where=where)
    returned_ids = {id(v) for v, is_top in zip(flat, top, strict=True) if is_top}
    if any(id(d) not in returned_ids for d in dirty):
        raise InplaceInputError(
            f"{parts.name}.forward marks an input dirty (ctx.mark_dirty) but does not return it.",
            "Eager raises 'Some elements marked as dirty during the forward method were not "
            "returned as output': autograd rewrites a dirty input's history through the "
            "Function's outputs, so it must be one.",
            "Return the modified input as one of forward's outputs.",
            where=where)


def _held_name(forward: Any, value: Any) -> str:
    """A name forward's module gives ``value`` (for the message), else what it is."""
    fn = getattr(forward, "__func__", forward)
    for name, held in getattr(fn, "__globals__", {}).items():
        if held is value:
            return f"the global {name}"
    return "a tensor held outside the call"
