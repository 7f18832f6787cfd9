"""Trace a user's ``autograd.Function`` into two raw graphs.

Place in the pipeline: the tracer's entry point (``trace_function``). Forward runs under
no-grad on fake copies of the arguments, with a proxy ctx; backward then runs on fake grads and
whatever forward values it reaches. The result, ``RawCapture``, holds both raw graphs and
everything the rewire needs to make them consistent; nothing here reorders or renames.

Invariants: every tensor forward reaches is a recorded node or a placeholder with an
``InputSource``; every forward value backward reads is a backward placeholder paired with its
forward node (``bwd_saved``), in the order backward first read it.
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import dataclasses
import functools
import operator
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import sympy
from torch._guards import GuardSource, Source
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    GuardOnDataDependentSymNode,
    ShapeEnv,
    StatelessSymbolicContext,
    free_unbacked_symbols,
)

from ..errors import (
    BackwardOutputError,
    InplaceInputError,
    SideEffectError,
    UnsupportedArgumentError,
    UnsupportedOperationError,
    UnsupportedOutputError,
)
from ..spec import (EFFECT, DataRead, InputSource, OutsideWrite, PythonState, RawCapture, bind_arguments, is_dynamo_mark)
from ..structure import OutputSpec, Path, attributes, describe_output, format_path, iter_leaves, replace_tensors
from .collectives import WRITE_BACK
from .ctx import ProxyCtx, check_ctx_arguments
from .function_parts import FunctionParts, function_parts
from .routes import closure_routes
from .run_context import compiled_code_runs_eagerly, symbols_printed_as_values
from .shape_guards import ArgSource, shape_env, shape_guards
from .pystate import StateTracker, is_library
from ..graph_names import (free_value_root, grad_name, held_name, lifted_name, parameter_name, saved_name,
                           symbol_name, tensor_name)
from .names import FrameSnapshot, capture_locals, code_of, free_values, input_name, name_hints
from .outside import OutsideTensor, find_outside_tensors, outside_roots, snapshot_outside
from .values import ValueReader
from .unbacked import Plan, Retrace, UnbackedValues
from .symvalues import resolve_symbolic
from .torchlogs import quiet_torch_logs
from .recompute import rng_state_recorded
from .effects import ctx_as_forward_left_it, refuse_generators
from .frames import format_frame, is_library_code, user_frame, user_frame_of
from .recorder import GraphRecorder, RecordingMode
from .refusals import refusal_for

__all__ = ["TRACE_LOCK", "GradAssumption", "GradSpec", "RawCapture", "TraceInputs", "function_parts", "trace_function"]


@dataclasses.dataclass(frozen=True)
class GradSpec:
    """The layout of one real incoming gradient, to trace backward for it (``None``: absent)."""

    stride: tuple[int, ...]
    requires_grad: bool


@dataclasses.dataclass(frozen=True)
class GradAssumption:
    """Backward read ``query(grad, *args, **kwargs) == expected`` of fwd output ``index``'s grad."""

    index: int
    query: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    expected: Any


@dataclasses.dataclass(frozen=True)
class TraceInputs:
    """Fake arguments of a finished trace, to trace again (another grad layout) without
    holding the caller's real tensors."""

    fake_mode: FakeTensorMode
    fake_args: tuple[Any, ...]
    grad_enabled: bool


# What autograd guarantees about a grad (it equals the output's): reading it assumes nothing.
_GRAD_FIXED = frozenset({
    "size", "shape", "dim", "ndim", "numel", "nelement", "dtype", "device", "layout", "__len__",
    "is_floating_point", "is_complex", "element_size", "is_cuda", "is_cpu", "is_sparse",
    "get_device", "__format__", "__repr__", "names",
})


# Reads of a tensor's memory layout: forward's graph may then depend on its inputs' strides.
_LAYOUT_READS = frozenset({"stride", "is_contiguous", "is_non_overlapping_and_dense",
                           "storage_offset", "data_ptr", "untyped_storage", "_is_view"})


