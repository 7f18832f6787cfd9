"""Running the user's backward on fake grads: once after forward, and again for a later call.

Place in the pipeline: tracer, called by ``trace._trace_body`` once forward has run (with
forward's outside writes replayed and ctx as forward left it): ``run_backward`` makes one fake
grad per tensor output (laid out as ``GradSpec`` says), runs backward into the bwd recorder and
checks what it returned against forward's arguments as eager does (count, types, shapes);
``rerun_backward`` traces backward again for the same forward (other grad layouts, Python
values that changed, values read from the call's data), the capture's ``rerun_backward``.

Invariants: a backward that cannot be reached (no gradient can flow) never fails the capture,
as eager never calls it; a rerun never runs forward again, and holds none of the call's
tensors once it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..errors import BackwardOutputError, MinihopError, UnsupportedOperationError, shows_fakes
from ..spec import READS_GRAD_MODE, PythonState, RawCapture
from ..structure import iter_leaves
from ..returned import describe_output
from .backward_reads import argument_tensors_on_ctx, forward_values_on_ctx
from .ctx import ProxyCtx
from .death_code import refuse_death_code
from .effects import ctx_values, refuse_symbolic_ctx_write, seed_ctx
from .function_parts import FunctionParts, function_parts
from .kept_args import live_arguments
from .memo_writes import seen_by_backward, with_seen
from .tensor_attr_reads import as_called, saved_outputs_bare
from .names import FrameSnapshot, name_hints
from .pystate import StateTracker
from .size_values import refusing_size_values
from .session import TRACE_LOCK, Tracing
from .symvalues import resolve_symbolic
from .unbacked import Retrace

__all__ = ["BackwardRun", "GradSpec", "may_trace_backward_again", "reads_data_in_backward", "rerun_backward", "run_backward", "save_everything"]


@dataclasses.dataclass(frozen=True)
class GradSpec:
    """The layout of one real incoming gradient, to trace backward for it (``None``: absent)."""

    stride: tuple[int, ...]
    requires_grad: bool


@dataclasses.dataclass(frozen=True)
class BackwardRun:
    """What one run of the user's backward gave: its gradients' nodes and node names."""

    arg_grads: tuple[fx.Node | None, ...]
    names: dict[fx.Node, str]
    grad_names: tuple[str | None, ...]
    grad_handed: tuple[bool, ...]  # per fwd output: backward received a tensor (not None)


def run_backward(t: Tracing, parts: FunctionParts, ctx: ProxyCtx, out: Any, num_outputs: int,
                 fake_args: tuple[Any, ...], grad_specs: tuple[GradSpec | None, ...] | None,
                 grad_on: bool, real_args: tuple[Any, ...] | None = None) -> BackwardRun:
    """Run the user's backward into ``t.bwd`` on fake grads laid out as ``grad_specs``
    (``real_args``: the caller's arguments, whose containers' tensors backward reads anew)."""
    # Backward: one grad per top-level item of forward's return value (None for non-tensors).
    ctx._minihop_record.reads_from = ctx._minihop_record.saved_reads  # (this backward's reads: ctx.saved_tensors)
    top_items = list(out) if issubclass(type(out), tuple) else [out]
    grads: list[Any] = []
    grad_names: list[str | None] = [None] * num_outputs
    grad_handed = [False] * num_outputs
    with t.fake_mode:
        flat_index = 0
        for item_index, item in enumerate(top_items):
            g = None
            if issubclass(type(item), torch.Tensor):
                if parts.gradnames is not None and item_index < len(parts.gradnames):
                    grad_names[flat_index] = parts.gradnames[item_index]
                grad_spec = _CONTIGUOUS if grad_specs is None else grad_specs[flat_index]
                if grad_spec is not None:
                    g = _fake_grad(item, grad_spec)
                    t.grad_of[id(g)] = flat_index
                    grad_handed[flat_index] = True
                    t.bwd.alive.append(g)
            grads.append(g)
            flat_index += len(_tensor_leaves(item))
    for g in grads:
        if g is not None:
            # Dynamo's order: bwd takes the grads first, then the size symbols their shapes
            # hold (saved from fwd), before anything backward reads.
            t.lift_shape_symbols(t.bwd, g)
    bwd_frame = FrameSnapshot()
    t.backward_reads.begin()  # where each tensor lives as backward starts (read, then deleted)
    grad_can_flow = grad_on and any(issubclass(type(a), torch.Tensor) and a.requires_grad for a in fake_args)
    try:
        # forward's values, not the places'; an argument container's tensors: the places' (backward_reads.py)
        with forward_values_on_ctx(t, ctx), argument_tensors_on_ctx(t, ctx, fake_args, real_args), \
                saved_outputs_bare(ctx._minihop_record.saved, _tensor_leaves(out), fake_args):
            # (autograd hands such a backward one list: its node was made boxed at forward, or the flag is set now)
            boxed = getattr(t, "boxed_at_forward", False) or getattr(t.fn_cls, "boxed_grads_call", False)
            result = t.run("backward", parts.backward, t.bwd, bwd_frame, ctx, *((list(grads),) if boxed else grads))
        arg_grads = _arg_grads(t, fake_args, result)
        t.unbacked.flush(t.bwd)
        t.unbacked.check_ranges(t.bwd)
    except Exception:
        if grad_can_flow and any(issubclass(type(item), torch.Tensor) for item in top_items):
            raise
        # No gradient can flow (grad mode off, no argument requires grad, no tensor output autograd
        # sees: only tensors nested in a dict, say): eager never calls this backward, so its
        # failure is not the caller's; bwd returns None for all.
        t.reset_backward()
        bwd_frame = FrameSnapshot()
        arg_grads = (None,) * len(fake_args)
    names = name_hints(bwd_frame.locals, lambda v: t.bwd.node_of.get(id(v)) if issubclass(type(v), torch.Tensor) else None,
                       t.bwd.stored)
    return BackwardRun(arg_grads, names, tuple(grad_names), tuple(grad_handed))


def save_everything(t: Tracing, ctx: ProxyCtx) -> None:
    """Backward branches on values it receives: another backward call may take code that
    reads other forward values, traced only then, after forward ran. So forward saves every
    tensor backward can reach (what the user saved, tensors on ctx), as eager keeps them."""
    record = ctx._minihop_record
    reachable = [*(record.saved or ()), *(leaf for name, value in vars(ctx).items()
                                          if not name.startswith("_minihop")
                                          for _, leaf in iter_leaves(value))]
    for value in reachable:
        if issubclass(type(value), torch.Tensor) and not t.is_traced(value):
            value = t.real_to_fake.get(id(value), value)  # a real tensor put on ctx: its lifted input
        if t.is_traced(value):
            t.bwd.node_for(value)  # a bwd placeholder, paired with its fwd node (bwd_saved)


def may_trace_backward_again(t: Tracing, record: Any, state: PythonState) -> bool:
    """Whether backward may be traced again after forward ran, for reasons other than the
    values it reads (those save everything anyway): it read its grads' layout, may be handed
    None, reads Python state or tensors from their places when it runs, or the grad mode."""
    return bool(t.assumptions) or not record.materialize_grads or bool(state.reads_in("backward")) \
        or any(s.read_in_backward for s in t.placeholder_sources.values()) \
        or any(n.meta.get(READS_GRAD_MODE) for n in t.bwd.graph.nodes)


def _in_place_write(graph: fx.Graph) -> str | None:
    """The first op of ``graph`` that writes into a tensor in place (``t.add_(v)``, ``out=``), or None."""
    for node in graph.nodes:
        name = getattr(node.target, "__name__", node.target) if node.op in ("call_method", "call_function") else ""
        if issubclass(type(name), str) and (name.endswith("_") and not name.endswith("__") or "out" in node.kwargs):
            return f"{name}()"
    return None


def reads_data_in_backward(state: PythonState, args: tuple[Any, ...]) -> bool:
    """Whether backward reads a Python value (not code: a function, class or module, which
    a program does not rebind between forward and ``.backward()``) checked again when it
    runs: a new value there traces backward again, after forward ran."""
    for read in state.reads_in("backward"):
        try:
            value = read.place.get(args)
        except Exception:
            return True
        if not (callable(value) or issubclass(type(value), types.ModuleType)):
            return True
    return False


def rerun_backward(t: Tracing, parts: FunctionParts, fn_cls: type, ctx: ProxyCtx, out: Any,
                   num_outputs: int, fake_args: tuple[Any, ...], grad_on: bool,
                   fwd_names: dict[fx.Node, str], made: list[RawCapture],
                   grad_specs: tuple[GradSpec | None, ...] | None,
                   call_args: tuple[Any, ...] = (),
                   call_data: tuple[dict[int, Any], dict[fx.Node, Any]] | None = None,
                   grad_mode: bool = False, ctx_state: dict[str, Any] | None = None) -> RawCapture:
    """Trace backward again, after the forward traced once: for grads laid out otherwise, for
    Python values backward reads that changed since forward ran, or for values backward
    takes out of its grads and saved values (``call_data``: the real ones, per fwd output and
    per fwd node). Forward is not run again: what it left on ctx is what the forward that
    really ran left (its reads are guarded), except that an argument object on ctx is the
    call's own (``call_args``). ``grad_mode``: traced with grad mode on, as eager runs backward
    under ``create_graph=True`` (for a backward that reads the mode). ``ctx_state``: the plain
    values on ctx an earlier backward of the call left (``effects.ctx_values``), where backward
    writes ctx: this backward starts from them, as eager's second backward does."""
    parts = function_parts(fn_cls)  # (the backward autograd calls now: rebound since forward, eager's calls the new one)
    with TRACE_LOCK, t.replay_outside(), t.ctx_after_forward:
        t.reset_backward()
        t.backward_reads.arguments(call_args)  # a module argument's tensors as they are now
        as_called(fake_args, call_args)  # (and a tensor argument's own attributes)
        kept, fake_args = fake_args, live_arguments(fake_args, call_args, parts.name)  # (the kept: weakly)
        swapped: dict[str, Any] = {}
        for name, value in vars(ctx).items():
            for held, real in zip(kept, call_args or fake_args):
                if value is held and not issubclass(type(held), torch.Tensor):
                    swapped[name] = value
                    object.__setattr__(ctx, name, real)
        if ctx_state is not None:
            seed_ctx(ctx, ctx_state)
        ctx_before = ctx_values(ctx)
        t.unbacked.backward_again()
        t.values.call_data = call_data
        state = StateTracker(parts, call_args or fake_args, fn_cls)
        state.on_symbolic = t.unbacked.escape
        # Traced for this very call, after its forward ran (with dynamic sizes, Python values
        # taken from sizes would be the capture's: see ``size_values``).
        state.standing = not t.dynamic_fakes
        state.opaque.again = True
        t.unrouted = state.opaque.reasons
        t.backward_reads.outside = state.outside_tensors  # (held before the trace: never fresh)
        state.start()
        state.hidden_reads.route = t.backward_reads.cached  # (lru_cache entries' tensors)
        if t.eager_fallback and state.messages is not None:
            state.messages.passing = False  # a message refuses the trace: eager's backward sends it
        state.forward_done()  # what changes now, backward changes
        t.backward_grad_on = grad_mode
        seen = seen_by_backward(state.reads, call_args or fake_args, t.key_of)
        try:
            sizes = refusing_size_values(parts.name, state.is_user) if t.dynamic_fakes else contextlib.nullcontext()
            with sizes:
                bwd = run_backward(t, parts, ctx, out, num_outputs, fake_args, grad_specs, grad_on,
                                   call_args or None)
            # (as at capture: what this trace made that runs the user's code when it dies)
            refuse_death_code(parts.name, "backward", (n.meta.get("val") for n in t.bwd.graph.nodes), ctx,
                              existed=state.existed_before)
            ctx_after = ctx_values(ctx)
            python_state = with_seen(state.finish(ctx), seen)  # undone: the runtime replays them
            if not call_args and python_state.backward_uses_args:
                raise UnsupportedOperationError(  # (the runtime would replay them on no arguments)
                    f"{parts.name}.backward, traced again for this call, reads or writes Python state in "
                    "the call's arguments, which the capture did not keep for it.",
                    "The backward captured with forward used none (the class's backward was rebound "
                    "since forward ran, say), so forward kept no arguments on ctx.",
                    f"Run it eagerly with minihop.function({parts.name}, fallback='eager'), or keep "
                    "the class's backward as it was when forward ran.")
            if ctx_after != ctx_before:
                refuse_symbolic_ctx_write(parts.name, ctx_before, ctx_after)
                python_state = dataclasses.replace(python_state, ctx_state=(ctx_before, ctx_after))
            if t.dynamic_fakes:  # numbers from symbolic sizes in its writes: computed per call, as at capture
                _, _, python_state = resolve_symbolic(parts.name, t.symbol_sources, made[0].output_spec, (), python_state)
        except Retrace as again:
            raise again.refusal from None  # forward is not traced again here
        except MinihopError:
            raise
        except Exception as raised:
            # The user's own error, in this call's backward: its writes stay, as eager's do. Not
            # where its text shows fakes, nor after an in-place write into a tensor (recorded into
            # a graph that never runs: eager's made it): eager's backward, run on the call's
            # values, decides what it raises (fallback runs it; strict refuses) and must start
            # from what was.
            unmade = _in_place_write(t.bwd.graph)
            if not shows_fakes(raised) and unmade is None:
                state.keep_partial()
            if unmade is not None:
                raise UnsupportedOperationError(
                    f"{parts.name}.backward, traced again for this call, raised {type(raised).__name__} after "
                    f"writing into a tensor in place ({unmade}).",
                    "Eager's backward makes that write before it raises; minihop records it into a graph, "
                    "which does not run when the trace raises.",
                    f"Run it eagerly with minihop.function({parts.name}, fallback='eager'), which runs "
                    "backward eagerly for such a call.") from raised
            raise
        finally:
            t.backward_grad_on = False
            state.abort()
            state.release()
            t.values.call_data = None  # the call's tensors are not kept
            for name, value in swapped.items():
                object.__setattr__(ctx, name, value)
        # A place this backward reads that the captured one did not (a key the caller added
        # to an argument's dict on ctx) has a fwd input of its own: fetched when backward runs.
        fwd_inputs = tuple((node, t.placeholder_sources[node]) for node in t.fwd.graph.nodes if node.op == "placeholder")
        return dataclasses.replace(
            made[0], fwd_inputs=fwd_inputs, bwd_graph=t.bwd.graph,
            grad_inputs=tuple(t.grad_nodes.get(i) for i in range(num_outputs)),
            grad_names=bwd.grad_names, grad_handed=bwd.grad_handed, bwd_saved=tuple(t.bwd_saved),
            arg_grads=bwd.arg_grads, names={**fwd_names, **bwd.names}, grad_assumptions=tuple(t.assumptions),
            python_state=python_state, data_reads=tuple(t.values.reads))


