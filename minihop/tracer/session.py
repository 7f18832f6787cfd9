"""The state of one capture while its forward and backward are traced.

Place in the pipeline: tracer, made by ``trace._trace_function`` (one per trace) and handed to
every part of the trace: it owns the two ``GraphRecorder``s (fwd, bwd) and the
``RecordingMode``, makes the fake arguments and lifts tensors reached outside them as inputs
(each with its ``InputSource``), resolves a tensor or size symbol a graph has not seen
(placeholders: inputs, size symbols, grads, forward values saved for backward), notes forward's
in-place writes into inputs and what backward assumed of its grads, and runs each phase of the
user's code (``run``).

Invariants: every fake tensor the user's code can reach is an input with a source, a node one
of its graphs made, or refused; every forward value backward reads is a bwd placeholder paired
with its fwd node (``bwd_saved``), in the order backward first read it. One trace at a time
in a process (``TRACE_LOCK``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, GuardOnDataDependentSymNode, StatelessSymbolicContext

from ..errors import UnsupportedArgumentError, UnsupportedOperationError, last_made, made_in
from ..graph_names import grad_name, lifted_name, saved_name, symbol_name
from ..spec import EFFECT, InputSource, arg_place
from ..user_code import tensor_code, tensor_code_refusal
from ..arguments import is_dynamo_mark
from ..structure import Path, format_path, iter_leaves
from .backward_reads import BackwardReads
from .effects import refuse_generators
from .identity import KEY_HELD, TENSOR_LAYOUT, TENSOR_STATE, TENSOR_STORAGE, refuse_tensor_state
from .frames import format_frame, is_library_code, user_frame, user_frame_of
from .function_parts import FunctionParts
from . import handlers
from .grad_modes import refuse_through_applied, watching_applies
from .death_code import refuse_local_death_code
from .names import FrameSnapshot, capture_locals, input_name
from .op_args import version_of
from .recompute import rng_state_recorded
from .recorder import GraphRecorder, RecordingMode
from .special_calls import NOT_SPECIAL
from .refusals import refusal_for, unrecorded_tensor
from .routes import closure_routes, merged
from .run_context import compiled_code_runs_eagerly, symbols_printed_as_values
from .shape_guards import ArgSource
from .unbacked import Plan, UnbackedValues
from .values import ValueReader

__all__ = ["TRACE_LOCK", "GradAssumption", "Tracing"]


@dataclasses.dataclass(frozen=True)
class GradAssumption:
    """Backward read ``query(grad, *args, **kwargs) == expected`` of fwd output ``index``'s grad."""

    index: int
    query: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    expected: Any


# What autograd guarantees about a grad (it equals the output's): reading it assumes nothing.
_GRAD_FIXED = frozenset({
    "size", "shape", "dim", "ndim", "numel", "nelement", "dtype", "device", "layout", "__len__",
    "is_floating_point", "is_complex", "element_size", "is_cuda", "is_cpu", "is_sparse",
    "get_device", "__format__", "__repr__", "names",
})


# Reads of a tensor's memory layout: forward's graph may then depend on its inputs' strides.
_LAYOUT_READS = TENSOR_LAYOUT | {"data_ptr", "untyped_storage"}
# What only the caller's tensor can answer: read of one reached outside the arguments, the
# capture is single-use; of a fake copy, refused (``Tracing._on_state_read``).
_REAL_ONLY = TENSOR_STATE | TENSOR_STORAGE | _LAYOUT_READS


def _reading_frame(depth: int) -> str:
    """Where the user's code (``exec``'d code too) made the read ``depth`` frames up: torch's
    and minihop's frames between are skipped."""
    f = sys._getframe(depth)
    while f is not None and is_library_code(f.f_code.co_filename):
        f = f.f_back  # type: ignore[assignment]
    return "" if f is None else f'File "{f.f_code.co_filename}", line {f.f_lineno}'


