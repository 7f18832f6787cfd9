"""Trace a user's ``autograd.Function`` into two raw graphs.

Place in the pipeline: the tracer's entry point (``trace_function``). Forward runs under
no-grad on fake copies of the arguments, with a proxy ctx; backward then runs on fake grads and
whatever forward values it reaches. The result, ``RawCapture``, holds both raw graphs and
everything the rewire needs to make them consistent; nothing here reorders or renames.

Invariants: every tensor forward reaches is a recorded node or a placeholder with an
``InputSource``; every forward value backward reads is a backward placeholder paired with its
forward node (``bwd_saved``), in the order backward first read it.

This module is the orchestrator; each step is another module's job: ``function_parts`` (the
Function's callables), ``session`` (one trace's state: recorders, inputs, placeholders, running
a phase), ``routes`` (tensors reached through globals and cells), ``outputs`` (forward's return
value and the tensors it left outside it), ``backward`` (running and re-running backward),
``shape_guards`` (dynamic sizes' guard code), ``pystate`` (Python state read and written).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from .call_watch import UnwatchedFakeMode

from ..errors import release_frames
from ..spec import MISSING, RawCapture
from ..arguments import bind_arguments
from ..structure import object_paths, replace_tensors
from ..returned import describe_output
from . import handlers
from .backward import GradSpec, may_trace_backward_again, reads_data_in_backward, rerun_backward, run_backward, save_everything
from .eager_backward import EagerBackward
from .ctx import ASKED_WHAT, ProxyCtx, check_ctx_arguments
from .ctx_held import refuse_unkeyed_ctx_holders
from .death_code import refuse_death_code
from .effects import (ctx_as_forward_left_it, ctx_forward, ctx_objects, ctx_values, refuse_ctx_rebinding, refuse_symbolic_ctx_write,
                      share_arguments)
from .frames import format_frame, user_frame_of
from .kept_args import keep_weakly
from .function_parts import FunctionParts, function_parts, refuse_own_apply
from .memo_writes import backward_writes, seen_by_backward, with_seen
from .names import FrameSnapshot, code_of, name_hints
from .routes import module_tensors
from .outputs import (check_returned, hidden_outputs, refuse_hidden_tensors, refuse_returned_state,
                      refuse_unbacked_numbers, saved_node)
from .outside import claim
from .pystate import StateTracker
from .recorder import tracing
from .refusals import refusal_for
from .run_context import modes_refusal, observing_modes
from .session import TRACE_LOCK, GradAssumption, Tracing
from .shape_guards import shape_env, shape_guards
from .symvalues import resolve_symbolic
from .torchlogs import quiet_torch_logs
from .unbacked import Plan, Retrace

__all__ = ["ASKED_WHAT", "TRACE_LOCK", "GradAssumption", "GradSpec", "RawCapture", "TraceInputs", "function_parts", "trace_function"]


@dataclasses.dataclass(frozen=True)
class TraceInputs:
    """Fake arguments of a finished trace, to trace again (another grad layout) without
    holding the caller's real tensors."""

    fake_mode: FakeTensorMode
    fake_args: tuple[Any, ...]
    grad_enabled: bool