class _Tracing:
    """State of one capture while forward and backward are traced."""

    def __init__(self, fn_cls: type, parts: FunctionParts, fake_mode: FakeTensorMode,
                 dynamic: dict[int, tuple[int, ...]], plan: Plan = Plan()) -> None:
        self.fn_cls = fn_cls
        self.parts = parts
        self.fake_mode = fake_mode
        self.assumptions: list[GradAssumption] = []
        self.input_nodes: dict[int, fx.Node] = {}
        self.reads_layout = False
        self.sources: dict[int, InputSource] = {}  # id(fake) -> where the input comes from
        # id(fake input) -> (the fake, its version counter when last looked at)
        self.input_versions: dict[int, tuple[torch.Tensor, int]] = {}
        # Forward's in-place writes into inputs, in op order: (node, fake input written).
        self.input_writes: list[tuple[fx.Node, torch.Tensor]] = []
        self.real_to_fake: dict[int, torch.Tensor] = {}
        self.closure_routes = {**closure_routes(parts.backward), **closure_routes(parts.forward)}
        self.unrouted: list[str] = []  # tensors held as traced (no route to fetch them): single-use
        self.module_paths: dict[int, Path] = {}
        self.fwd = GraphRecorder(self._resolve_fwd, self._resolve_fwd_symbol)
        self.replay_outside: Any = contextlib.nullcontext  # forward's outside writes, for backward
        self.ctx_after_forward: Any = contextlib.nullcontext()  # ctx as forward left it, for backward
        self.fwd.on_mutation = self._on_fwd_mutation
        self.bwd = GraphRecorder(self._resolve_bwd, self._resolve_bwd_symbol)
        self.dynamic = dynamic
        # size symbol -> (input tensor's source, dim, SymInt); and each dynamic input's symbols
        self.symbol_sources: dict[sympy.Symbol, tuple[InputSource, int, torch.SymInt]] = {}
        self.input_symbols: dict[int, list[sympy.Symbol]] = {}
        self.placeholder_sources: dict[fx.Node, InputSource] = {}
        self.dynamic_fakes: list[tuple[int, Any]] = []  # (position, fake tensor or SymInt)
        self.grad_of: dict[int, int] = {}  # id(fake grad) -> flat output index
        self.grad_nodes: dict[int, fx.Node] = {}
        self.fwd_outputs: tuple[fx.Node, ...] = ()  # per flat output, once forward has run
        self.bwd_saved: list[tuple[fx.Node, fx.Node]] = []
        self.phase = "forward"
        self.mode = RecordingMode(self.fake_mode, self._lift_real, self._describe, self._on_query)
        self.mode.sources = self.sources  # recompute: which tensors are lifted (outside leaves)
        self.values = ValueReader(self, None)
        self.mode.on_value = self.values.read
        self.mode.on_constant = self.values.constant_result
        self.unbacked = UnbackedValues(self, plan)
        self.mode.unbacked = self.unbacked

    def reset_backward(self) -> None:
        """Forget what a run of backward recorded, to run it afresh."""
        self.bwd = GraphRecorder(self._resolve_bwd, self._resolve_bwd_symbol)
        self.grad_nodes.clear()
        self.bwd_saved.clear()
        self.assumptions.clear()
        self.values.reads = [r for r in self.values.reads if r.phase == "forward"]

    def _on_query(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """Backward read something of a grad that autograd does not fix: remember it.
        Forward read a tensor's layout: the capture then guards its arguments' strides."""
        name = getattr(func, "__name__", "")
        if self.phase != "backward":
            if name in _LAYOUT_READS:
                self.reads_layout = True
            if args and id(args[0]) in self.input_symbols and id(args[0]) not in self.fwd.node_of \
                    and self.mode.recorder is self.fwd:
                # Forward read the size of a dynamic input before using it (x.shape[0]): Dynamo
                # takes the input (after its size symbols) there, at its first touch.
                self.fwd.node_for(args[0])
            return
        if not args or name in _GRAD_FIXED:
            return
        if name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") in _GRAD_FIXED:
            return
        index = self.grad_of.get(id(args[0]))
        if index is not None:
            self.assumptions.append(GradAssumption(index, func, tuple(args[1:]), tuple(kwargs.items()), result))

    def is_traced(self, value: Any) -> bool:
        """Whether ``value`` is a fake tensor of this trace (an input's, or one forward made)."""
        return isinstance(value, FakeTensor) and value.fake_mode is self.fake_mode and (
            id(value) in self.sources or id(value) in self.fwd.node_of)

    def _describe(self) -> str:
        return f"{self.parts.name}.{self.phase}"

    def recorder(self) -> GraphRecorder:
        """The graph the running phase records into."""
        return self.bwd if self.phase == "backward" else self.fwd

    # -- inputs ---------------------------------------------------------------------------
    def fake_arg(self, path: Path, real: torch.Tensor) -> torch.Tensor:
        if type(real) not in (torch.Tensor, torch.nn.Parameter, FakeTensor):
            raise UnsupportedArgumentError(
                f"{self.parts.name}.apply got a {type(real).__name__} (a tensor subclass) at "
                f"{format_path(path, self.parts.argnames)}.",
                "minihop traces on plain fake tensors; a subclass's own __torch_function__ or "
                "__torch_dispatch__ behaviour would be lost.",
                "Pass a plain tensor (t.as_subclass(torch.Tensor)), or run this Function eagerly.",
            )
        fake = self.real_to_fake.get(id(real))
        if fake is None:
            arg_index = path[0][1] if len(path) == 1 and path[0][0] == "arg" else None
            dims = self.dynamic.get(arg_index, ()) if arg_index is not None else ()
            if isinstance(real, FakeTensor):
                fake = real
            elif dims:
                fake = self._fake(real, dims, format_path(path, self.parts.argnames))
                self.dynamic_fakes.append((arg_index, fake))
            else:
                fake = self._fake(real)
            self.real_to_fake[id(real)] = fake
            source = InputSource(input_name(path, self.parts.argnames),
                                 format_path(path, self.parts.argnames), path, arg_index)
            self._add_source(fake, source)
            for d, size in enumerate(fake.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    self.symbol_sources.setdefault(size.node.expr, (source, d, size))
                    self.input_symbols.setdefault(id(fake), []).append(size.node.expr)
        return fake

    def _fake(self, real: torch.Tensor, dims: tuple[int, ...] = (), name: str | None = None) -> torch.Tensor:
        """A fake whose sizes ``dims`` are symbolic (named ``name``), the others concrete, also
        when this capture has dynamic ones elsewhere; it carries the real tensor's Python
        attributes (``x.scale``: the call key holds them, so the graphs may use them)."""
        if self.fake_mode.shape_env is None:
            fake = self.fake_mode.from_tensor(real)
        else:
            sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(real.dim())]
            context = StatelessSymbolicContext(dynamic_sizes=sizes, constraint_sizes=[None] * real.dim())
            fake = self.fake_mode.from_tensor(real, symbolic_context=context,
                                              source=None if name is None else ArgSource(name))
        if real.__dict__:
            fake.__dict__.update((k, v) for k, v in real.__dict__.items()
                                 if not is_dynamo_mark(k)
                                 and not any(isinstance(leaf, torch.Tensor) for _, leaf in iter_leaves(v)))
        return fake

    def _lift_real(self, real: torch.Tensor) -> torch.Tensor:
        fake = self.real_to_fake.get(id(real))
        if fake is None:
            fake = self._fake(real)
            self.real_to_fake[id(real)] = fake
            path = self.module_paths.get(id(real))
            if path is not None:
                # A parameter or buffer of a module argument: read from the argument each call.
                self._add_source(fake, InputSource(
                    input_name(path, self.parts.argnames), format_path(path, self.parts.argnames),
                    path, None))
                return fake
            name, live = self.closure_routes.get(id(real), (lifted_name(len(self.sources)), None))
            if live is None:  # reached where no route leads (a helper's global, another Function's)
                self.unrouted.append(f"reads a tensor from {self._describe()} that minihop cannot fetch again")
            self._add_source(fake, InputSource(
                name, f"tensor reached from {self._describe()} ({name})", None, None, real,
                live=live))
        return fake

    def _add_source(self, fake: torch.Tensor, source: InputSource) -> None:
        self.sources[id(fake)] = source
        self.input_versions[id(fake)] = (fake, fake._version)

    def _on_fwd_mutation(self, node: fx.Node) -> None:
        """Which inputs ``node`` wrote into: those whose version counter moved (a write through
        a view or ``detach()`` of an input moves the input's counter too, as in eager)."""
        for key, (fake, version) in self.input_versions.items():
            if fake._version != version:
                self.input_versions[key] = (fake, fake._version)
                self.input_writes.append((node, fake))
                node.meta[EFFECT] = (f"{getattr(node.target, '__name__', node.target)} writes "
                                     f"{self.sources[key].description} in place: written back (the "
                                     "fwd graph writes the caller's tensor, as eager)")

    def _resolve_fwd(self, rec: GraphRecorder, value: torch.Tensor) -> fx.Node:
        source = self.sources.get(id(value))
        if source is None:
            raise UnsupportedArgumentError(
                f"{self._describe()} used a fake tensor that minihop did not create.",
                "Fake tensors from another capture or FakeTensorMode cannot be mixed in.",
                "Pass real tensors to minihop.capture.",
                where=format_frame(user_frame()),
            )
        for symbol in self.input_symbols.get(id(value), ()):
            rec.node_for_expr(symbol)  # Dynamo's order: a size symbol just before its tensor
        node = rec.placeholder(source.name, value)
        self.input_nodes[id(value)] = node
        self.placeholder_sources[node] = source
        return node

    def _resolve_fwd_symbol(self, rec: GraphRecorder, symbol: sympy.Symbol) -> fx.Node:
        entry = self.symbol_sources.get(symbol)
        if entry is None:
            raise UnsupportedOperationError(
                f"{self._describe()} uses a size ({symbol}) that is no input's dimension.",
                "minihop passes size symbols in from the dynamic inputs' shapes.",
                "Capture without dynamic shapes for this Function.")
        source, dim, size = entry
        node = rec.placeholder(symbol_name(symbol), size)
        self.placeholder_sources[node] = InputSource(
            str(symbol), source.description if dim is None else f"{source.description}.size({dim})",
            source.path, None, dim=dim)
        return node

    def symbolic_int(self, index: int, value: int) -> int | torch.SymInt:
        """A dynamic int argument as a SymInt (a fwd input read from the argument itself); 0
        and 1 stay plain ints, specialised as sizes are."""
        env = self.fake_mode.shape_env
        name = format_path((("arg", index),), self.parts.argnames)
        source = ArgSource(name)
        symbol = env.create_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
        symint = env.create_symintnode(symbol, hint=value, source=source)
        if isinstance(symint, torch.SymInt):
            self.symbol_sources[symbol] = (InputSource(name, name, (("arg", index),), None), None, symint)
        self.dynamic_fakes.append((index, symint))
        return symint

    def _resolve_bwd_symbol(self, rec: GraphRecorder, symbol: sympy.Symbol) -> fx.Node:
        fwd_node = self.fwd.node_for_expr(symbol)
        return self._saved_placeholder(rec, fwd_node, fwd_node.meta.get("val"))

    def _saved_placeholder(self, rec: GraphRecorder, fwd_node: fx.Node, value: Any) -> fx.Node:
        node = rec.placeholder(saved_name(fwd_node.name), value)
        self.bwd_saved.append((node, fwd_node))
        return node

    def _lift_shape_symbols(self, rec: GraphRecorder, value: torch.Tensor) -> None:
        """Sizes in a bwd input's shape come in as saved values before it (Dynamo's order)."""
        for size in value.shape:
            if isinstance(size, torch.SymInt):
                for symbol in sorted(size.node.expr.free_symbols, key=str):
                    rec.node_for_expr(symbol)

    def input_node(self, value: torch.Tensor) -> fx.Node:
        """The placeholder of an input (even after an in-place op rebound its value)."""
        node = self.input_nodes.get(id(value))
        return node if node is not None else self.fwd.node_for(value)

    def _resolve_bwd(self, rec: GraphRecorder, value: torch.Tensor) -> fx.Node:
        self._lift_shape_symbols(rec, value)
        index = self.grad_of.get(id(value))
        if index is not None:
            node = rec.placeholder(grad_name(index), value)
            self.grad_nodes[index] = node
            return node
        # a forward value (or input) backward reads
        return self._saved_placeholder(rec, self.fwd.node_for(value), value)

    # -- running the user's code ---------------------------------------------------------
    def run(self, phase: str, fn: Any, recorder: GraphRecorder, snapshot: FrameSnapshot,
            *args: Any) -> Any:
        self.phase = self.mode.phase = phase  # grad_modes records backward's switches its way
        self.mode.recorder = recorder
        recorder.escape = self.unbacked.escape
        recorder.numbers = self.unbacked.numbers
        try:
            # no_grad is entered before the recording mode, so its own toggles are not recorded.
            with torch.no_grad(), self.fake_mode, self.mode, capture_locals(fn, snapshot), \
                    rng_state_recorded(self.mode), compiled_code_runs_eagerly(), symbols_printed_as_values(self.fake_mode.shape_env):
                result = fn(*args)
            refuse_generators(recorder.generators, self._describe())
            return result
        except Exception as e:
            # Ops are translated where they run (RecordingMode); this catches torch-internal
            # errors from the user's Python between ops (a guard on a size, say).
            if isinstance(e, GuardOnDataDependentSymNode):
                raise self.unbacked.on_guard(e, format_frame(user_frame_of(e))) from e
            refusal = refusal_for(e, self._describe(), None, format_frame(user_frame_of(e)))
            if refusal is None:
                raise
            raise refusal from e
        finally:
            self.mode.recorder = None


def trace_function(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                   grad_specs: tuple[GradSpec | None, ...] | None = None,
                   retrace: TraceInputs | None = None,
                   dynamic: dict[int, tuple[int, ...]] | None = None) -> RawCapture:
    """Run ``fn_cls``'s forward and backward symbolically and return both raw graphs.

    ``grad_specs`` (one per fwd output; default: contiguous grads) sets the layout of the fake
    grads backward is traced with; ``retrace`` reuses the fake arguments of an earlier trace.
    """
    with TRACE_LOCK, quiet_torch_logs():  # a log line of torch's is never the caller's
        try:
            return _trace_planned(fn_cls, args, kwargs, grad_specs, retrace, dynamic)
        except Exception as e:
            # Anything torch-internal left (minihop's own checks on what tracing made, such as
            # a size comparison): still minihop's refusal, never torch's exception type.
            name = getattr(fn_cls, "__qualname__", repr(fn_cls))
            refusal = refusal_for(e, f"Tracing {name}", None, format_frame(user_frame_of(e)))
            if refusal is None:
                raise
            raise refusal from e


# One trace at a time in a process: torch's fake-tensor machinery keeps process-wide state
# (lazy imports, kernel-invocation flags) that concurrent traces in several threads trip over.
# Captures are rare (once per key); running captured graphs needs no lock.
TRACE_LOCK = threading.RLock()


def _trace_planned(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any],
                   grad_specs: tuple[GradSpec | None, ...] | None, retrace: TraceInputs | None,
                   dynamic: dict[int, tuple[int, ...]] | None) -> RawCapture:
    """Trace, and trace again as the trace asks (``unbacked.Retrace``): with a ShapeEnv once a
    data-dependent op is met, with a scalar read as a value read once Python branches on it.
    Each retrace asks for more than the last, so this ends."""
    plan = Plan(unbacked=bool(dynamic))
    while True:
        try:
            return _trace_function(fn_cls, args, kwargs, grad_specs, retrace, dynamic, plan)
        except Retrace as again:
            if retrace is not None or again.plan == plan:
                raise again.refusal from None  # fake arguments of another trace: its mode stays
            plan = again.plan