class Tracing:
    """State of one capture while forward and backward are traced."""

    def __init__(self, fn_cls: type, parts: FunctionParts, fake_mode: FakeTensorMode,
                 dynamic: dict[int, tuple[int, ...]], plan: Plan = Plan(), *,
                 key_of: Callable[[Any], Any]) -> None:
        self.fn_cls = fn_cls
        self.key_of = key_of  # the runtime's key of a Python value (trace_function)
        self.eager_fallback = False  # fallback="eager" (trace_function): backward can run eagerly
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
        self.closure_routes = merged(closure_routes(parts.forward), closure_routes(parts.backward))
        # backward's own routes first: the place its code reads (``HIST[-1]``, not ``HIST[0]``)
        self.backward_reads = BackwardReads(self, lambda: merged(closure_routes(parts.backward),
                                                                 closure_routes(parts.forward), self.backward_reads.entries))
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
        self.backward_grad_on = False  # backward traced for create_graph=True (rerun_backward)
        self.mode = RecordingMode(self.fake_mode, self._lift_real, self._describe, self._on_query)
        self.mode.sources = self.sources  # recompute: which tensors are lifted (outside leaves)
        self.values = ValueReader(self, None)
        self.mode.on_value = self.values.read
        self.mode.on_constant = self.values.constant_result
        self.unbacked = UnbackedValues(self, plan)
        self.mode.unbacked = self.unbacked
        self.mode.on_state_read = self._on_state_read
        self.mode.state_reads = _REAL_ONLY
        self.mode.handler_stop = Tracing.run.__code__  # (the frame that calls the user's method)

    def reset_backward(self) -> None:
        """Forget what a run of backward recorded, to run it afresh."""
        self.bwd = GraphRecorder(self._resolve_bwd, self._resolve_bwd_symbol)
        self.grad_nodes.clear()
        self.bwd_saved.clear()
        self.assumptions.clear()
        self.values.reads = [r for r in self.values.reads if r.phase == "forward"]

    def _on_query(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """Backward read something of a grad that autograd does not fix: remember it. Forward
        or backward asked another tensor its layout, or anything the key does not answer
        (``KEY_HELD``): the capture then guards its arguments' strides and flags."""
        name = getattr(func, "__name__", "")
        asked = getattr(getattr(func, "__self__", None), "__name__", "") if name == "__get__" else name
        if (asked in _LAYOUT_READS or asked not in KEY_HELD) and args and issubclass(type(args[0]), torch.Tensor) \
                and id(args[0]) not in self.grad_of:
            self.reads_layout = True  # (a grad's own: the grad assumptions below)
        if self.phase != "backward":
            source = self.sources.get(id(args[0])) if args else None
            if source is not None and source.arg_index is None:
                self._lifted_query(func, asked, args[0], source)
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

    def _lifted_query(self, func: Any, name: str, fake: torch.Tensor, source: InputSource) -> None:
        """Forward read a property of a tensor it does not get as an argument itself (a
        global's, one in a list passed in): its layout is in no key (single-use); its shape,
        dtype, device and ``requires_grad`` are, once it is a graph input (made one here)."""
        if name in _LAYOUT_READS or name not in KEY_HELD:
            self.unrouted.append(f"reads {name}() of {source.description}, whose layout or flags no key holds "
                                 f"({_reading_frame(4)})")
        elif source.place is not None and not source.place.uses_args and self.mode.recorder is self.fwd:
            self.fwd.node_for(fake)

    def _on_state_read(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], attr: str) -> Any:
        """A tensor's autograd state, storage or layout read while tracing. Of the caller's own
        tensor (a global's, a module's parameter: reached outside the arguments), no key holds
        it: read by forward, answered from that tensor, for this call only (single-use); by
        backward, refused (eager reads it when backward runs). Of a fake copy standing
        for the caller's (an input, or in backward what forward saved), the copy would answer
        with its own: refused (MH104), as is the storage of any fake."""
        if sys._getframe(3).f_globals.get("__name__", "").startswith("minihop."):
            return NOT_SPECIAL  # (minihop's own bookkeeping: which inputs an op wrote)
        t, where = args[0], _reading_frame(3)
        entry = self.backward_reads.fakes.get(id(t)) if self.phase == "backward" else None
        fake = entry[1] if entry is not None and entry[0] is t else self.real_to_fake.get(id(t))
        if attr == "grad" and fake is not None and fake.grad is not None:
            return NOT_SPECIAL  # accumulated by the trace's own backward() (recompute): a graph read
        if not issubclass(type(t), FakeTensor):
            place = self.closure_routes.get(id(t), (None, None))[1]
            name = place.description if place is not None else "a tensor"
            if self.phase == "backward":  # (run after the caller may change it: the trace's answer is now's)
                refuse_tensor_state(self.parts.name, self.phase, name, attr, where,
                                    whose="a tensor it does not get as an argument, which eager reads when "
                                          "backward runs")
            self.unrouted.append(f"reads {name if place is not None else ''}.{attr} of a tensor it does not get as "
                                 f"an argument (a global's, a module's parameter), which no key holds ({where})")
            return func(*args, **kwargs)
        source = self.sources.get(id(t))
        saved = source is None and self.phase == "backward" and id(t) in self.fwd.node_of
        if source is not None or saved:  # (read by anyone: torch's clip_grad_norm_ reads .grad too)
            if attr in TENSOR_STORAGE or attr in TENSOR_STATE:
                refuse_tensor_state(self.parts.name, self.phase, source.description if source is not None
                                    else "a tensor forward saved", attr, where,
                                    whose="a tensor argument" if source is not None else "a tensor of the trace")
        elif attr in TENSOR_STORAGE and not is_library_code(sys._getframe(3).f_code.co_filename):
            # (torch's own code asks a fake it made for its storage: fake tensors answer that)
            refuse_tensor_state(self.parts.name, self.phase, "a tensor it made", attr, where,
                                whose="a tensor of the trace")
        return NOT_SPECIAL

    def is_traced(self, value: Any) -> bool:
        """Whether ``value`` is a fake tensor of this trace (an input's, or one forward made)."""
        return issubclass(type(value), FakeTensor) and value.fake_mode is self.fake_mode and (
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
            if issubclass(type(real), FakeTensor):
                fake = real
            elif dims:
                fake = self._fake(real, dims, format_path(path, self.parts.argnames))
                self.dynamic_fakes.append((arg_index, fake))
            else:
                fake = self._fake(real)
            self.real_to_fake[id(real)] = fake
            source = InputSource(input_name(path, self.parts.argnames),
                                 format_path(path, self.parts.argnames), arg_place(path), arg_index)
            self._add_source(fake, source)
            for d, size in enumerate(fake.shape):
                if issubclass(type(size), torch.SymInt) and size.node.expr.is_Symbol:
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
                                 and not any(issubclass(type(leaf), torch.Tensor) for _, leaf in iter_leaves(v)))
        return fake

    def _lift_real(self, real: torch.Tensor) -> torch.Tensor:
        code = tensor_code(real, 0)  # (a subclass's own __torch_function__: refused before any read runs it)
        if code is not None:
            raise tensor_code_refusal(f"{self._describe()} reads", code)
        late = self.backward_reads.lift(real) if self.phase == "backward" else None
        if late is not None:
            return late  # read from its place when backward runs (tracer/backward_reads.py)
        fake = self.real_to_fake.get(id(real))
        if fake is None:
            fake = self._fake(real)
            self.real_to_fake[id(real)] = fake
            path = self.module_paths.get(id(real))
            if path is not None:
                # A parameter or buffer of a module argument: read from the argument each call.
                self._add_source(fake, InputSource(
                    input_name(path, self.parts.argnames), format_path(path, self.parts.argnames),
                    arg_place(path), None))
                return fake
            name, place = self.closure_routes.get(id(real), (lifted_name(len(self.sources)), None))
            if place is None and self.backward_reads.again:
                # Backward traced again meets a tensor the first trace did not (a global
                # rebound since forward): forward has run, it cannot be passed in any more.
                raise self.backward_reads.unknown(name)
            if place is None:  # reached where no route leads (a helper's global, another Function's)
                self.unrouted.append(f"reads a tensor from {self._describe()} that minihop cannot fetch again")
            self._add_source(fake, InputSource(
                name, f"tensor reached from {self._describe()} ({name})", place, None, real))
        return fake

    def _add_source(self, fake: torch.Tensor, source: InputSource) -> None:
        self.sources[id(fake)] = source
        self.input_versions[id(fake)] = (fake, version_of(fake))

    def _on_fwd_mutation(self, node: fx.Node) -> None:
        """Which inputs ``node`` wrote into: those whose version counter moved (a write through
        a view or ``detach()`` of an input moves the input's counter too, as in eager)."""
        for key, (fake, version) in self.input_versions.items():
            if version_of(fake) != version:
                self.input_versions[key] = (fake, version_of(fake))
                self.input_writes.append((node, fake))
                node.meta[EFFECT] = (f"{getattr(node.target, '__name__', node.target)} writes "
                                     f"{self.sources[key].description} in place: written back (the "
                                     "fwd graph writes the caller's tensor, as eager)")

    def _resolve_fwd(self, rec: GraphRecorder, value: torch.Tensor) -> fx.Node:
        source = self.sources.get(id(value))
        if source is None:
            raise unrecorded_tensor(self._describe(), value, self.fake_mode, format_frame(user_frame()))
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
            source.place if source.path is not None else None, None, dim=dim)
        return node

    def symbolic_int(self, index: int, value: int) -> int | torch.SymInt:
        """A dynamic int argument as a SymInt (a fwd input read from the argument itself); 0
        and 1 stay plain ints, specialised as sizes are."""
        env = self.fake_mode.shape_env
        name = format_path((("arg", index),), self.parts.argnames)
        source = ArgSource(name)
        symbol = env.create_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
        symint = env.create_symintnode(symbol, hint=value, source=source)
        if issubclass(type(symint), torch.SymInt):
            self.symbol_sources[symbol] = (InputSource(name, name, arg_place((("arg", index),)), None), None, symint)
        self.dynamic_fakes.append((index, symint))
        return symint

    def _resolve_bwd_symbol(self, rec: GraphRecorder, symbol: sympy.Symbol) -> fx.Node:
        fwd_node = self.fwd.node_for_expr(symbol)
        return self._saved_placeholder(rec, fwd_node, fwd_node.meta.get("val"))

    def _saved_placeholder(self, rec: GraphRecorder, fwd_node: fx.Node, value: Any) -> fx.Node:
        node = rec.placeholder(saved_name(fwd_node.name), value)
        self.bwd_saved.append((node, fwd_node))
        return node

    def lift_shape_symbols(self, rec: GraphRecorder, value: torch.Tensor) -> None:
        """Sizes in a bwd input's shape come in as saved values before it (Dynamo's order)."""
        for size in value.shape:
            if issubclass(type(size), torch.SymInt):
                for symbol in sorted(size.node.expr.free_symbols, key=str):
                    rec.node_for_expr(symbol)

    def input_node(self, value: torch.Tensor) -> fx.Node:
        """The placeholder of an input (even after an in-place op rebound its value)."""
        node = self.input_nodes.get(id(value))
        return node if node is not None else self.fwd.node_for(value)

    def _resolve_bwd(self, rec: GraphRecorder, value: torch.Tensor) -> fx.Node:
        self.lift_shape_symbols(rec, value)
        index = self.grad_of.get(id(value))
        if index is not None:
            node = rec.placeholder(grad_name(index), value)
            self.grad_nodes[index] = node
            return node
        # a forward value (or input) backward reads
        return self._saved_placeholder(rec, self.fwd.node_for(value), value)

    # -- running the user's code ---------------------------------------------------------
    def run(self, phase: str, fn: Any, recorder: GraphRecorder, snapshot: FrameSnapshot, *args: Any) -> Any:
        self.phase = self.mode.phase = phase  # grad_modes records backward's switches its way
        self.mode.recorder = recorder
        recorder.escape = self.unbacked.escape
        recorder.numbers = self.unbacked.numbers
        handlers.start()
        made_in(+1)
        try:
            # no_grad is entered before the recording mode, so its own toggles are not recorded.
            # Backward traced for ``create_graph=True`` (it reads the grad mode) runs with it on.
            grad = torch.enable_grad() if phase == "backward" and self.backward_grad_on else torch.no_grad()
            with grad, self.fake_mode, self.mode, capture_locals(fn, snapshot), \
                    rng_state_recorded(self.mode), compiled_code_runs_eagerly(), \
                    symbols_printed_as_values(self.fake_mode.shape_env), watching_applies(recorder, phase == "backward") as applied:
                result = fn(*args)
            caught = handlers.caught()
            if caught is not None:
                raise caught  # (a refusal the user's own ``except`` caught: the trace took its path)
            if applied:  # (another Function's apply: its node is eager's under create_graph)
                with grad, self.fake_mode:
                    refuse_through_applied(self.mode, applied, result, self._describe())
            refuse_generators(recorder.generators, self._describe())
            refuse_local_death_code(self.parts.name, phase, snapshot.death_code)
            return result
        except Exception as e:
            if type(e) is TypeError and last_made() is not None and str(e).startswith("unsupported operand"):
                raise last_made() from None  # (a refusal inside ``x * y``: NotImplemented to torch)
            # Ops are translated where they run (RecordingMode); this catches torch-internal
            # errors from the user's Python between ops (a guard on a size, say).
            if issubclass(type(e), GuardOnDataDependentSymNode):
                raise self.unbacked.on_guard(e, format_frame(user_frame_of(e))) from e
            refusal = refusal_for(e, self._describe(), None, format_frame(user_frame_of(e)))
            if refusal is None:
                raise
            raise refusal from e
        finally:
            handlers.caught()  # (cleared)
            self.mode.recorder = None
            made_in(-1)


# One trace at a time in a process: torch's fake-tensor machinery keeps process-wide state
# (lazy imports, kernel-invocation flags) that concurrent traces in several threads trip over.
# Captures are rare (once per key); running captured graphs needs no lock.
TRACE_LOCK = threading.RLock()