def trace_function(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                   grad_specs: tuple[GradSpec | None, ...] | None = None,
                   retrace: TraceInputs | None = None,
                   dynamic: dict[int, tuple[int, ...]] | None = None,
                   key_of: Callable[[Any], Any], eager_fallback: bool = False) -> RawCapture:
    """Run ``fn_cls``'s forward and backward symbolically and return both raw graphs.

    ``grad_specs`` (one per fwd output; default: contiguous grads) sets the layout of the fake
    grads backward is traced with; ``retrace`` reuses the fake arguments of an earlier trace.
    ``key_of``: the runtime's key of a Python value (``runtime.guards.value_key``), for the
    values backward's reads found as it started (``memo_writes.seen_by_backward``).
    ``eager_fallback`` (``fallback="eager"``): a backward refused when traced again after forward
    ran is run eagerly (``eager_backward``). So, where backward may be traced again, forward
    keeps every tensor on ctx, as eager's ctx does; and such a trace sends no message of the
    user's code (it is refused, and eager's backward sends them, once).
    """
    if retrace is None and not tracing() and (modes := observing_modes()):  # (it would see the fakes)
        raise modes_refusal(fn_cls.__qualname__, modes, "captured")
    with TRACE_LOCK, quiet_torch_logs():  # a log line of torch's is never the caller's
        try:
            return _trace_planned(fn_cls, args, kwargs, grad_specs, retrace, dynamic, key_of, eager_fallback)
        except Exception as e:
            # Anything torch-internal left (minihop's own checks on what tracing made, such as
            # a size comparison): still minihop's refusal, never torch's exception type.
            name = getattr(fn_cls, "__qualname__", repr(fn_cls))
            refusal = refusal_for(e, f"Tracing {name}", None, format_frame(user_frame_of(e)))
            if refusal is None:
                raise
            raise refusal from e


def _trace_planned(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any],
                   grad_specs: tuple[GradSpec | None, ...] | None, retrace: TraceInputs | None,
                   dynamic: dict[int, tuple[int, ...]] | None, key_of: Callable[[Any], Any],
                   eager_fallback: bool = False) -> RawCapture:
    """Trace, and trace again as the trace asks (``unbacked.Retrace``): with a ShapeEnv once a
    data-dependent op is met, with a scalar read as a value read once Python branches on it.
    Each retrace asks for more than the last, so this ends."""
    plan = Plan(unbacked=bool(dynamic))
    while True:
        try:
            return _trace_function(fn_cls, args, kwargs, grad_specs, retrace, dynamic, plan, key_of, eager_fallback)
        except Retrace as again:
            if retrace is not None or again.plan == plan:
                raise again.refusal from None  # fake arguments of another trace: its mode stays
            plan = again.plan


def _trace_function(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any],
                    grad_specs: tuple[GradSpec | None, ...] | None, retrace: TraceInputs | None,
                    dynamic: dict[int, tuple[int, ...]] | None, plan: Plan,
                    key_of: Callable[[Any], Any], eager_fallback: bool = False) -> RawCapture:
    parts = function_parts(fn_cls)
    refuse_own_apply(fn_cls, parts.name)
    if retrace is not None:
        args = retrace.fake_args
        grad_on = retrace.grad_enabled
        t = Tracing(fn_cls, parts, retrace.fake_mode, {}, plan, key_of=key_of)
    else:
        args = bind_arguments(fn_cls, args, kwargs)
        grad_on = torch.is_grad_enabled()
        dynamic = dict(dynamic or {})
        mode = UnwatchedFakeMode(shape_env=shape_env()) if dynamic or plan.unbacked else UnwatchedFakeMode()
        if dynamic:
            # FakeTensorMode's op cache is shared by every mode; an entry made with this
            # trace's own ShapeEnv symbols is never hit again, and making it (sympy work per op)
            # was two thirds of a symbolic capture. Static captures keep it (their entries are
            # hit by later captures).
            mode.cache_enabled = False
        t = Tracing(fn_cls, parts, mode, dynamic, plan, key_of=key_of)
        t.values.real_args = args  # values read from the inputs' data are computed from these
    t.eager_fallback = eager_fallback
    refuse_hidden_tensors(parts, args, "argument")
    for i, a in enumerate(args):
        if issubclass(type(a), torch.nn.Module):
            for path, tensor in module_tensors(a):  # (plain tensor attributes too: ``self.mask``)
                t.module_paths.setdefault(id(tensor), (("arg", i), *(("attr", p) for p in path)))
    # Direct tensor arguments first: a tensor passed both directly and inside a container is
    # the Function's input (it gets a gradient), as in eager.
    for i, a in enumerate(args):
        if issubclass(type(a), torch.Tensor):
            t.fake_arg((("arg", i),), a)
    fake_args = tuple(replace_tensors(a, t.fake_arg, (("arg", i),)) for i, a in enumerate(args))
    if retrace is None and any(type(args[i]) is int for i in dynamic):
        fake_args = tuple(t.symbolic_int(i, a) if i in dynamic and type(a) is int else a
                          for i, a in enumerate(fake_args))
    ctx = ProxyCtx(tuple(issubclass(type(a), torch.Tensor) and a.requires_grad and grad_on for a in args),
                   t._describe, getattr(fn_cls, "_backward_cls", None))
    # Python state: what the user's code reads is guarded, what it writes is replayed or
    # refused, and whatever tracing changed is put back (see pystate).
    state = StateTracker(parts, fake_args, fn_cls, real_args=args)
    state.on_symbolic = t.unbacked.escape
    t.unrouted = state.opaque.reasons
    t.backward_reads.outside = state.outside_tensors  # (held before the trace: never fresh)
    state.start()
    state.hidden_reads.route = t.backward_reads.cached  # (lru_cache entries' tensors)
    try:
        return _trace_body(t, parts, fn_cls, fake_args, ctx, grad_on, grad_specs, state)
    except BaseException as e:
        # The user's locals die now, while the watches run (a ``__del__`` of theirs runs
        # as in eager's failed call, and what it writes is put back with the rest), not when
        # the caller drops the error.
        release_frames(e, drop=False)
        # ... and what the trace's ctx keeps (forward's objects, the snapshot of them): the
        # refusal's eager run makes its own, and these must not run their code later.
        t.ctx_after_forward = None
        vars(ctx).clear()
        t.fwd.let_go()
        t.bwd.let_go()
        handlers.caught()  # (its notes hold the error's frames, and so the trace's values)
        raise
    finally:
        state.abort()
        state.release()
        # However it ended, the trace keeps none of the caller's tensors (a refused one is
        # collected only with its cycles: eager frees them when the caller drops them).
        t.values.real_args = None