def _trace_function(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any],
                    grad_specs: tuple[GradSpec | None, ...] | None, retrace: TraceInputs | None,
                    dynamic: dict[int, tuple[int, ...]] | None, plan: Plan) -> RawCapture:
    parts = function_parts(fn_cls)
    if retrace is not None:
        args = retrace.fake_args
        grad_on = retrace.grad_enabled
        t = _Tracing(fn_cls, parts, retrace.fake_mode, {}, plan)
    else:
        args = bind_arguments(fn_cls, args, kwargs)
        grad_on = torch.is_grad_enabled()
        dynamic = dict(dynamic or {})
        mode = FakeTensorMode(shape_env=shape_env()) if dynamic or plan.unbacked else FakeTensorMode()
        if dynamic:
            # FakeTensorMode's op cache is shared by every mode; an entry made with this
            # trace's own ShapeEnv symbols is never hit again, and making it (sympy work per op)
            # was two thirds of a symbolic capture. Static captures keep it (their entries are
            # hit by later captures).
            mode.cache_enabled = False
        t = _Tracing(fn_cls, parts, mode, dynamic, plan)
        t.values.real_args = args  # values read from the inputs' data are computed from these
    _refuse_hidden_tensors(parts, args, "argument")
    for i, a in enumerate(args):
        if isinstance(a, torch.nn.Module):
            for pname, tensor in (*a.named_parameters(), *a.named_buffers()):
                t.module_paths.setdefault(id(tensor), (("arg", i), *(("attr", p) for p in pname.split("."))))
    # Direct tensor arguments first: a tensor passed both directly and inside a container is
    # the Function's input (it gets a gradient), as in eager.
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            t.fake_arg((("arg", i),), a)
    fake_args = tuple(replace_tensors(a, t.fake_arg, (("arg", i),)) for i, a in enumerate(args))
    if retrace is None and any(type(args[i]) is int for i in dynamic):
        fake_args = tuple(t.symbolic_int(i, a) if i in dynamic and type(a) is int else a
                          for i, a in enumerate(fake_args))
    ctx = ProxyCtx(tuple(isinstance(a, torch.Tensor) and a.requires_grad and grad_on for a in args),
                   t._describe)
    # Python state: what the user's code reads is guarded, what it writes is replayed or
    # refused, and whatever tracing changed is put back (see pystate).
    state = StateTracker(parts, fake_args, fn_cls)
    state.on_symbolic = t.unbacked.escape
    t.unrouted = state.opaque.reasons
    state.start()
    try:
        return _trace_body(t, parts, fn_cls, fake_args, ctx, grad_on, grad_specs, state)
    finally:
        state.abort()


