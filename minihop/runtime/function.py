"""Run a consistent pair as one differentiable op: an ``autograd.Function`` per capture.

Place in the pipeline: runtime (never imports the tracer). ``make_function`` builds, once per
capture, a ``torch.autograd.Function`` subclass whose forward runs code emitted from the fwd
graph (``codegen.emit``, without the body's own grad-mode toggles where that is equivalent) and
whose backward runs the bwd's. What eager autograd would do with the user's
ctx calls is done here with the real ctx: saved values go through ``ctx.save_for_backward``
(so version-counter checks and ``saved_tensors_hooks`` apply), ``mark_non_differentiable`` and
``mark_dirty`` use the capture's index lists.

Only top-level outputs (eager's outputs of the Function) are returned to autograd; tensors
nested inside returned objects travel through ``sink`` and never require grad, as in eager.

Backward variants: bwd was traced with fake grads. If the user's backward read something of
its grads that can differ at run time (strides, contiguity, ``requires_grad``, or, with
``set_materialize_grads(False)``, whether a grad is None), the real grads are checked against
what the trace assumed; on a difference ``retrace`` produces (once per distinct case) a bwd
traced for the real grads. A backward that read nothing of its grads pays nothing.

Backward value guards: a backward that took Python values out of its grads or saved values
(``if x.sum() > 0``, ``range(int(n))``; ``DataRead``s guarding backward) has, per case above,
a list of bwd variants, each with the values it was traced for. Before each backward, each
variant's value graphs run on the real grads and saved values; the first whose values all
match runs. None: backward is traced again with the real values (a new variant; past
``MAX_VALUE_VARIANTS`` the oldest is dropped, with a warning). Only such backwards pay this.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.autograd.function import once_differentiable

from ..errors import UnsupportedOperationError
from ..spec import GRAD_TOGGLE, NO_STATE, DataRead, Pair, PythonState
from .codegen import emit
from .guards import compile_live_check, value_key

__all__ = ["make_function", "GradLayout", "MAX_VALUE_VARIANTS", "Retrace"]

_set_grad = torch._C._set_grad_enabled
_is_grad = torch.is_grad_enabled

# Per fwd output: (stride, requires_grad) of the real grad, or None when it is absent.
GradLayout = tuple[tuple[tuple[int, ...], bool] | None, ...]
# Returns a bwd traced for that layout (and the call's arguments, when backward reads Python
# state in them; and the call's grads, one per fwd output, and saved values, when backward
# reads their values); per saved value it takes, the index of that value among this
# capture's saved values; per gradient it returns, the index of its fwd input among this
# capture's fwd inputs.
# And backward's Python writes in that case (``StateWrite``s, replayed when it runs), and the
# values it read from the grads and saved values (``DataRead``s guarding backward).
Retrace = Callable[[GradLayout, tuple[Any, ...], Sequence[Any], Sequence[Any]],
                   tuple[fx.GraphModule, tuple[int, ...], tuple[int, ...], tuple[Any, ...],
                         tuple[DataRead, ...]]]

# Bwd variants kept per grad case for the values backward reads (as ``cache_limit`` bounds
# captures): past it, the oldest is dropped (always right; it costs a trace if it comes back).
MAX_VALUE_VARIANTS = 8


class _Never:
    """Equal to nothing: an assumption with symbolic sizes is checked by retracing."""

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return 0


_NEVER = _Never()


def _symbolic(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_symbolic(v) for v in value)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


# The bound arguments of the call whose forward is running (set by the capture's runner only
# when backward needs them: it reads or writes Python state inside an argument object).
_call = threading.local()


def call_arguments() -> tuple[Any, ...]:
    return getattr(_call, "args", ())


def set_call_arguments(args: tuple[Any, ...] | None) -> None:
    _call.args = args


class _Backwards:
    """The bwd code for each (grad case, Python state, values read, create_graph) seen so
    far; built lazily. A case is ``(key, n)``: the grad/state key, and the ``n``-th variant
    traced for it (the values it read are its guards)."""

    def __init__(self, pair: Pair, top_idx: tuple[int, ...], retrace: Retrace | None,
                 state: PythonState = NO_STATE, state_base: tuple[Any, ...] = (),
                 reads: tuple[DataRead, ...] = ()) -> None:
        self.pair = pair
        self.top_idx = top_idx
        self.retrace = retrace
        # Python values backward reads: checked when backward runs (eager's backward reads
        # them then), and a bwd traced again for values unlike the captured ones.
        # And tensors backward reads from a global, cell or attribute (``live_slots``): a
        # tensor there of other properties than the traced one needs another bwd too.
        live = live_slots(pair)
        self.state_reads = (*(r.place.get for r in state.reads_in("backward")),
                            *(lambda call_args, f=fetch: f() for _, fetch, _ in live))
        self.state_base = (*state_base, *(base for _, _, base in live))
        position = {i: p for p, i in enumerate(top_idx)}
        self.checks = tuple((position[a.index], a.query, a.args, dict(a.kwargs))
                            for a in pair.grad_assumptions)
        self.materialize = pair.materialize_grads
        self.num_inputs = len(pair.inputs)
        self.base_key = self.key_of_expected()
        self.base_case = (self.base_key, 0)
        self.reads_values = bool(reads)
        # Per key, its variants in the order traced: (n, value checks).
        self.cases: dict[Any, list[tuple[int, tuple[Callable[..., bool], ...]]]] = {
            self.base_key: [(0, tuple(_bwd_value_check(r) for r in reads))]}
        self.traced = 1
        # The traced bwd's GraphModule (None here) is built only if a variant needs it.
        self.variants: dict[Any, tuple[fx.GraphModule | None, tuple[int, ...], tuple[int, ...]]] = {
            self.base_case: (None, tuple(range(pair.num_saved)), tuple(range(self.num_inputs)))}
        self.code: dict[tuple[Any, bool], tuple[Callable[..., Any], tuple[int, ...] | None]] = {}
        # Backward's Python writes per case (a variant traced for other Python values may
        # write other values); the traced case's are the capture's.
        self.writes: dict[Any, tuple[Any, ...]] = {self.base_case: state.writes_in("backward")}
        self.plain: Callable[..., Any] | None = None  # the traced bwd without its body toggles
        self.warned = False
        # Backwards in several threads: one picks or adds a variant at a time.
        self.lock = threading.RLock()

    @property
    def needs_key(self) -> bool:
        return bool(self.checks) or not self.materialize or bool(self.state_reads) or self.reads_values

    def key_of_expected(self) -> Any:
        nones = (False,) * len(self.top_idx) if not self.materialize else ()
        return (nones, tuple(_NEVER if _symbolic(a.expected) else a.expected
                             for a in self.pair.grad_assumptions), self.state_base)

    def key_of(self, top_grads: tuple[Any, ...], call_args: tuple[Any, ...] = ()) -> Any:
        nones = tuple(g is None for g in top_grads) if not self.materialize else ()
        return (nones, tuple(None if top_grads[p] is None else q(top_grads[p], *args, **kwargs)
                             for p, q, args, kwargs in self.checks),
                tuple(value_key(read(call_args)) for read in self.state_reads))  # usually one or two

    def get(self, key: Any, create_graph: bool, top_grads: tuple[Any, ...],
            call_args: tuple[Any, ...] = (), grads: Sequence[Any] = (),
            saved: Sequence[Any] = ()) -> tuple[Callable[..., Any], tuple[int, ...] | None, tuple[Any, ...]]:
        """The code for this backward: ``(code, saved_map, writes)``; ``grads`` (one per fwd
        output) and ``saved`` (this capture's) are the backward's own, for value guards."""
        with self.lock:
            case = self.case_of(key, top_grads, call_args, grads, saved)
            writes = self.writes[case]
            found = self.code.get((case, create_graph))
            if found is not None:
                return (*found, writes)
            if case == self.base_case and self.plain is not None:
                return self.plain, None, writes  # the traced case, without toggles: right in either mode
            gm, saved_map, input_map = self.variants[case]
            if gm is None:
                gm = self.pair.bwd
            if create_graph:
                gm = _strip_grad_toggles(gm)
            code = gm.forward
            if input_map != tuple(range(self.num_inputs)):
                code = _scatter_grads(code, input_map, self.num_inputs)
            identity = saved_map == tuple(range(self.pair.num_saved))
            found = (code, None if identity else saved_map)
            self.code[(case, create_graph)] = found
            return (*found, writes)

    def case_of(self, key: Any, top_grads: tuple[Any, ...], call_args: tuple[Any, ...],
                grads: Sequence[Any], saved: Sequence[Any]) -> tuple[Any, int]:
        """The variant for ``key`` whose values this backward's grads and saved values give
        (traced now if none)."""
        for n, checks in self.cases.get(key, ()):
            if all(check(grads, saved) for check in checks):
                return (key, n)
        if self.retrace is None:
            raise UnsupportedOperationError(
                f"{self.pair.function_name}.backward received grads unlike the ones it was "
                "traced with (their layout, or which are None), and this capture cannot "
                "trace backward again (it was loaded from an artifact).",
                "Its backward reads properties of its grads (or Python values that changed "
                "since forward), so another case needs another trace.",
                "Capture the Function again in this process (minihop.capture).")
        layout: list[Any] = [None] * len(self.pair.top_level)
        for p, i in enumerate(self.top_idx):
            g = top_grads[p]
            layout[i] = None if g is None else (tuple(g.stride()), g.requires_grad)
        gm, saved_map, input_map, writes, reads = self.retrace(tuple(layout), call_args, grads, saved)
        cases = self.cases.setdefault(key, [])
        if len(cases) >= MAX_VALUE_VARIANTS:
            self.drop(key, cases.pop(0)[0])
        case = (key, self.traced)
        self.traced += 1
        cases.append((case[1], tuple(_bwd_value_check(r) for r in reads)))
        self.variants[case] = (gm, saved_map, input_map)
        self.writes[case] = writes
        return case  # traced for these very values: no check needed

    def drop(self, key: Any, n: int) -> None:
        """Forget variant ``n`` of ``key`` (past ``MAX_VALUE_VARIANTS``)."""
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"minihop: {self.pair.function_name}.backward was traced for "
                f"{MAX_VALUE_VARIANTS} different values it reads from its grads or saved "
                "values; the oldest trace is dropped for each new one (results stay right; "
                "each costs a trace). Compute with tensor ops (torch.where) to avoid this.",
                stacklevel=5)
        for create_graph in (False, True):
            self.code.pop(((key, n), create_graph), None)
        self.variants.pop((key, n), None)
        self.writes.pop((key, n), None)


def live_slots(pair: Pair) -> tuple[tuple[int, Callable[[], Any], Any], ...]:
    """Per saved value that is a tensor backward reads from a global, a cell or an attribute
    (``InputSource.read_in_backward``, passed through fwd): ``(saved index, fetch, key)``,
    ``fetch()`` giving what that place holds now, ``key`` the traced tensor's ``value_key``."""
    placeholders = [n for n in pair.fwd_graph.nodes if n.op == "placeholder"]
    sources = dict(zip(placeholders, pair.inputs, strict=True))
    saved_nodes = pair.fwd_graph.output_node().args[0][1]
    return tuple((i, source.live, value_key(source.constant)) for i, node in enumerate(saved_nodes)
                 if (source := sources.get(node)) is not None and source.read_in_backward
                 and source.live is not None)


def _bwd_value_check(read: DataRead) -> Callable[[Sequence[Any], Sequence[Any]], bool]:
    """``(grads, saved) -> bool``: whether ``read``'s graph gives the value its bwd variant was
    traced for, on a backward's grads (one per fwd output) and this capture's saved values
    (the check is no part of what backward records: with create_graph=True it runs under
    no_grad on detached values)."""
    picks = read.bwd_inputs
    value_of = emit(read.graph.graph, name="bwd_value") or read.graph.forward
    holds = read.holds

    def check(grads: Sequence[Any], saved: Sequence[Any]) -> bool:
        return holds(value_of, [ref if kind == "const" else (grads if kind == "grad" else saved)[ref]
                                for kind, ref in picks])

    return check


def _scatter_grads(code: Callable[..., Any], input_map: tuple[int, ...], n: int) -> Callable[..., Any]:
    """A variant's gradients, placed at this capture's fwd input positions (None elsewhere)."""

    def run(*args: Any) -> tuple[Any, ...]:
        grads: list[Any] = [None] * n
        for i, g in zip(input_map, code(*args), strict=True):
            grads[i] = g
        return tuple(grads)

    return run


def without_body_toggles(graph: fx.Graph, name: str, **layout: Any) -> Callable[..., Any] | None:
    """Code for ``graph`` without the two ``_set_grad_enabled`` calls that open and close its
    body, or None when the graph also switches grad mode itself (the user's ``no_grad``
    blocks) or cannot be emitted.

    Why: autograd already runs a Function's forward with grad off, and its backward with grad
    on exactly when ``create_graph=True`` (which is what eager's backward sees), so at run time
    the body's own toggles only cost four calls and force a save/restore of grad mode around
    each graph. The graphs keep them (Dynamo's layout).
    """
    toggles = [n for n in graph.nodes if n.op == "call_function" and n.target is _set_grad]
    if len(toggles) != 2 or not all(n.meta.get(GRAD_TOGGLE) for n in toggles):
        return None
    return emit(graph, skip=lambda node: node in toggles, name=name, **layout)


def _bwd_taking(pair: Pair, num_outputs: int, order: tuple[int, ...]) -> Callable[..., Any] | None:
    """bwd's code without its toggles, taking its saved values in ``order`` (after the grads)."""
    params = [n for n in pair.bwd_graph.nodes if n.op == "placeholder"]
    grads, saved = params[:num_outputs], params[num_outputs:]
    return without_body_toggles(pair.bwd_graph, "bwd_body", params=[*grads, *(saved[i] for i in order)])


def make_function(pair: Pair, retrace: Retrace | None = None, *, transformable: bool = False,
                  generate_vmap_rule: bool = False, state: PythonState = NO_STATE,
                  state_base: tuple[Any, ...] = (),
                  bwd_reads: tuple[DataRead, ...] = ()) -> type[torch.autograd.Function]:
    """The ``autograd.Function`` subclass that runs ``pair``.

    Apply it as ``F.apply(*inputs)``, or ``F.apply(sink, *inputs)`` when ``F.uses_sink`` (some
    fwd outputs are nested inside returned objects: those are appended to ``sink``). With
    ``F.single_output`` it returns the one output tensor itself, as the user's forward did.
    Each of these is decided here, once, so the per-call code does only the work its capture
    needs.

    With ``transformable`` (the user's Function is in the ``setup_context`` style, which is
    what torch.func transforms require), ``F.transformable`` is a second class in that style,
    used while a transform is active (see ``make_transformable``).
    """
    fwd_plain = without_body_toggles(pair.fwd_graph, "fwd_body")
    bwd_plain = without_body_toggles(pair.bwd_graph, "bwd_body")
    fwd_code = fwd_plain or emit(pair.fwd_graph, name="fwd_body") or pair.fwd.forward
    bwd_code = bwd_plain or emit(pair.bwd_graph, name="bwd_body") or pair.bwd.forward
    num_outputs = len(pair.top_level)
    top_idx = tuple(i for i, top in enumerate(pair.top_level) if top)
    nested_idx = tuple(i for i, top in enumerate(pair.top_level) if not top)
    uses_sink = bool(nested_idx)
    single = num_outputs == 1 and not uses_sink and pair.output_spec.kind == "tensor"
    position = {i: p for p, i in enumerate(top_idx)}
    nondiff_pos = tuple(position[i] for i in pair.non_differentiable_idx)
    dirty_pos = tuple(position[i] for i in pair.dirty_idx)
    # What goes through ctx.save_for_backward: exactly what the user saved (see Pair.ctx_saved);
    # bwd's other saved values (read from ctx attributes) are stashed without version checks.
    ctx_refs = pair.ctx_saved
    via_ctx = tuple(pair.saved_for_backward_idx)
    ctx_position = {ref[1]: p for p, ref in reversed(list(enumerate(ctx_refs)))
                    if ref is not None and ref[0] == "saved"}
    from_ctx = tuple((i, ctx_position[i]) for i in via_ctx)
    stashed = tuple(i for i in range(pair.num_saved) if i not in ctx_position)
    plain_ctx = ctx_refs == tuple(("saved", i) for i in via_ctx)
    # The common case: the user saved exactly bwd's saved values, in bwd's order.
    all_via_ctx = plain_ctx and via_ctx == tuple(range(pair.num_saved))
    # Or in another order (bwd takes them in the order it first reads them): code emitted to
    # return them, and to take them, in the user's order makes that case the common one.
    perm = tuple(ref[1] for ref in ctx_refs) if all(ref is not None and ref[0] == "saved"
                                                    for ref in ctx_refs) else ()
    permuted = (not all_via_ctx and sorted(perm) == list(range(pair.num_saved))
                and len(perm) == pair.num_saved > 0)
    num_saved = pair.num_saved
    materialize = pair.materialize_grads
    once = pair.once_differentiable
    all_top = len(top_idx) == num_outputs
    backwards = _Backwards(pair, top_idx, retrace, state, state_base, bwd_reads)
    backwards.plain = bwd_plain
    needs_key = backwards.needs_key
    bwd_writes = state.writes_in("backward")
    keeps_args = state.backward_uses_args  # forward keeps the call's arguments on ctx for it
    # Every forward path saves in the user's order (what eager's ctx holds); the simple paths
    # below read and write that order directly, each with code emitted for it when needed.
    ctx_ordered = all_via_ctx or permuted
    # Each read of ctx.saved_tensors in eager's backward unpacks every saved tensor (the unpack
    # hook of saved_tensors_hooks runs per read): a backward that read it twice, or never,
    # unpacks that many times here too (the fast paths below unpack once).
    reads = pair.saved_reads
    exact_unpacks = bool(ctx_refs) and reads != 1
    late = tuple((i, fetch) for i, fetch, _ in live_slots(pair))

    def run_fwd(ctx: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """Runs fwd, saves for backward through ``ctx``; returns all fwd outputs."""
        if not materialize:
            ctx.set_materialize_grads(False)
        if fwd_plain is not None:
            outs, saved = fwd_code(*inputs)
        else:
            grad_mode = _is_grad()
            try:
                outs, saved = fwd_code(*inputs)
            finally:
                _set_grad(grad_mode)  # the graph's own toggle restores True; keep autograd's mode
        if all_via_ctx:
            if num_saved:
                ctx.save_for_backward(*saved)
        elif plain_ctx:
            if via_ctx:
                ctx.save_for_backward(*[saved[i] for i in via_ctx])
        else:
            pick = {"saved": saved, "input": inputs, "output": outs}
            ctx.save_for_backward(*[None if ref is None else pick[ref[0]][ref[1]] for ref in ctx_refs])
        if stashed:
            # Values eager keeps as plain ctx attributes: no version-counter check, as in eager.
            ctx.minihop_stash = [saved[i] for i in stashed]
        if keeps_args:
            ctx.minihop_args = call_arguments()
        return outs

    def mark(ctx: Any, result: tuple[Any, ...]) -> None:
        if nondiff_pos:
            ctx.mark_non_differentiable(*[result[p] for p in nondiff_pos])
        if dirty_pos:
            ctx.mark_dirty(*[result[p] for p in dirty_pos])

    # The common case, without the general path's steps: no grad-mode save/restore, the user
    # saved exactly bwd's saved values, nothing marked, every output top-level.
    plain_fwd = (fwd_plain is not None and not keeps_args and materialize and not nondiff_pos
                 and not dirty_pos and not uses_sink)
    simple_fwd = plain_fwd and ctx_ordered and not stashed
    outs_nodes, saved_nodes = pair.fwd_graph.output_node().args[0]
    simple_code = fwd_code
    if simple_fwd and permuted:
        simple_code = without_body_toggles(
            pair.fwd_graph, "fwd_body", output=(outs_nodes, tuple(saved_nodes[i] for i in perm)))
    # Or the same with values bwd reads that the user kept as ctx attributes (size symbols
    # Dynamo's layout saves, Python numbers): the tensors through save_for_backward, the rest
    # stashed, each in one step of emitted code.
    stash_code = None
    if plain_fwd and plain_ctx and stashed:
        stash_code = without_body_toggles(pair.fwd_graph, "fwd_body", output=(
            outs_nodes, tuple(saved_nodes[i] for i in via_ctx), tuple(saved_nodes[i] for i in stashed)))
    if stash_code is not None:
        def forward(ctx: Any, *inputs: Any) -> Any:
            outs, tensors, ctx.minihop_stash = stash_code(*inputs)
            ctx.save_for_backward(*tensors)
            return outs[0] if single else outs
    elif simple_fwd:
        def forward(ctx: Any, *inputs: Any) -> Any:
            outs, saved = simple_code(*inputs)
            if num_saved:
                ctx.save_for_backward(*saved)
            return outs[0] if single else outs
    elif uses_sink:
        def forward(ctx: Any, sink: list[Any], *inputs: Any) -> Any:
            outs = run_fwd(ctx, inputs)
            result = tuple(outs[i] for i in top_idx)
            sink.extend(outs[i] for i in nested_idx)
            mark(ctx, result)
            return result
    else:
        def forward(ctx: Any, *inputs: Any) -> Any:
            result = tuple(run_fwd(ctx, inputs))
            mark(ctx, result)
            return result[0] if single else result

    def unpack(ctx: Any) -> tuple[Any, ...]:
        unpacked: tuple[Any, ...] = ()
        for _ in range(reads):
            unpacked = ctx.saved_tensors
        if not reads and from_ctx:
            unpacked = ctx.saved_tensors  # bwd needs them though backward never read them itself
        return unpacked

    def run_bwd(ctx: Any, top_grads: tuple[Any, ...]) -> tuple[Any, ...]:
        if all_via_ctx and not exact_unpacks:
            saved: tuple[Any, ...] | list[Any] = ctx.saved_tensors if num_saved or reads else ()
        else:
            # Unpack everything the user saved, as eager does (version checks, unpack hooks).
            unpacked = unpack(ctx) if exact_unpacks else ctx.saved_tensors if ctx_refs or reads else ()
            saved = [None] * num_saved
            for i, p in from_ctx:
                saved[i] = unpacked[p]
            for i, value in zip(stashed, ctx.minihop_stash if stashed else (), strict=True):
                saved[i] = value
        call_args = ctx.minihop_args if keeps_args else ()
        key = backwards.key_of(top_grads, call_args) if needs_key else None
        grads, writes = call_bwd(top_grads, saved, call_args, key)
        # As eager's backward makes them, each time it runs (for the case that ran).
        for write in writes:
            write.replay(call_args)
        return grads

    def call_bwd(top_grads: tuple[Any, ...], saved: tuple[Any, ...] | list[Any],
                 call_args: tuple[Any, ...] = (), key: Any = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """bwd on the grads of the top-level outputs and bwd's saved values, in its order;
        returns its gradients and the Python writes of the case that ran."""
        if late:
            # What the global, cell or attribute holds now: eager's backward reads it now.
            saved = list(saved)
            for i, fetch in late:
                saved[i] = fetch()
        if all_top:
            grads: tuple[Any, ...] | list[Any] = top_grads
        else:
            grads = [None] * num_outputs
            for p, i in enumerate(top_idx):
                grads[i] = top_grads[p]
        grad_mode = _is_grad()
        # create_graph=True: eager runs backward with grad mode on (double backward), except
        # under once_differentiable, whose wrapper turns it off. Code without the body's
        # toggles runs right in either mode.
        create_graph = grad_mode and not once
        code = bwd_code
        writes = bwd_writes
        if needs_key or (create_graph and bwd_plain is None):
            if key is None:
                key = backwards.key_of(top_grads, call_args) if needs_key else backwards.base_key
            code, saved_map, writes = backwards.get(key, create_graph, top_grads, call_args, grads, saved)
            if saved_map is not None:
                saved = [saved[i] for i in saved_map]
        try:
            return code(*grads, *saved), writes
        finally:
            _set_grad(grad_mode)

    stash_bwd = None
    if bwd_plain is not None and all_top and plain_ctx and stashed and not needs_key and not bwd_writes \
            and not keeps_args and not uses_sink and not exact_unpacks:
        stash_bwd = _bwd_taking(pair, num_outputs, (*via_ctx, *stashed))
    # Backward's only reason for a key is the Python values it reads: while they are the
    # captured ones (one compiled check), the simple path below runs.
    state_only = bool(backwards.state_reads) and not backwards.checks and materialize and not keeps_args \
        and not backwards.reads_values
    if bwd_plain is not None and all_top and ctx_ordered and (not needs_key or state_only) and not bwd_writes \
            and not exact_unpacks:
        simple_bwd = bwd_code
        if permuted:
            simple_bwd = _bwd_taking(pair, num_outputs, perm)

        if not needs_key and not num_saved and not reads:
            # Eager's backward unpacks ctx.saved_tensors only if the user's does: one that does
            # not runs again after autograd freed its graph (backward() twice, no retain_graph).
            def backward(ctx: Any, *grads: Any) -> Any:
                return simple_bwd(*grads)
        elif not needs_key:
            def backward(ctx: Any, *grads: Any) -> Any:
                return simple_bwd(*grads, *ctx.saved_tensors)
        else:
            state_ok = compile_live_check(backwards.state_reads, state_base)

            def backward(ctx: Any, *grads: Any) -> Any:
                if state_ok(()):
                    return simple_bwd(*grads, *(ctx.saved_tensors if num_saved or reads else ()))
                return run_bwd(ctx, grads)  # a value changed since forward: another bwd
    elif stash_bwd is not None and not via_ctx and not reads:
        def backward(ctx: Any, *grads: Any) -> Any:
            return stash_bwd(*grads, *ctx.minihop_stash)  # no saved_tensors read, as eager's
    elif stash_bwd is not None:
        def backward(ctx: Any, *grads: Any) -> Any:
            return stash_bwd(*grads, *ctx.saved_tensors, *ctx.minihop_stash)
    elif uses_sink:
        def backward(ctx: Any, *top_grads: Any) -> Any:
            return (None, *run_bwd(ctx, top_grads))  # no gradient for the sink
    else:
        def backward(ctx: Any, *top_grads: Any) -> Any:
            return run_bwd(ctx, top_grads)

    if once:
        backward = once_differentiable(backward)

    namespace = {
        "transformable": make_transformable(pair, call_bwd, generate_vmap_rule) if transformable else None,
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
        "uses_sink": uses_sink,
        "single_output": single,
        "backwards": backwards,  # the bwd variants traced so far (read by tests and explain)
        "__qualname__": f"Captured[{pair.function_name}]",
        "__module__": __name__,
    }
    return type(f"Captured_{pair.function_name.replace('.', '_')}", (torch.autograd.Function,), namespace)


def make_transformable(pair: Pair, call_bwd: Callable[[tuple[Any, ...], Any], tuple[tuple[Any, ...], Any]],
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
        ctx.minihop_numbers = [(i, v) for i, v in enumerate(saved) if not isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*[v for v in saved if isinstance(v, torch.Tensor)])
        ctx.mark_non_differentiable(*[v for v in output[n_top:] if isinstance(v, torch.Tensor)],
                                    *[output[p] for p in nondiff_pos])

    def backward(ctx: Any, *grads: Any) -> Any:
        saved = list(ctx.saved_tensors)
        for i, v in ctx.minihop_numbers:
            saved.insert(i, v)
        return call_bwd(grads[:n_top], saved)[0]

    return type(f"Transformable_{pair.function_name.replace('.', '_')}", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
        "generate_vmap_rule": generate_vmap_rule,
        "num_outputs": n_out,
        "order": order,
        "__qualname__": f"Captured[{pair.function_name}].transformable",
        "__module__": __name__,
    })


def _strip_grad_toggles(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` without the ``_set_grad_enabled`` calls that open and close its body
    (the user's own ``enable_grad``/``no_grad`` blocks stay).

    Used to run bwd under ``create_graph=True``: eager runs the user's backward with grad
    mode on then, so its ops are recorded for double backward.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.meta.get(GRAD_TOGGLE):
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)
