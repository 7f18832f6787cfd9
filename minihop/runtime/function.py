"""Run a consistent pair as one differentiable op: an ``autograd.Function`` per capture.

Place in the pipeline: runtime (never imports the tracer). ``make_function`` builds, once per
capture, a ``torch.autograd.Function`` subclass whose forward runs code emitted from the fwd
graph and whose backward runs the bwd's. What eager autograd would do with the user's ctx
calls is done here with the real ctx: saved values go through ``ctx.save_for_backward`` (so
version-counter checks and ``saved_tensors_hooks`` apply), ``mark_non_differentiable`` and
``mark_dirty`` use the capture's index lists.

The class's ``forward`` and ``backward`` are generated for the capture (``bodies.py``: Python
source built from its layout, with no branch on it; the class's ``source`` shows it). Where
backward can differ from the trace (its grads, Python values or data it reads, the user's class's
``backward`` rebound since forward: its one check where nothing else can differ), the generated
backward hands the grads and saved values to ``call_bwd`` here, which runs the bwd variant
``Backwards`` picks for them (``backwards.py``).

Only top-level outputs (eager's outputs of the Function) are returned to autograd; tensors
nested inside returned objects travel through ``sink`` and never require grad, as in eager.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ..spec import NO_STATE, DataRead, Pair, PythonState
from .backwards import (MAX_VALUE_VARIANTS, Backwards, GradLayout, Retrace, Unfetched, fetch_now, keeps_arguments, live_slots,
                        reads_argument_tensors, same_properties)
from .bodies import Layout, generate, without_body_toggles
from .codegen import emit
from .graph_reads import applied_functions, reads_grad_mode
from .eager_runs import EagerRunner
from .function_keys import backward_methods
from .grad_fn import mirror_ctx
from .guard_checks import compile_live_check
from .transformable import make_transformable

__all__ = ["make_function", "GradLayout", "MAX_VALUE_VARIANTS", "Retrace"]

_set_grad = torch._C._set_grad_enabled
_is_grad = torch.is_grad_enabled
_default_dtype = torch.get_default_dtype

# The bound arguments of the call whose forward is running (set by the capture's runner only
# when backward needs them: it reads or writes Python state inside an argument object).
_call = threading.local()


def call_arguments() -> tuple[Any, ...]:
    return getattr(_call, "args", ())


def set_call_arguments(args: tuple[Any, ...] | None) -> None:
    _call.args = args


def make_function(pair: Pair, retrace: Retrace | None = None, *, transformable: bool = False,
                  generate_vmap_rule: bool = False, state: PythonState = NO_STATE,
                  backward_values: tuple[Any, ...] = (),
                  bwd_reads: tuple[DataRead, ...] = (), keep_args: bool = False,
                  eager: EagerRunner | None = None, user_cls: type | None = None) -> type[torch.autograd.Function]:
    """The ``autograd.Function`` subclass that runs ``pair``.

    Apply it as ``F.apply(*inputs)``, or ``F.apply(sink, *inputs)`` when ``F.uses_sink`` (some
    fwd outputs are nested inside returned objects: those are appended to ``sink``). With
    ``F.single_output`` it returns the one output tensor itself, as the user's forward did.
    Each of these is decided here, once, so the per-call code does only the work its capture
    needs; ``F.source`` is that code.

    With ``transformable`` (the user's Function is in the ``setup_context`` style, which is
    what torch.func transforms require), ``F.transformable`` is a second class in that style,
    used while a transform is active (see ``make_transformable``). ``keep_args``: forward keeps
    the call's arguments on ctx whatever backward reads (a backward run eagerly needs them);
    ``eager``: runs the user's backward where the caller touched ``y.grad_fn`` (``grad_fn``);
    ``user_cls``: the user's Function, whose ``backward``/``vjp`` are compared when backward runs.
    """
    layout = Layout.of(pair, keeps_args=keep_args or keeps_arguments(pair, state))
    # A bwd that read the grad mode is right in one mode only: create_graph takes another (Backwards.grad_on).
    # (or applied another Function: under create_graph its backward is eager's, Backwards.get decides)
    bwd_plain = None if reads_grad_mode(pair.bwd_graph) and (retrace is not None or applied_functions(pair.bwd_graph)) \
        else without_body_toggles(pair.bwd_graph, "bwd_body")
    backwards = Backwards(pair, layout.top_idx, retrace, state, backward_values, bwd_reads, user_cls)
    backwards.plain = bwd_plain
    call_bwd = _bwd_caller(pair, layout, backwards, bwd_plain, state)
    # Backward's only reason for a key is the Python values it reads (not grads, not data,
    # not tensors fetched when it runs): while they are the captured ones, the traced bwd runs.
    state_only = None
    if bool(backwards.state_reads) and not backwards.checks and layout.materialize \
            and not reads_argument_tensors(pair) and not backwards.reads_values and not live_slots(pair):
        state_only = compile_live_check(backwards.state_reads, backwards.state_base)
    # Or its only reason is tensors it reads when it runs: fetched, and while each has the
    # traced properties, the traced bwd runs on them.
    late = ()
    if live_slots(pair) and not backward_values and not backwards.checks \
            and layout.materialize and not backwards.reads_values:
        late = tuple((i, fetch, same_properties(base)) for i, fetch, base in live_slots(pair))
        if any(check is None for _, _, check in late):
            late = ()
    forward, backward, source = generate(
        pair, layout, call_arguments, bwd_plain=bwd_plain, needs_key=backwards.needs_key,
        state_only=state_only, key_of=backwards.key_of, call_bwd=call_bwd, dtype=backwards.dtype,
        writes=bool(state.writes_in("backward")) or state.ctx_state is not None, late=late,
        ctx_writes=state.ctx_state is not None, methods=(user_cls, *backwards.methods) if user_cls else None)
    if pair.once_differentiable:
        backward = once_differentiable(backward)
    namespace = {
        "transformable": make_transformable(pair, call_bwd, generate_vmap_rule) if transformable else None,
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
        "uses_sink": bool(layout.nested_idx),
        "single_output": layout.single,
        "backwards": backwards,  # the bwd variants traced so far (read by tests and explain)
        "source": source,  # the generated forward and backward, for reading
        # (eager's autograd clears the saved tensors on their first unpack: each backward's, once)
        "clear_saved_tensors_on_access": bool(getattr(user_cls, "clear_saved_tensors_on_access", False)),
        "__qualname__": f"Captured[{pair.function_name}]",
        "__module__": __name__,
    }
    # Named as the user's class: autograd names the Function in its own errors ("Output 0 of F
    # is a view ...", "Function 'FBackward' returned nan values ...") and in y.grad_fn's type,
    # which should read as eager's do; the qualname says it is minihop's.
    function = type(pair.function_name.rsplit(".", 1)[-1], (torch.autograd.Function,), namespace)
    mirror_ctx(function, state, pair.function_name, eager, layout)  # y.grad_fn answers as the user's ctx does
    return function


def _bwd_caller(pair: Pair, layout: Layout, backwards: Backwards, bwd_plain: Callable[..., Any] | None,
                state: PythonState) -> Callable[..., tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """``call_bwd(top_grads, saved, call_args=(), key=None) -> (grads, writes)``: the bwd for
    this backward's case on the grads of the top-level outputs and bwd's saved values (in its
    order); its gradients and the Python writes of the case that ran."""
    bwd_code = bwd_plain or emit(pair.bwd_graph, name="bwd_body") or pair.bwd.forward
    bwd_writes = state.writes_in("backward")
    late = tuple((i, fetch) for i, fetch, _ in live_slots(pair))
    num_outputs, top_idx = layout.num_outputs, layout.top_idx
    all_top = not layout.nested_idx
    once = pair.once_differentiable
    needs_key = backwards.needs_key
    traced_dtype = backwards.dtype
    user_cls, methods = backwards.user_cls, backwards.methods

    def call_bwd(top_grads: tuple[Any, ...], saved: Sequence[Any],
                 call_args: tuple[Any, ...] = (), key: Any = None,
                 ctx_state: Any = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        if late:
            # What the global, cell or attribute holds now: eager's backward reads it now.
            saved = list(saved)
            for i, fetch in late:
                saved[i] = fetch_now(fetch, call_args)
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
        other_case = traced_dtype is not None and _default_dtype() is not traced_dtype \
            or user_cls is not None and backward_methods(user_cls, methods[2]) != methods  # (rebound since forward)
        if needs_key or (create_graph and bwd_plain is None) or other_case:
            if key is None:
                key = backwards.key_of(top_grads, call_args, ctx_state) if needs_key or other_case \
                    else backwards.base_key
            code, saved_map, writes = backwards.get(key, create_graph, top_grads, call_args, grads, saved, ctx_state)
            if saved_map is not None:
                # (a variant's tensor the captured backward did not read: fetched from its place)
                saved = [saved[i] if type(i) is int else i(call_args) for i in saved_map]
        if late or needs_key:
            for value in saved:
                if type(value) is Unfetched:
                    raise value.error  # this bwd reads it: eager's backward raises the same
        try:
            return code(*grads, *saved), writes
        finally:
            _set_grad(grad_mode)

    return call_bwd