def _trace_body(t: "_Tracing", parts: FunctionParts, fn_cls: type, fake_args: tuple[Any, ...],
                ctx: ProxyCtx, grad_on: bool, grad_specs: tuple[GradSpec | None, ...] | None,
                state: StateTracker) -> RawCapture:
    record = ctx._minihop_record
    fwd_frame = FrameSnapshot()
    outside = snapshot_outside(outside_roots(parts.forward, fake_args))
    try:
        if parts.setup_context is None:
            out = t.run("forward", parts.forward, t.fwd, fwd_frame, ctx, *fake_args)
        else:
            out = t.run("forward", parts.forward, t.fwd, fwd_frame, *fake_args)
            t.run("setup_context", parts.setup_context, t.fwd, FrameSnapshot(), ctx, fake_args, out)
    except BaseException:
        outside.restore()  # no fake tensor stays in the caller's objects
        raise
    t.unbacked.flush(t.fwd)
    t.unbacked.check_ranges(t.fwd)
    grad_can_flow = grad_on and any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args)
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

    try:
        _refuse_hidden_tensors(parts, (out,), "output")
        _refuse_unbacked_numbers(t, out)
        spec = describe_output(out, on_tensor)
        found = find_outside_tensors(outside, tuple(flat), t.is_traced, parts.name,
                                     code_of(parts.forward), parts.argnames)
        num_user_outputs = len(flat)
        outside_writes = _hidden_outputs(t, found, flat, top, fake_args)
    except BaseException:
        outside.restore()  # refused: as if forward had not run (eager may run it next)
        raise
    state.forward_done()  # after the tensors written outside were taken back out
    fwd_outputs = t.fwd_outputs = tuple(t.fwd.node_for(v) for v in flat)
    arg_ids = {id(v) for v in fake_args if isinstance(v, torch.Tensor)}
    dirty_ids = {id(d) for d in record.dirty}
    aliased = tuple(is_top and id(v) in arg_ids and id(v) not in dirty_ids
                    for v, is_top in zip(flat, top, strict=True))
    where = fwd_frame.stack_trace.strip() if fwd_frame.stack_trace else None
    nondiff_ids = {id(v) for v in record.non_differentiable}
    non_differentiable_idx = tuple(i for i, v in enumerate(flat) if top[i] and id(v) in nondiff_ids)
    dirty_idx = tuple(i for i, v in enumerate(flat) if top[i] and id(v) in dirty_ids)
    for v, is_top in zip(flat, top, strict=True):
        source = t.sources.get(id(v))
        if is_top and source is not None and source.lifted:
            raise UnsupportedOutputError(
                f"{parts.name}.forward returns {source.description}, a tensor it reached "
                "through an object, container, closure or module, as one of its outputs.",
                "Eager does not see that tensor as an input, so it rewrites the tensor's own "
                "autograd history in place (it stops being a leaf); minihop does not copy that.",
                f"Return {source.description}.clone(), or pass the tensor as a direct argument.",
                where=where)
    returned_ids = {id(v) for v, is_top in zip(flat, top, strict=True) if is_top}
    if any(id(d) not in returned_ids for d in record.dirty):
        raise InplaceInputError(
            f"{parts.name}.forward marks an input dirty (ctx.mark_dirty) but does not return it.",
            "Eager raises 'Some elements marked as dirty during the forward method were not "
            "returned as output': autograd rewrites a dirty input's history through the "
            "Function's outputs, so it must be one.",
            "Return the modified input as one of forward's outputs.",
            where=where)

    # Tensor arguments forward never touched still get an input, so gradients line up.
    for a in fake_args:
        if isinstance(a, torch.Tensor):
            t.input_node(a)
    names = name_hints(fwd_frame.locals, lambda v: t.fwd.node_of.get(id(v)) if isinstance(v, torch.Tensor) else None,
                       t.fwd.stored)
    single = isinstance(out, torch.Tensor)
    for node in fwd_outputs[:num_user_outputs]:
        if node.op != "placeholder" and node not in names:
            names[node] = "outs" if single else "out"

    reads_before = record.saved_reads
    t.replay_outside = outside.replayed
    t.ctx_after_forward = ctx_as_forward_left_it(ctx, state.existed_before)  # entered now; again per rerun
    with outside.replayed(), t.ctx_after_forward:  # backward sees what forward left, as in eager
        bwd = _run_backward(t, parts, ctx, out, len(flat), fake_args, grad_specs, grad_on)
    # Backward's value reads have computed forward's values from the caller's arguments; a
    # capture holds none of the caller's tensors.
    t.values.real_args = None
    if any(r.guards_backward for r in t.values.reads):
        _save_everything(t, ctx)
    fwd_names = dict(names)
    names.update(bwd.names)
    python_state = state.finish(ctx)
    if t.dynamic_fakes:  # numbers from symbolic sizes: computed per call (inside trace(), the outer trace's)
        spec, outside_writes, python_state = resolve_symbolic(parts.name, t.symbol_sources, spec,
                                                              outside_writes, python_state)
    fwd_inputs = tuple((node, t.placeholder_sources[node])
                       for node in t.fwd.graph.nodes if node.op == "placeholder")
    made: list[RawCapture] = []
    raw = RawCapture(
        function_name=parts.name, argnames=parts.argnames,
        fwd_graph=t.fwd.graph, fwd_inputs=fwd_inputs, fwd_outputs=fwd_outputs,
        top_level=tuple(top), aliased=aliased, output_spec=spec,
        non_differentiable_idx=non_differentiable_idx, dirty_idx=dirty_idx,
        arg_inputs=tuple(t.input_node(a) if isinstance(a, torch.Tensor) else None for a in fake_args),
        saved_for_backward=tuple(_saved_node(t, v) for v in (record.saved or ())),
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
        rerun_backward=functools.partial(_rerun_backward, t, parts, fn_cls, ctx, out, len(flat), fake_args,
                                         grad_on, fwd_names, made),
    )
    made.append(raw)
    return raw


