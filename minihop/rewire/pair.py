"""Turn the two raw traces into one consistent (fwd, bwd) pair.

Place in the pipeline: rewire (pure). Input: a ``RawCapture`` (the tracer's raw graphs, which
are only read). Output: a frozen ``Pair`` with two fresh ``GraphModule``s built node by node:

    fwd(*fwd_inputs)          -> ((out_0, ..., out_k), (saved_0, ..., saved_m))
    bwd(*grads_0..k, *saved)  -> (grad for fwd input 0, ..., grad for fwd input n)

Postcondition: ``check_consistent(pair.fwd, pair.bwd)`` holds (checked before returning).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..fxgraph import rename_node
from ..graph_names import grad_name, late_name, range_check_name, saved_name, unused_grad_name
from ..spec import GRAD_TOGGLE, RANGE_CHECK, Pair, RawCapture
from ..fxgraph import append_node
from .contract import check_consistent

__all__ = ["make_pair"]

_SET_GRAD = torch._C._set_grad_enabled
_ASSERT = torch.ops.aten._assert_scalar.default


def _copy_body(src: fx.Graph, dst: fx.Graph, env: dict[fx.Node, fx.Node], names: dict[fx.Node, str]) -> None:
    """Copy every non-placeholder node of ``src`` into ``dst`` in order, renaming by hint.

    A range check's nodes (``RANGE_CHECK``) are named last, among the names the rest of the
    body took, as Dynamo's runtime-assert pass names the nodes it adds to a finished body."""
    late: list[fx.Node] = []
    for node in src.nodes:
        if node.op in ("placeholder", "output"):
            continue
        name = late_name(len(late)) if RANGE_CHECK in node.meta else names.get(node, node.name)
        new = append_node(dst, node.op, node.target, fx.map_arg(node.args, env.__getitem__),
                          fx.map_arg(node.kwargs, env.__getitem__), name)
        new.meta = dict(node.meta)
        env[node] = new
        if RANGE_CHECK in node.meta:
            late.append(node)
    for node in late:
        new = env[node]
        rename_node(new, range_check_name(node.name))
        if new.target is _ASSERT:  # its message names the comparison as this body does
            new.args = (new.args[0], f"Runtime assertion failed for expression "
                                     f"{node.meta[RANGE_CHECK]} on node '{new.args[0]}'")


def _grad_toggle(graph: fx.Graph, enabled: bool) -> None:
    node = append_node(graph, "call_function", _SET_GRAD, (enabled,), {})
    node.meta[GRAD_TOGGLE] = True


def _sum_to_input(graph: fx.Graph, grad: fx.Node, input_val: object) -> fx.Node:
    """``grad.sum_to_size(input's shape)`` where the shapes differ (a broadcast gradient)."""
    val = grad.meta.get("val")
    if not (issubclass(type(val), torch.Tensor) and issubclass(type(input_val), torch.Tensor)) or val.shape == input_val.shape:
        return grad
    reduced = append_node(graph, "call_method", "sum_to_size", (grad, tuple(input_val.shape)), {})
    reduced.meta = {"val": input_val}
    return reduced


def _ctx_saved_refs(raw: RawCapture, fenv: dict[fx.Node, fx.Node], fwd: fx.Graph,
                    saved_fwd: list[fx.Node]) -> tuple[tuple[str, int] | None, ...]:
    """What the user passed to ``ctx.save_for_backward``, as runtime references.

    Each entry is ``("saved", i)`` (a value bwd reads), ``("input", j)`` or ``("output", k)``
    (a fwd input or output bwd does not read), or None (the user saved None). The runtime
    saves exactly these through its ctx, so eager's version checks and ``saved_tensors_hooks``
    see what they would in eager. An intermediate bwd never reads is not kept (it is not
    available after fwd); that is the one place minihop saves less than eager.
    """
    placeholders = [n for n in fwd.nodes if n.op == "placeholder"]
    outputs = fwd.output_node().args[0][0]
    refs: list[tuple[str, int] | None] = []
    for node in raw.saved_for_backward:
        if node is None:
            refs.append(None)
        elif node in saved_fwd:
            refs.append(("saved", saved_fwd.index(node)))
        elif fenv.get(node) in placeholders:
            refs.append(("input", placeholders.index(fenv[node])))
        elif fenv.get(node) in outputs:
            refs.append(("output", list(outputs).index(fenv[node])))
    return tuple(refs)