_CONTIGUOUS = GradSpec((), False)


def _fake_grad(out: torch.Tensor, spec: GradSpec) -> torch.Tensor:
    """A fake grad for ``out``: its shape, dtype and device, with the spec's strides."""
    if spec.stride:
        g = torch.empty_strided(out.shape, spec.stride, dtype=out.dtype, device=out.device)
    else:
        g = torch.empty(out.shape, dtype=out.dtype, device=out.device)
    if spec.requires_grad:
        g.requires_grad_(True)
    return g


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    describe_output(value, lambda v, _top: found.append(v) or 0, level=2)
    return found


def _arg_grads(t: Tracing, args: tuple[Any, ...], result: Any) -> tuple[fx.Node | None, ...]:
    """Check what backward returned against forward's arguments, as eager does."""
    name = t.parts.name
    grads = result if issubclass(type(result), tuple) else (result,)
    if len(grads) > len(args) and all(g is None for g in grads[len(args):]):
        grads = grads[: len(args)]  # eager drops trailing Nones
    if len(grads) != len(args):
        raise BackwardOutputError(
            f"{name}.backward returned {len(grads)} gradient(s), but forward takes "
            f"{len(args)} argument(s) ({', '.join(t.parts.argnames) or '-'}).",
            "autograd needs exactly one gradient (or None) per forward argument; eager "
            "raises 'returned an incorrect number of gradients' for this Function.",
            "Return one value per forward argument, None for those that need no gradient.",
        )
    nodes: list[fx.Node | None] = []
    for i, (arg, g) in enumerate(zip(args, grads, strict=True)):
        argname = t.parts.argnames[i] if i < len(t.parts.argnames) else f"args[{i}]"
        if g is None:
            nodes.append(None)
            continue
        if not issubclass(type(g), torch.Tensor):
            raise BackwardOutputError(
                f"{name}.backward returned a {type(g).__name__} as the gradient for "
                f"argument {i} ({argname}).",
                "A gradient must be a tensor or None.",
                f"Return a tensor shaped like {argname}, or None.",
            )
        if not issubclass(type(arg), torch.Tensor):
            raise BackwardOutputError(
                f"{name}.backward returned a tensor as the gradient for argument {i} "
                f"({argname}), which is a {type(arg).__name__}, not a tensor.",
                "Only tensor arguments can receive gradients; eager raises 'returned a "
                "gradient different than None ... not a Variable' for this Function.",
                f"Return None at position {i}.",
            )
        expected = tuple(arg.shape)
        found = tuple(g.shape)
        if not _same_shape(expected, found) and not _expandable(expected, found):
            raise BackwardOutputError(
                f"{name}.backward returned a gradient of shape {list(found)} for argument "
                f"{i} ({argname}).\n  expected: {list(expected)} (the shape of {argname})\n"
                f"  found:    {list(found)}",
                "A gradient must have its input's shape (or one that sums to it); eager "
                "raises 'returned an invalid gradient' for this Function.",
                "Fix the backward so this gradient has its input's shape.",
            )
        nodes.append(t.bwd.node_for(g))
    return tuple(nodes)


def _same_shape(expected: tuple[Any, ...], found: tuple[Any, ...]) -> bool:
    """Whether a gradient's shape is its input's. A data-dependent size (split by
    ``sizes.tolist()``, then reshaped) cannot be compared at trace time: the equality is
    checked on every call instead (an assert in bwd), where eager's autograd checks it."""
    if len(expected) != len(found):
        return False
    for e, f in zip(expected, found, strict=True):
        if issubclass(type(f), torch.SymInt) and free_unbacked_symbols(f):
            torch._check(f == e)
        elif f != e:
            return False
    return True


def _expandable(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (autograd then sums the gradient back)."""
    return len(shape) <= len(to) and all(a == b or a == 1 for a, b in zip(reversed(shape), reversed(to)))