@dataclasses.dataclass(frozen=True)
class _Backward:
    """What one run of the user's backward gave: its gradients' nodes and node names."""

    arg_grads: tuple[fx.Node | None, ...]
    names: dict[fx.Node, str]
    grad_names: tuple[str | None, ...]
    grad_handed: tuple[bool, ...]  # per fwd output: backward received a tensor (not None)


def _run_backward(t: "_Tracing", parts: FunctionParts, ctx: ProxyCtx, out: Any, num_outputs: int,
                  fake_args: tuple[Any, ...], grad_specs: tuple[GradSpec | None, ...] | None,
                  grad_on: bool) -> _Backward:
    """Run the user's backward into ``t.bwd`` on fake grads laid out as ``grad_specs``."""
    # Backward: one grad per top-level item of forward's return value (None for non-tensors).
    top_items = list(out) if isinstance(out, tuple) else [out]
    grads: list[Any] = []
    grad_names: list[str | None] = [None] * num_outputs
    grad_handed = [False] * num_outputs
    with t.fake_mode:
        flat_index = 0
        for item_index, item in enumerate(top_items):
            g = None
            if isinstance(item, torch.Tensor):
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
            t._lift_shape_symbols(t.bwd, g)
    bwd_frame = FrameSnapshot()
    grad_can_flow = grad_on and any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args)
    try:
        result = t.run("backward", parts.backward, t.bwd, bwd_frame, ctx, *grads)
        arg_grads = _arg_grads(t, fake_args, result)
        t.unbacked.flush(t.bwd)
        t.unbacked.check_ranges(t.bwd)
    except Exception:
        if grad_can_flow and any(isinstance(item, torch.Tensor) for item in top_items):
            raise
        # No gradient can flow (grad mode off, no argument requires grad, no tensor output autograd
        # sees: only tensors nested in a dict, say): eager never calls this backward, so its
        # failure is not the caller's; bwd returns None for all.
        t.reset_backward()
        bwd_frame = FrameSnapshot()
        arg_grads = (None,) * len(fake_args)
    names = name_hints(bwd_frame.locals, lambda v: t.bwd.node_of.get(id(v)) if isinstance(v, torch.Tensor) else None,
                       t.bwd.stored)
    return _Backward(arg_grads, names, tuple(grad_names), tuple(grad_handed))