def _trace_body(t: Tracing, parts: FunctionParts, fn_cls: type, fake_args: tuple[Any, ...],
                ctx: ProxyCtx, grad_on: bool, grad_specs: tuple[GradSpec | None, ...] | None,
                state: StateTracker) -> RawCapture:
    record = ctx._minihop_record
    fwd_frame = FrameSnapshot()
    # (however forward or what follows ends, ``state.abort`` puts the caller's objects back:
    # no fake tensor stays in them)
    if parts.setup_context is None:
        out = t.run("forward", parts.forward, t.fwd, fwd_frame, ctx, *fake_args)
    else:
        out = t.run("forward", parts.forward, t.fwd, fwd_frame, *fake_args)
        t.run("setup_context", parts.setup_context, t.fwd, FrameSnapshot(), ctx, fake_args, out)
    t.unbacked.flush(t.fwd)
    t.unbacked.check_ranges(t.fwd)
    grad_can_flow = grad_on and any(issubclass(type(a), torch.Tensor) and a.requires_grad for a in fake_args)
    check_ctx_arguments(ctx, grad_can_flow)
    # An in-place write into an input that requires grad, without mark_dirty (torch.exp(x,
    # out=x)): eager allows it (forward runs under no_grad); the fwd graph makes the same write
    # into the caller's own tensor, so values, version counters and later autograd errors are
    # eager's (issue 31; tests/test_inplace_buffers.py TestInputsRequiringGrad).

    # Outputs: flatten in structure order; note which are top-level and which are inputs.
    flat: list[torch.Tensor] = []
    top: list[bool] = []

    def on_tensor(value: torch.Tensor, is_top: bool) -> int:
        flat.append(value)
        top.append(is_top)
        return len(flat) - 1

    refuse_hidden_tensors(parts, (out,), "output")
    refuse_unbacked_numbers(t, out)
    from_args = object_paths(fake_args)  # (returned: the caller's own objects)
    refuse_returned_state(parts.name, out, state.before or {}, parts.argnames, from_args, ctx)
    spec = describe_output(out, on_tensor, from_args=from_args)
    # One diff of the heap watch: the tensors forward put outside its return value are
    # taken back out first (``outside``), the rest is classified by the rule table.
    differences, after_forward = state.forward_changes()
    outside, rest = claim(differences, state.before, after_forward, tuple(flat), t.is_traced, parts.name,
                          code_of(parts.forward), parts.argnames)
    num_user_outputs = len(flat)
    outside_writes = hidden_outputs(t, outside.tensors, flat, top, fake_args)
    state.forward_done(rest)
    arg_ids = {id(v) for v in fake_args if issubclass(type(v), torch.Tensor)}
    where = fwd_frame.stack_trace.strip() if fwd_frame.stack_trace else None
    check_returned(t, parts, flat, top, record.dirty, where, arg_ids)
    fwd_outputs = t.fwd_outputs = tuple(t.fwd.node_for(v) for v in flat)
    dirty_ids = {id(d) for d in record.dirty}
    aliased = tuple(is_top and id(v) in arg_ids and id(v) not in dirty_ids
                    for v, is_top in zip(flat, top, strict=True))
    nondiff_ids = {id(v) for v in record.non_differentiable}
    non_differentiable_idx = tuple(i for i, v in enumerate(flat) if top[i] and id(v) in nondiff_ids)
    dirty_idx = tuple(i for i, v in enumerate(flat) if top[i] and id(v) in dirty_ids)

    # Tensor arguments forward never touched still get an input, so gradients line up.
    for a in fake_args:
        if issubclass(type(a), torch.Tensor):
            t.input_node(a)
    names = name_hints(fwd_frame.locals, lambda v: t.fwd.node_of.get(id(v)) if issubclass(type(v), torch.Tensor) else None,
                       t.fwd.stored)
    single = issubclass(type(out), torch.Tensor)
    for node in fwd_outputs[:num_user_outputs]:
        if node.op != "placeholder" and node not in names:
            names[node] = "outs" if single else "out"

    reads_before = record.saved_reads
    t.replay_outside = functools.partial(outside.replayed, again=True)  # the caller's containers as they are
    t.ctx_after_forward = ctx_as_forward_left_it(ctx, state.existed_before)  # entered now; again per rerun
    # backward sees what forward left, as in eager; a global's memo: read when backward runs
    emptied: list[Any] = []  # what backward did to forward's memos (memo_writes)
    with outside.replayed(t.backward_reads.stand_in, changes=emptied), t.ctx_after_forward:
        refuse_unkeyed_ctx_holders(parts.name, ctx)
        refuse_death_code(parts.name, "forward", (n.meta.get("val") for n in t.fwd.graph.nodes), ctx, out,
                          state.existed_before)
        forward_left = ctx_forward(ctx)  # what the caller sees on y.grad_fn, in eager
        share_arguments(ctx, (*fake_args, *(t.values.real_args or ())))
        ctx_before, objects_before = ctx_values(ctx), ctx_objects(ctx, state.existed_before)
        seen = seen_by_backward(state.reads, fake_args, t.key_of)  # forward's writes put back
        t.boxed_at_forward = getattr(fn_cls, "boxed_grads_call", False)  # (as autograd's node is made: backward.py)
        bwd = run_backward(t, parts, ctx, out, len(flat), fake_args, grad_specs, grad_on, t.values.real_args)
        t.backward_reads.check_unbacked_memos()
        refuse_death_code(parts.name, "backward", (n.meta.get("val") for n in t.bwd.graph.nodes), ctx,
                          existed=state.existed_before)
        ctx_after = ctx_values(ctx)
        refuse_ctx_rebinding(parts.name, objects_before, ctx_objects(ctx, state.existed_before))
    # Backward's value reads have computed forward's values from the caller's arguments; a
    # capture holds none of the caller's tensors (and its objects weakly: below).
    callers = tuple(f is a for f, a in zip(fake_args, t.values.real_args or ()))
    t.values.real_args = None
    state.ctx_view = outside.replayed
    left_names = {k for k, _ in forward_left}
    looked_up = tuple(dict.fromkeys((k, MISSING) for k in ctx._minihop_record.missing if k not in left_names))
    python_state = dataclasses.replace(with_seen(state.finish(ctx), seen), ctx_forward=forward_left + looked_up)
    if emptied:
        python_state = dataclasses.replace(python_state, writes=python_state.writes + backward_writes(
            parts.name, parts.argnames, emptied))
    if ctx_after != ctx_before:  # a second backward of the call reads what this one left
        refuse_symbolic_ctx_write(parts.name, ctx_before, ctx_after)
        python_state = dataclasses.replace(python_state, ctx_state=(ctx_before, ctx_after))
    other_path = any(r.guards_backward for r in t.values.reads) or reads_data_in_backward(python_state, state.args) \
        or python_state.ctx_state is not None
    if other_path or (t.eager_fallback and may_trace_backward_again(t, record, python_state)):
        # Another grad's values, or another Python value backward reads (a flag changed
        # between forward and ``.backward()``), may take backward down another path, traced
        # then: forward keeps what it could read, as eager's ctx does.
        save_everything(t, ctx)
        if t.eager_fallback:  # ... and what it cannot keep is refused now, not after forward ran
            EagerBackward(t, parts, ctx, None, fake_args).check()
    if other_path or python_state.reads_in("backward"):
        # ... and passes every tensor backward could read where it lives (an argument's
        # container on ctx; with another path, a global's or a helper's too).
        t.backward_reads.pass_all(every_route=other_path)
    fwd_names = dict(names)
    names.update(bwd.names)
    if t.dynamic_fakes:  # numbers from symbolic sizes: computed per call (inside trace(), the outer trace's)
        spec, outside_writes, python_state = resolve_symbolic(parts.name, t.symbol_sources, spec,
                                                              outside_writes, python_state)
    fwd_inputs = tuple((node, t.placeholder_sources[node])
                       for node in t.fwd.graph.nodes if node.op == "placeholder")
    made: list[RawCapture] = []
    fake_args = keep_weakly(fake_args, callers, ctx, t.ctx_after_forward)  # (they die when the caller lets go)
    raw = RawCapture(
        function_name=parts.name, argnames=parts.argnames,
        fwd_graph=t.fwd.graph, fwd_inputs=fwd_inputs, fwd_outputs=fwd_outputs,
        top_level=tuple(top), aliased=aliased, output_spec=spec,
        non_differentiable_idx=non_differentiable_idx, dirty_idx=dirty_idx,
        arg_inputs=tuple(t.input_node(a) if issubclass(type(a), torch.Tensor) else None for a in fake_args),
        saved_for_backward=tuple(saved_node(t, v) for v in (record.saved or ())),
        bwd_graph=t.bwd.graph,
        grad_inputs=tuple(t.grad_nodes.get(i) for i in range(len(flat))),
        grad_names=bwd.grad_names, grad_handed=bwd.grad_handed, bwd_saved=tuple(t.bwd_saved),
        arg_grads=bwd.arg_grads, names=names, materialize_grads=record.materialize_grads,
        return_trace=fwd_frame.stack_trace, once_differentiable=parts.once_differentiable,
        grad_assumptions=tuple(t.assumptions),
        inputs_for_retrace=TraceInputs(t.fake_mode, fake_args, grad_on),
        shape_guards=shape_guards(t.fake_mode.shape_env, t.dynamic_fakes, t.dynamic),
        ctx_features=tuple(record.used), reads_layout=t.reads_layout,
        python_state=python_state, outside_writes=outside_writes,
        data_reads=tuple(t.values.reads), saved_reads=record.saved_reads - reads_before,
        rerun_backward=functools.partial(rerun_backward, t, parts, fn_cls, ctx, out, len(flat), fake_args,
                                         grad_on, fwd_names, made),
        eager_backward=EagerBackward(t, parts, ctx, out, fake_args),
    )
    made.append(raw)
    return raw


