"""The user's backward run for real, on a ctx rebuilt from the trace (``fallback="eager"``).

Place in the pipeline: tracer (``trace_function`` hands an ``EagerBackward`` to the raw capture
as ``RawCapture.eager_backward``; the pipeline gives it to the runtime under ``fallback="eager"``).

Forward ran captured; backward, traced again for this call (its grads, or a Python value it
reads, differ from the captured backward's), was refused: it reads a forward tensor forward did
not save, takes a Python value from a dynamic size, calls what minihop cannot trace. Eager
would still run the user's backward, so under ``fallback="eager"`` minihop runs it too, on the
real grads, with a ctx holding what eager's ctx would hold for this call: the trace's ctx as
forward left it, each fake tensor replaced by the real value this call's forward made (a saved
value, or an input fetched from its place), each argument object by the call's own, each
number of symbolic sizes by its value for this call. Its Python writes and messages are made
by the user's code itself, as in eager.

What cannot be rebuilt for the call (a forward tensor the fwd graph did not keep, a number
whose symbols this call does not give) is refused with a coded error, never guessed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.autograd.function import FunctionCtx, once_differentiable

from ..errors import MinihopError, UnsupportedOperationError
from ..library_state import own_dict
from ..structure import attributes, iter_leaves, make_getter, replace_tensors
from ..returned import describe_output
from .function_parts import FunctionParts, function_parts
from .session import Tracing

__all__ = ["EagerBackward", "RebuiltCtx"]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class RebuiltCtx(FunctionCtx):
    """What the user's backward sees as ctx when minihop runs it eagerly: forward's attributes,
    ``saved_tensors`` and ``needs_input_grad`` as eager's ctx has them for this call."""

    def __init__(self, saved: tuple[Any, ...], needs_input_grad: tuple[bool, ...]) -> None:
        self._minihop_saved = saved
        self.needs_input_grad = needs_input_grad

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        return self._minihop_saved


class EagerBackward:
    """The user's backward, run for real for one call of a capture: ``rebuild`` makes the ctx
    eager's forward would have left for the call, ``run`` runs backward on it."""

    def __init__(self, t: Tracing, parts: FunctionParts, ctx: Any, out: Any, fake_args: tuple[Any, ...]) -> None:
        self.t, self.parts, self.ctx, self.out, self.fake_args = t, parts, ctx, out, fake_args

    def backward(self, *args: Any) -> Any:
        """The user's backward as autograd resolves it now (rebound since forward: the new one), as
        written (``parts`` traces the function under @once_differentiable)."""
        parts = function_parts(self.t.fn_cls)
        if getattr(self.t, "boxed_at_forward", False) or getattr(self.t.fn_cls, "boxed_grads_call", False):  # (one list)
            args = (args[0], list(args[1:]))
        return (once_differentiable(parts.backward) if parts.once_differentiable else parts.backward)(*args)

    def rebuild(self, call_args: tuple[Any, ...], saved: Mapping[fx.Node, Any], reason: str) -> RebuiltCtx:
        """The ctx for a call: ``saved`` the call's saved values by raw fwd node,
        ``call_args`` its bound arguments; ``reason`` why backward runs eagerly (for errors)."""
        rebuild = _Rebuild(self.t, self.parts.name, self.fake_args, call_args, saved, reason)
        with self.t.ctx_after_forward:
            record = self.ctx._minihop_record
            real_ctx = RebuiltCtx(tuple(rebuild(v) for v in (record.saved or ())), record.needs_input_grad)
            for name, value in vars(self.ctx).items():
                if not name.startswith("_minihop"):
                    setattr(real_ctx, name, rebuild(value))
        return real_ctx

    def check(self) -> None:
        """Refuse now, at capture, what no call could rebuild: a tensor on ctx that forward never
        used in an op (a global's, a closure's): the trace holds the real one, with no record
        of where eager's forward takes it from on a later call. (``fallback="eager"`` then
        runs the Function eagerly, forward too.)"""
        t = self.t
        for name, value in vars(self.ctx).items():
            if name.startswith("_minihop"):
                continue
            for _, leaf in iter_leaves(value):
                if not issubclass(type(leaf), torch.Tensor):
                    continue
                fake = leaf if t.is_traced(leaf) else t.real_to_fake.get(id(leaf))
                if fake is None or (t.input_nodes.get(id(fake)) or t.fwd.node_of.get(id(fake))) is None:
                    raise UnsupportedOperationError(
                        f"{self.parts.name}.forward puts on ctx.{name} a tensor it never uses in an op "
                        f"(of shape {list(leaf.shape)}), and its backward may be traced again after "
                        "forward ran, or run eagerly (fallback='eager').",
                        "The captured forward does not keep such a tensor, and the trace has no record "
                        "of where a later call's forward would take it from.",
                        "Use it in forward (ctx.w = W.clone(), or save it with save_for_backward), or "
                        "run the Function itself (F.apply).")

    def run(self, real_ctx: RebuiltCtx, grads: Sequence[Any]) -> tuple[Any, ...]:
        """The user's backward on ``real_ctx`` and ``grads`` (one per fwd output): one gradient
        per forward argument (trailing Nones past them dropped, as eager's autograd does)."""
        n = len(self.fake_args)
        result = self.backward(real_ctx, *_user_grads(self.out, grads))
        result = result if issubclass(type(result), tuple) else (result,)
        if len(result) > n and all(g is None for g in result[n:]):
            result = result[:n]
        if len(result) != n:
            raise RuntimeError(f"function {self.parts.name}Backward returned an incorrect number of gradients "
                               f"(expected {n}, got {len(result)})")
        return result