def _save_everything(t: "_Tracing", ctx: ProxyCtx) -> None:
    """Backward branches on values it receives: another backward call may take code that
    reads other forward values, traced only then, after forward ran. So forward saves every
    tensor backward can reach (what the user saved, tensors on ctx), as eager keeps them."""
    record = ctx._minihop_record
    reachable = [*(record.saved or ()), *(leaf for name, value in vars(ctx).items()
                                          if not name.startswith("_minihop")
                                          for _, leaf in iter_leaves(value))]
    for value in reachable:
        if t.is_traced(value):
            t.bwd.node_for(value)  # a bwd placeholder, paired with its fwd node (bwd_saved)


def _rerun_backward(t: "_Tracing", parts: FunctionParts, fn_cls: type, ctx: ProxyCtx, out: Any,
                    num_outputs: int, fake_args: tuple[Any, ...], grad_on: bool,
                    fwd_names: dict[fx.Node, str], made: list[RawCapture],
                    grad_specs: tuple[GradSpec | None, ...] | None,
                    call_args: tuple[Any, ...] = (),
                    call_data: tuple[dict[int, Any], dict[fx.Node, Any]] | None = None) -> RawCapture:
    """Trace backward again, after the forward traced once: for grads laid out otherwise, for
    Python values backward reads that changed since forward ran, or for values backward
    takes out of its grads and saved values (``call_data``: the real ones, per fwd output and
    per fwd node). Forward is not run again: what it left on ctx is what the forward that
    really ran left (its reads are guarded), except that an argument object on ctx is the
    call's own (``call_args``)."""
    with TRACE_LOCK, t.replay_outside(), t.ctx_after_forward:
        t.reset_backward()
        swapped: dict[str, Any] = {}
        if call_args:
            for name, value in vars(ctx).items():
                for fake, real in zip(fake_args, call_args):
                    if value is fake and not isinstance(fake, torch.Tensor):
                        swapped[name] = value
                        object.__setattr__(ctx, name, real)
        t.unbacked.backward_again()
        t.values.call_data = call_data
        state = StateTracker(parts, call_args or fake_args, fn_cls)
        state.on_symbolic = t.unbacked.escape
        t.unrouted = state.opaque.reasons
        state.start()
        state.forward_done()  # what changes now, backward changes
        try:
            bwd = _run_backward(t, parts, ctx, out, num_outputs, fake_args, grad_specs, grad_on)
            python_state = state.finish(ctx)  # undone: the runtime replays them
        except Retrace as again:
            raise again.refusal from None  # forward is not traced again here
        finally:
            state.abort()
            t.values.call_data = None  # the call's tensors are not kept
            for name, value in swapped.items():
                object.__setattr__(ctx, name, value)
        return dataclasses.replace(
            made[0], bwd_graph=t.bwd.graph,
            grad_inputs=tuple(t.grad_nodes.get(i) for i in range(num_outputs)),
            grad_names=bwd.grad_names, grad_handed=bwd.grad_handed, bwd_saved=tuple(t.bwd_saved),
            arg_grads=bwd.arg_grads, names={**fwd_names, **bwd.names}, grad_assumptions=tuple(t.assumptions),
            python_state=python_state, data_reads=tuple(t.values.reads))


