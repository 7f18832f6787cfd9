"""The pair as a ``setup_context``-style Function, for torch.func transforms.

Place in the pipeline: runtime (``function.make_function`` adds it to a capture of a
``setup_context``-style Function as ``transformable``; the capture's runner uses it while a
torch.func transform is active). Its backward is the capture's own (``call_bwd``: the same bwd
variants), so a transform sees what eager's Function gives it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import UnsupportedOperationError
from ..spec import Pair
from .codegen import emit

__all__ = ["calling", "make_transformable"]

_set_grad = torch._C._set_grad_enabled
_is_grad = torch.is_grad_enabled
_CALLING = threading.local()  # the user's arguments of the call being applied (``calling``)


@contextlib.contextmanager
def calling(args: tuple[Any, ...]) -> Iterator[None]:
    """While the runner applies the transformable class for a call: ``setup_context`` keeps
    the user's arguments on ctx, where backward's places rooted at an argument (a late read,
    a tensor argument's attribute) are fetched, as the plain path passes them."""
    outer = getattr(_CALLING, "args", ())
    _CALLING.args = args
    try:
        yield
    finally:
        _CALLING.args = outer


def make_transformable(pair: Pair, call_bwd: Callable[..., tuple[tuple[Any, ...], Any]],
                       generate_vmap_rule: bool) -> type[torch.autograd.Function]:
    """The pair as a ``setup_context``-style Function, for torch.func transforms.

    torch.func (grad, vjp, vmap, ...) runs a Function's ``forward`` without a ctx and then
    ``setup_context(ctx, inputs, output)``; whatever backward needs must therefore reach
    ``setup_context`` through ``inputs`` or ``output``. So this class's forward returns
    ``(*top-level outputs, *nested outputs, *saved intermediates)``: saved values that are fwd
    inputs or top-level outputs are taken from ``inputs``/``output`` instead; the extras are
    marked non-differentiable, and the caller keeps only the user's outputs. Everything bwd
    reads goes through ``ctx.save_for_backward`` (so vmap batches it).
    """
    fwd_code = emit(pair.fwd_graph, name="fwd_body") or pair.fwd.forward
    out_nodes, saved_nodes = pair.fwd_graph.output_node().args[0]
    placeholders = [n for n in pair.fwd_graph.nodes if n.op == "placeholder"]
    top_idx = tuple(i for i, top in enumerate(pair.top_level) if top)
    nested_idx = tuple(i for i, top in enumerate(pair.top_level) if not top)
    n_top, n_out = len(top_idx), len(pair.top_level)
    order = (*top_idx, *nested_idx)
    # Per saved value: where setup_context finds it.
    where: list[tuple[str, int]] = []
    extra: list[int] = []
    for i, node in enumerate(saved_nodes):
        if node in placeholders:
            where.append(("input", placeholders.index(node)))
        elif node in [out_nodes[j] for j in top_idx]:
            where.append(("output", [out_nodes[j] for j in top_idx].index(node)))
        else:
            where.append(("output", n_out + len(extra)))
            extra.append(i)
    position = {i: p for p, i in enumerate(top_idx)}
    nondiff_pos = tuple(position[i] for i in pair.non_differentiable_idx)
    if pair.dirty_idx:
        dirty_error = UnsupportedOperationError(
            f"{pair.function_name} marks an input dirty (ctx.mark_dirty) and is called under a "
            "torch.func transform.",
            "In-place Functions under torch.func need the dirty input to be returned as the "
            "same tensor at every transform level, which minihop's transform path does not do.",
            "Call it outside the transform, or without the in-place write.")
    else:
        dirty_error = None
    materialize = pair.materialize_grads

    def forward(*inputs: Any) -> tuple[Any, ...]:
        if dirty_error is not None:
            raise dirty_error
        grad_mode = _is_grad()
        try:
            outs, saved = fwd_code(*inputs)
        finally:
            _set_grad(grad_mode)
        return (*[outs[i] for i in order], *[saved[i] for i in extra])

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
        if not materialize:
            ctx.set_materialize_grads(False)
        saved = [inputs[j] if kind == "input" else output[j] for kind, j in where]
        # Python numbers bwd reads (size symbols, with symbolic sizes) are kept on ctx, as a
        # user keeps ``ctx.n = x.shape[0]``: save_for_backward takes tensors only.
        ctx.minihop_numbers = [(i, v) for i, v in enumerate(saved) if not issubclass(type(v), torch.Tensor)]
        # Eager's backward under a transform gets its tensors back as the transform's wrappers,
        # which carry none of the user's attributes (``getattr(w, "k", 1.0)`` reads 1.0 there):
        # backward's places see each tensor argument as a fresh tensor without any.
        ctx.minihop_args = tuple(torch.empty(0) if issubclass(type(a), torch.Tensor) else a
                                 for a in getattr(_CALLING, "args", ()))
        ctx.save_for_backward(*[v for v in saved if issubclass(type(v), torch.Tensor)])
        ctx.mark_non_differentiable(*[v for v in output[n_top:] if issubclass(type(v), torch.Tensor)],
                                    *[output[p] for p in nondiff_pos])

    def backward(ctx: Any, *grads: Any) -> Any:
        saved = list(ctx.saved_tensors)
        for i, v in ctx.minihop_numbers:
            saved.insert(i, v)
        found, writes = call_bwd(grads[:n_top], saved, ctx.minihop_args)
        for write in writes:  # backward's Python writes, as eager's backward makes them
            write.replay(ctx.minihop_args, ctx)
        return found

    # Named as the user's class, as make_function's is: torch's own errors name it ("You tried
    # to vmap over F, but it does not have vmap support"), and should read as eager's do.
    return type(pair.function_name.rsplit(".", 1)[-1], (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
        "generate_vmap_rule": generate_vmap_rule,
        "num_outputs": n_out,
        "order": order,
        "__qualname__": f"Captured[{pair.function_name}].transformable",
        "__module__": __name__,
    })