def make_pair(raw: RawCapture) -> Pair:
    """Build the consistent pair from ``raw`` (which is not modified)."""
    # ---- forward: inputs in first-use order, body, grad mode restored, view_as, outputs --
    fwd = fx.Graph()
    fenv: dict[fx.Node, fx.Node] = {}
    for node, source in raw.fwd_inputs:
        fenv[node] = append_node(fwd, "placeholder", source.name, (), {})
        fenv[node].meta = dict(node.meta)
    _grad_toggle(fwd, False)
    _copy_body(raw.fwd_graph, fwd, fenv, raw.names)
    _grad_toggle(fwd, True)
    outs: list[fx.Node] = []
    for i, (node, aliased) in enumerate(zip(raw.fwd_outputs, raw.aliased, strict=True)):
        new = fenv[node]
        if aliased:
            # Eager returns an input passed straight through as a view of it (y is not x),
            # or, when it is marked non-differentiable, as a detached alias of it.
            method = "detach" if i in raw.non_differentiable_idx else "view_as"
            view = append_node(fwd, "call_method", method, (new,) if method == "detach" else (new, new), {})
            view.meta = {"val": new.meta.get("val"), "stack_trace": raw.return_trace}
            new = view
        outs.append(new)
    saved_fwd = list(dict.fromkeys(fwd_node for _, fwd_node in raw.bwd_saved))  # in first-read order
    # Every call the user made stays, used or not, as in Dynamo's bodies and as eager runs it
    # (a random draw nobody reads still advances the generator).
    append_node(fwd, "output", "output", ((tuple(outs), tuple(fenv[n] for n in saved_fwd)),), {})

    # ---- backward: grads (unused_N where never read), saved, body, per-input grads ------
    bwd = fx.Graph()
    benv: dict[fx.Node, fx.Node] = {}
    unused = 0
    for i, node in enumerate(raw.grad_inputs):
        if node is None:
            placeholder = append_node(bwd, "placeholder", unused_grad_name(unused), (), {})
            # A grad backward was handed as a tensor (a top-level output's; with
            # set_materialize_grads(False) too, as this trace hands it) says what it would be,
            # shape and dtype, as Dynamo's placeholder does; one handed as None (an output
            # inside a container, or a retrace for a call whose grad was None) says nothing.
            if raw.grad_handed[i] and "val" in outs[i].meta:
                placeholder.meta["val"] = outs[i].meta["val"]
            unused += 1
            continue
        placeholder = append_node(bwd, "placeholder", grad_name(i, raw.grad_names[i]), (), {})
        placeholder.meta = dict(node.meta)
        benv[node] = placeholder
    saved_placeholder: dict[fx.Node, fx.Node] = {}
    for fwd_node in saved_fwd:
        placeholder = append_node(bwd, "placeholder", saved_name(fenv[fwd_node].name), (), {})
        placeholder.meta = dict(fenv[fwd_node].meta)
        saved_placeholder[fwd_node] = placeholder
    for bnode, fwd_node in raw.bwd_saved:
        benv[bnode] = saved_placeholder[fwd_node]
    _grad_toggle(bwd, False)
    _copy_body(raw.bwd_graph, bwd, benv, raw.names)
    grads_by_input: dict[fx.Node, list[fx.Node]] = {}
    for arg_node, grad in zip(raw.arg_inputs, raw.arg_grads, strict=True):
        if arg_node is not None and grad is not None:
            grads_by_input.setdefault(arg_node, []).append(benv[grad])
    results: list[fx.Node | None] = []
    for node, _source in raw.fwd_inputs:
        parts = grads_by_input.get(node)
        val = node.meta.get("val")
        if issubclass(type(val), torch.Tensor) and not (val.dtype.is_floating_point or val.dtype.is_complex):
            parts = None  # an integer input has no gradient; eager drops one returned for it
        if not parts:
            results.append(None)
            continue
        if len(parts) > 1:
            # The same tensor passed as two arguments: eager reduces each gradient to the
            # input's shape, then accumulates them.
            parts = [_sum_to_input(bwd, p, val) for p in parts]
        total = parts[0]
        for extra in parts[1:]:
            total = append_node(bwd, "call_function", operator.add, (total, extra), {})
            total.meta = dict(extra.meta)
        results.append(total)
    _grad_toggle(bwd, True)
    append_node(bwd, "output", "output", (tuple(results),), {})

    ctx_saved = _ctx_saved_refs(raw, fenv, fwd, saved_fwd)
    pair = Pair(
        function_name=raw.function_name, fwd_graph=fwd, bwd_graph=bwd,
        inputs=tuple(source for _, source in raw.fwd_inputs),
        top_level=raw.top_level, non_differentiable_idx=raw.non_differentiable_idx,
        dirty_idx=raw.dirty_idx,
        saved_for_backward_idx=tuple(sorted({ref[1] for ref in ctx_saved if ref and ref[0] == "saved"})),
        ctx_saved=ctx_saved,
        num_saved=len(saved_fwd), output_spec=raw.output_spec,
        materialize_grads=raw.materialize_grads, argnames=raw.argnames,
        once_differentiable=raw.once_differentiable, grad_assumptions=raw.grad_assumptions,
        saved_reads=raw.saved_reads,
        saved_names=tuple(fenv[n].name for n in saved_fwd),
        outside_writes=raw.outside_writes, saved_fwd_nodes=tuple(saved_fwd),
    )
    check_consistent(fwd, bwd)
    return pair