def _hidden_outputs(t: _Tracing, found: tuple[OutsideTensor, ...],
                    flat: list[torch.Tensor],
                    top: list[bool], fake_args: tuple[Any, ...]) -> tuple[OutsideWrite, ...]:
    """Each tensor forward put outside its return value becomes a hidden fwd output (appended
    to ``flat``, not top-level); returns the writes the runtime repeats on every call."""
    arg_ids = {id(a) for a in fake_args if isinstance(a, torch.Tensor)}
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


def _refuse_unbacked_numbers(t: _Tracing, out: Any) -> None:
    """A number read from data returned as a Python value would be replayed as its symbol:
    its read becomes a value read (``Retrace``), or the trace is refused."""
    for _path, leaf in iter_leaves((out,)):
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)) and free_unbacked_symbols(leaf):
            raise t.unbacked.escape(leaf.node.expr, None, "forward returns it as a Python number")


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


def _saved_node(t: _Tracing, value: Any) -> fx.Node | None:
    """The fwd node of a value passed to ``ctx.save_for_backward`` (None for None)."""
    if not isinstance(value, torch.Tensor):
        return None
    node = t.fwd.node_of.get(id(value))
    if node is None and id(value) in t.sources:
        node = t.input_node(value)  # an input forward only saved
    return node