def _user_grads(out: Any, grads: Sequence[Any]) -> list[Any]:
    """One grad per top-level item of forward's return value, as eager hands them (None for
    an item that is not a tensor)."""
    found: list[Any] = []
    flat = 0
    for item in (list(out) if issubclass(type(out), tuple) else [out]):
        found.append(grads[flat] if issubclass(type(item), torch.Tensor) else None)
        leaves: list[Any] = []
        describe_output(item, lambda v, _top: leaves.append(v) or 0, level=2)
        flat += len(leaves)
    return found


class _Rebuild:
    """A value on the trace's ctx as this call's forward would have left it."""

    def __init__(self, t: Tracing, name: str, fake_args: tuple[Any, ...], call_args: tuple[Any, ...],
                 saved: Mapping[fx.Node, Any], reason: str) -> None:
        self.t, self.name, self.reason = t, name, reason
        self.saved = saved
        self.call_args = call_args
        # A non-tensor argument object (or its copy with fake tensors) -> the call's own.
        self.args = {id(f): c for f, c in zip(fake_args, call_args) if not issubclass(type(f), torch.Tensor)}
        self.made: dict[int, Any] = {}

    def __call__(self, value: Any) -> Any:
        if id(value) in self.args:
            return self.args[id(value)]
        if issubclass(type(value), torch.Tensor):
            return self.tensor(value)
        if issubclass(type(value), _SYMBOLIC):
            return self.number(value)
        if id(value) in self.made:
            return self.made[id(value)]
        if type(value) is torch.Size:
            return torch.Size(self(v) for v in value)
        if type(value) is tuple or (issubclass(type(value), tuple) and hasattr(value, "_fields")):
            items = [self(v) for v in value]
            return value if all(a is b for a, b in zip(items, value)) else (
                type(value)(*items) if hasattr(value, "_fields") else tuple(items))
        if type(value) is list:
            new: list[Any] = []
            self.made[id(value)] = new
            new.extend(self(v) for v in value)
            return new
        if type(value) is dict:
            new_dict: dict[Any, Any] = {}
            self.made[id(value)] = new_dict
            new_dict.update((k, self(v)) for k, v in value.items())
            return new_dict
        # Another object forward left (a user object holding tensors or sizes): a shallow copy
        # with each value rebuilt (forward made it: eager's ctx holds a new one on each call).
        if _holds_symbolic(value):
            return self.object(value)
        return replace_tensors(value, lambda _path, x: self.tensor(x))

    def object(self, value: Any) -> Any:
        """A copy of the object ``value`` with each attribute rebuilt for the call."""
        try:
            new = copy.copy(value)
            self.made[id(value)] = new
            for name, held in attributes(value).items():
                object.__setattr__(new, name, self(held))
        except MinihopError:
            raise
        except Exception:
            self.refuse(f"a number of dynamic sizes inside a {type(value).__name__} on ctx, which cannot be copied")
        return new

    def tensor(self, value: torch.Tensor) -> Any:
        t = self.t
        fake = value if t.is_traced(value) else t.real_to_fake.get(id(value))
        if fake is None:
            self.refuse(f"a tensor on ctx that forward never used in an op (of shape {list(value.shape)})")
        node = t.input_nodes.get(id(fake)) or t.fwd.node_of.get(id(fake))
        if node in self.saved:
            return self.saved[node]
        source = t.placeholder_sources.get(node) if node is not None else None
        if source is not None and source.constant is not None:
            return source.constant
        if source is not None and source.path is not None and self.call_args:
            return make_getter(source.path)(self.call_args, {})
        self.refuse(f"a forward tensor on ctx ({node.name if node is not None else 'unnamed'}) that the "
                    "captured forward did not keep")

    def number(self, value: Any) -> Any:
        expr = value.node.expr
        places = {}
        for symbol in expr.free_symbols:
            found = self.t.symbol_sources.get(symbol)
            if found is None or found[0].path is None or not self.call_args:
                self.refuse(f"a number of dynamic sizes on ctx ({value}) this call does not give")
            source, dim, _ = found
            held = make_getter(source.path)(self.call_args, {})
            places[symbol] = held if dim is None else held.size(dim)
        exact = expr.xreplace({s: sympy.Integer(v) for s, v in places.items()})
        kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)]
        return kind(exact)

    def refuse(self, found: str) -> Any:
        raise UnsupportedOperationError(
            f"{self.name}.backward could not be traced again for this call ({self.reason}), and "
            f"running it eagerly (fallback='eager') needs {found}.",
            "Forward ran captured; it kept only what its graphs need, so eager's ctx cannot be "
            "rebuilt for this call.",
            "Make backward read the same forward values whatever its grads and the Python "
            "values it reads are, or run the Function itself (F.apply).")


def _holds_symbolic(value: Any, depth: int = 3) -> bool:
    """Whether ``value``'s attributes or items, a few levels down, hold a symbolic number."""
    if issubclass(type(value), _SYMBOLIC):
        return True
    if depth == 0 or issubclass(type(value), (torch.Tensor, str, bytes, int, float, bool, type(None))):
        return False
    if issubclass(type(value), (tuple, list, set, frozenset)):
        return any(_holds_symbolic(v, depth - 1) for v in value)
    if issubclass(type(value), dict):
        return any(_holds_symbolic(v, depth - 1) for v in value.values())
    held = own_dict(value)
    return issubclass(type(held), dict) and any(_holds_symbolic(v, depth - 1) for v in held.values())
