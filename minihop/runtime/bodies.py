"""The forward and backward of a capture's ``autograd.Function``, generated per capture.

Place in the pipeline: runtime (``function.make_function`` calls ``generate``). What a
capture's forward and backward must do depends on its pair: which saved values go through
``ctx.save_for_backward`` (exactly what the user saved, in the user's order) and which are
plain ctx attributes (no version check, as in eager); whether some outputs are nested in
returned objects (a sink), marked non-differentiable or dirty; whether backward must pick a
bwd variant (grads unlike the traced ones, Python values it reads, values it takes out of
data) or can call the traced bwd directly. Each is decided here, once per capture, from its
``Layout``, and written as Python source without a branch on it; the source is compiled once
(``codegen.compile_source``) and kept as the Function's ``source`` for reading.

Invariant: the generated code does exactly what eager's ctx does with the user's calls
(version checks and ``saved_tensors_hooks`` unpacks through ``save_for_backward``, marks,
``set_materialize_grads``, one unpack per read of ``ctx.saved_tensors``), and nothing more
than its capture needs: a capture whose user saved bwd's values and marks nothing runs a
forward of two lines and a backward of one.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..spec import GRAD_TOGGLE, Pair
from .codegen import compile_source, emit

__all__ = ["Layout", "generate", "without_body_toggles"]

_set_grad = torch._C._set_grad_enabled


def without_body_toggles(graph: fx.Graph, name: str, **layout: Any) -> Callable[..., Any] | None:
    """Code for ``graph`` without the two ``_set_grad_enabled`` calls that open and close its
    body, or None when the graph also switches grad mode itself (the user's ``no_grad``
    blocks) or cannot be emitted.

    Why: autograd already runs a Function's forward with grad off, and its backward with grad
    on exactly when ``create_graph=True`` (which is what eager's backward sees), so at run time
    the body's own toggles only cost four calls and force a save/restore of grad mode around
    each graph. The graphs keep them (Dynamo's layout).
    """
    toggles = _body_toggles(graph)
    if toggles is None:
        return None
    return emit(graph, skip=lambda node: node in toggles, name=name, **layout)


def _body_toggles(graph: fx.Graph) -> list[fx.Node] | None:
    toggles = [n for n in graph.nodes if n.op == "call_function" and n.target is _set_grad]
    if len(toggles) != 2 or not all(n.meta.get(GRAD_TOGGLE) for n in toggles):
        return None
    return toggles


@dataclasses.dataclass(frozen=True)
class Layout:
    """What one capture's forward and backward do, decided from its pair (see ``of``)."""

    num_inputs: int
    num_outputs: int
    top_idx: tuple[int, ...]        # fwd outputs returned to autograd (the others go to the sink)
    nested_idx: tuple[int, ...]
    single: bool                    # forward returns its one tensor itself
    nondiff_pos: tuple[int, ...]    # positions among the returned outputs
    dirty_pos: tuple[int, ...]
    ctx_refs: tuple[Any, ...]       # what goes through save_for_backward, in the user's order
    stashed: tuple[int, ...]        # saved values kept as a plain ctx attribute
    from_ctx: tuple[tuple[int, int], ...]  # (saved index, position in ctx.saved_tensors)
    all_via_ctx: bool               # the user saved exactly bwd's saved values, in bwd's order
    materialize: bool
    keeps_args: bool                # forward keeps the call's arguments on ctx for backward
    reads: int                      # the user's backward's reads of ctx.saved_tensors
    exact_unpacks: bool             # unpack that many times (not once)
    num_saved: int

    @classmethod
    def of(cls, pair: Pair, keeps_args: bool) -> Layout:
        top_idx = tuple(i for i, top in enumerate(pair.top_level) if top)
        nested_idx = tuple(i for i, top in enumerate(pair.top_level) if not top)
        position = {i: p for p, i in enumerate(top_idx)}
        ctx_refs = pair.ctx_saved
        via_ctx = tuple(pair.saved_for_backward_idx)
        ctx_position = {ref[1]: p for p, ref in reversed(list(enumerate(ctx_refs)))
                        if ref is not None and ref[0] == "saved"}
        plain_ctx = ctx_refs == tuple(("saved", i) for i in via_ctx)
        return cls(
            num_inputs=len(pair.inputs), num_outputs=len(pair.top_level), top_idx=top_idx,
            nested_idx=nested_idx,
            single=len(pair.top_level) == 1 and not nested_idx and pair.output_spec.kind == "tensor",
            nondiff_pos=tuple(position[i] for i in pair.non_differentiable_idx),
            dirty_pos=tuple(position[i] for i in pair.dirty_idx), ctx_refs=ctx_refs,
            stashed=tuple(i for i in range(pair.num_saved) if i not in ctx_position),
            from_ctx=tuple((i, ctx_position[i]) for i in via_ctx),
            all_via_ctx=plain_ctx and via_ctx == tuple(range(pair.num_saved)),
            materialize=pair.materialize_grads, keeps_args=keeps_args, reads=pair.saved_reads,
            exact_unpacks=bool(ctx_refs) and pair.saved_reads != 1, num_saved=pair.num_saved)

    @property
    def ctx_saved_order(self) -> tuple[int, ...] | None:
        """The saved indices the user saved, in the user's order, when each is a saved value
        (not an input or output the graph does not save) or None."""
        if not all(ref is not None and ref[0] == "saved" for ref in self.ctx_refs):
            return None
        return tuple(ref[1] for ref in self.ctx_refs)

    @property
    def direct_order(self) -> tuple[int, ...] | None:
        """bwd's saved values as ``(*ctx.saved_tensors, *ctx.minihop_stash)`` holds them, when
        that is each saved value once (bwd's code can then take them in that order)."""
        order = self.ctx_saved_order
        if order is None:
            return None
        order = (*order, *self.stashed)
        return order if sorted(order) == list(range(self.num_saved)) else None


class _Source:
    """Lines of one generated function, and the objects they name."""

    def __init__(self, header: str) -> None:
        self.lines = [header]
        self.names: dict[str, Any] = {}

    def add(self, line: str, indent: int = 1) -> None:
        self.lines.append("    " * indent + line)

    def name(self, name: str, value: Any) -> str:
        self.names[name] = value
        return name

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _params(n: int, prefix: str) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _forward(pair: Pair, layout: Layout, call_arguments: Callable[[], Any]) -> _Source:
    """``forward(ctx, [sink,] *fwd inputs)``: runs fwd, saves as the user did, marks, returns."""
    L = layout
    inputs = _params(L.num_inputs, "i")
    src = _Source(f"def forward(ctx, {''.join(p + ', ' for p in (['sink'] if L.nested_idx else []) + inputs)}):")
    if not L.materialize:
        src.add("ctx.set_materialize_grads(False)")
    outs_nodes, saved_nodes = pair.fwd_graph.output_node().args[0]
    toggles = _body_toggles(pair.fwd_graph)
    skip = (lambda node: node in toggles) if toggles is not None else (lambda node: False)
    order = L.ctx_saved_order
    body = None
    if order is not None:
        # fwd's code returns what save_for_backward takes and what is stashed, as they are
        # stored: no indexing here.
        parts, targets = [outs_nodes], ["outs"]
        if L.ctx_refs:
            parts.append(tuple(saved_nodes[i] for i in order))
            targets.append("to_save")
        if L.stashed:
            parts.append(tuple(saved_nodes[i] for i in L.stashed))
            targets.append("ctx.minihop_stash")  # plain ctx attributes: no version check, as eager's
        body = emit(pair.fwd_graph, skip=skip, name="fwd_body", output=tuple(parts))
    if body is None:
        body = emit(pair.fwd_graph, skip=skip, name="fwd_body") if toggles is not None else None
        if body is None:
            toggles = None  # the graph's own code, with its toggles
            body = emit(pair.fwd_graph, name="fwd_body") or pair.fwd.forward
        targets = ["outs", "saved"]
    call = f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {src.name('fwd_body', body)}({', '.join(inputs)})"
    if toggles is not None:
        src.add(call)  # autograd runs forward with grad off: the body's toggles are not needed
    else:
        src.add("grad_mode = is_grad()")
        src.names.update(is_grad=torch.is_grad_enabled, set_grad=_set_grad)
        src.add("try:")
        src.add(call, 2)
        src.add("finally:")
        src.add("set_grad(grad_mode)  # the graph's own toggle restores True; keep autograd's mode", 2)
    if targets == ["outs", "saved"]:
        pick = {"saved": "saved", "input": None, "output": "outs"}
        refs = ["None" if ref is None else (inputs[ref[1]] if ref[0] == "input" else f"{pick[ref[0]]}[{ref[1]}]")
                for ref in L.ctx_refs]
        if refs:
            src.add(f"ctx.save_for_backward({', '.join(refs)})")
        if L.stashed:
            # Values eager keeps as plain ctx attributes: no version-counter check, as in eager.
            src.add(f"ctx.minihop_stash = [{', '.join(f'saved[{i}]' for i in L.stashed)}]")
    elif L.ctx_refs:
        src.add("ctx.save_for_backward(*to_save)")  # what the user saved, in the user's order
    if L.keeps_args:
        src.add(f"ctx.minihop_args = {src.name('call_arguments', call_arguments)}()")
    all_top = not L.nested_idx
    if L.nested_idx:
        src.add(f"sink.extend(({''.join(f'outs[{i}], ' for i in L.nested_idx)}))")
    returned = [f"outs[{i}]" for i in L.top_idx]
    for method, positions in (("mark_non_differentiable", L.nondiff_pos), ("mark_dirty", L.dirty_pos)):
        if positions:
            src.add(f"ctx.{method}({', '.join(returned[p] for p in positions)})")
    src.add("return " + ("outs[0]" if L.single else "outs" if all_top else f"({''.join(r + ', ' for r in returned)})"))
    return src


def _backward(pair: Pair, layout: Layout, *, bwd_plain: Callable[..., Any] | None, needs_key: bool,
              state_only: Callable[..., bool] | None, key_of: Callable[..., Any],
              call_bwd: Callable[..., Any], writes: bool,
              late: tuple[tuple[int, Callable[..., Any], Callable[[Any], bool]], ...] = (),
              ctx_writes: bool = False, dtype: torch.dtype | None = None,
              methods: tuple[type, Any, Any, Any] | None = None) -> _Source:
    """``backward(ctx, *grads)``: the traced bwd called directly where nothing can differ from
    the trace; else the grads and saved values handed to ``call_bwd``, which picks (or traces)
    the bwd variant for them, and the Python writes of that variant replayed. ``late``: per
    tensor backward reads when it runs, ``(saved index, fetch, check)``, given when they are the
    key's only part: fetched first, and while each has the traced properties (``check``) the
    traced bwd runs on them. ``ctx_writes``: backward writes the plain values on ctx; what
    an earlier backward of the call left (``ctx.minihop_ctx``) is part of the key. ``dtype``:
    the default dtype bwd was traced under, where it may read it (None: it does not); the
    traced bwd runs directly only under it. ``methods``: ``(F, backward, vjp, boxed)``, the user's class
    and what autograd found on it at capture; the traced bwd runs directly only while it finds
    them still (eager's autograd loads them when backward runs)."""
    L = layout
    grads = _params(len(L.top_idx), "g")
    src = _Source(f"def backward(ctx, {''.join(g + ', ' for g in grads)}):")
    order = L.direct_order
    all_top = not L.nested_idx
    direct = (bwd_plain is not None and all_top and order is not None and not writes
              and not L.exact_unpacks and (not needs_key or state_only is not None or bool(late)))
    same_case = [] if dtype is None else \
        [f"{src.name('default_dtype', torch.get_default_dtype)}() is {src.name('traced_dtype', dtype)}"]
    if methods is not None:  # (``==`` where a load makes a new object: a classmethod's bound method)
        user, found = src.name("F", methods[0]), methods[1:]
        same_case += [f"{user}.{name} {'is' if type(f) in (types.FunctionType, bool) else '=='} "
                       f"{src.name('user_' + name.split('_')[0], f)}"  # (traced boxed: boxed whatever the flag now)
                       for name, f in zip(("backward", "vjp", "boxed_grads_call"), found) if f is not True]
    if direct and late:
        if L.keeps_args:
            src.add("call_args = ctx.minihop_args")
        for k, (_, fetch, _) in enumerate(late):
            args_name = "call_args" if L.keeps_args else "()"
            src.add(f"late{k} = {src.name('fetch' + str(k), fetch)}({args_name})")
        checks = [f"{src.name('traced' + str(k), check)}(late{k})" for k, (_, _, check) in enumerate(late)]
        src.add(f"if {' and '.join([*checks, *same_case])}:")
    if direct:
        code = bwd_plain
        if order != tuple(range(L.num_saved)):
            params = [n for n in pair.bwd_graph.nodes if n.op == "placeholder"]
            top, saved = params[:L.num_outputs], params[L.num_outputs:]
            code = without_body_toggles(pair.bwd_graph, "bwd_body", params=[*top, *(saved[i] for i in order)])
        # Eager's backward unpacks ctx.saved_tensors only if the user's does (one that does
        # not runs again after autograd freed its graph: backward() twice, no retain_graph).
        args = [*grads, *(["*ctx.saved_tensors"] if L.ctx_refs or L.reads else [])]
        if late:  # the stash as forward kept it, but what those places hold now
            fetched = {i: f"late{k}" for k, (i, _, _) in enumerate(late)}
            args += [fetched.get(i, f"ctx.minihop_stash[{j}]") for j, i in enumerate(L.stashed)]
        elif L.stashed:
            args.append("*ctx.minihop_stash")
        line = f"return {src.name('bwd_body', code)}({', '.join(args)})"
        if late:
            src.add(line, 2)
        elif not needs_key and not same_case:
            src.add(line)
            return src
        else:
            # Backward's only reason for a key is the Python values it reads (or the default
            # dtype): while they are the captured ones (one compiled check), the traced bwd runs.
            # (its places in the arguments, a tensor argument's attributes, read off those forward kept)
            state = [f"{src.name('state_ok', state_only)}({'ctx.minihop_args' if L.keeps_args else '()'})"] \
                if needs_key else []
            src.add(f"if {' and '.join([*state, *same_case])}:")
            src.add(line, 2)
    # Unpack what the user saved, as eager does (version checks, unpack hooks): once per read
    # of ctx.saved_tensors in the user's backward.
    if L.all_via_ctx and not L.exact_unpacks:
        src.add("saved = ctx.saved_tensors" if L.ctx_refs or L.reads else "saved = ()")
    else:
        if L.exact_unpacks:
            if L.reads:
                src.add(f"for _ in range({L.reads}):")
                src.add("unpacked = ctx.saved_tensors", 2)
            elif L.from_ctx:
                src.add("unpacked = ctx.saved_tensors  # bwd needs them though backward never read them")
        elif L.ctx_refs or L.reads:
            src.add("unpacked = ctx.saved_tensors")
        if L.stashed:
            src.add("stash = ctx.minihop_stash")
        where = {i: f"unpacked[{p}]" for i, p in L.from_ctx}
        where.update({i: f"stash[{k}]" for k, i in enumerate(L.stashed)})
        src.add(f"saved = [{', '.join(where.get(i, 'None') for i in range(L.num_saved))}]")
    src.add("call_args = ctx.minihop_args" if L.keeps_args else "call_args = ()")
    src.add(f"top_grads = ({''.join(g + ', ' for g in grads)})")
    mine = ", ctx_state" if ctx_writes else ""
    if ctx_writes:
        src.add("ctx_state = getattr(ctx, 'minihop_ctx', None)  # None: as forward left ctx")
    key = f"{src.name('key_of', key_of)}(top_grads, call_args{mine})" if needs_key else "None"
    src.add(f"grads, writes = {src.name('call_bwd', call_bwd)}(top_grads, saved, call_args, {key}{mine})")
    src.add("for write in writes:  # as eager's backward makes them, each time it runs")
    src.add("write.replay(call_args, ctx)", 2)  # (some keep what the call's next backward reads on ctx)
    src.add("return grads" if all_top else "return (None, *grads)  # no gradient for the sink")
    return src


def generate(pair: Pair, layout: Layout, call_arguments: Callable[[], Any],
             **backward: Any) -> tuple[Callable[..., Any], Callable[..., Any], str]:
    """``(forward, backward, source)`` for ``pair`` (see ``_backward`` for ``backward``'s
    keywords), compiled once; ``source`` is both functions' code."""
    fwd = _forward(pair, layout, call_arguments)
    bwd = _backward(pair, layout, **backward)
    name = pair.function_name
    forward = compile_source(fwd.text, "forward", fwd.names, f"{name}.forward")
    backward_fn = compile_source(bwd.text, "backward", bwd.names, f"{name}.backward")
    return forward, backward_fn, fwd.text + "\n" + bwd.text