def _refuse_hidden_tensors(parts: FunctionParts, values: tuple[Any, ...], what: str) -> None:
    """Tensors inside sets (or other unordered containers) cannot be passed through a graph."""
    for path, leaf in iter_leaves(values):
        if what == "output" and isinstance(leaf, collections.abc.Iterator):
            raise UnsupportedOutputError(
                f"{parts.name}.forward returns a {type(leaf).__name__} (an iterator).",
                "An iterator made while tracing runs on minihop's fake tensors; replaying the "
                "graphs cannot make it again, so it would hand out fake values.",
                "Return a tuple or list (tuple(gen)) instead.")
        if isinstance(leaf, (set, frozenset)) and any(isinstance(v, torch.Tensor) for v in leaf):
            where = (format_path((("arg", path[0][1]), *path[1:]), parts.argnames) if what == "argument"
                     else "the returned value")
            error = UnsupportedArgumentError if what == "argument" else UnsupportedOutputError
            raise error(
                f"{parts.name} {'gets' if what == 'argument' else 'returns'} a "
                f"{type(leaf).__name__} holding tensors ({where or 'forward output'}).",
                "A set has no order, so its tensors cannot be matched to graph inputs or "
                "outputs from one call to the next.",
                "Use a tuple, list or dict instead.")


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    describe_output(value, lambda v, _top: found.append(v) or 0, level=2)
    return found


def _arg_grads(t: _Tracing, args: tuple[Any, ...], result: Any) -> tuple[fx.Node | None, ...]:
    """Check what backward returned against forward's arguments, as eager does."""
    name = t.parts.name
    grads = result if isinstance(result, tuple) else (result,)
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
        if not isinstance(g, torch.Tensor):
            raise BackwardOutputError(
                f"{name}.backward returned a {type(g).__name__} as the gradient for "
                f"argument {i} ({argname}).",
                "A gradient must be a tensor or None.",
                f"Return a tensor shaped like {argname}, or None.",
            )
        if not isinstance(arg, torch.Tensor):
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
        if isinstance(f, torch.SymInt) and free_unbacked_symbols(f):
            torch._check(f == e)
        elif f != e:
            return False
    return True


def _expandable(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (autograd then sums the gradient back)."""
    return len(shape) <= len(to) and all(a == b or a == 1 for a, b in zip(reversed(shape), reversed(to)))
