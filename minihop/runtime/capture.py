"""``Capture``: the result of capturing a Function, and the callable that runs it.

Place in the pipeline: runtime. Built from a ``Pair`` (and its outer graph); holds the graphs
and metadata a consumer reads, and a hot path prepared once: an input-fetch function generated
from the input paths, the ``autograd.Function`` subclass, and the output-rebuild plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..errors import GuardMismatchError
from ..spec import NO_STATE, Pair, DataRead, InputSource, PythonState
from ..arguments import bind_arguments, uses_setup_context
from ..returned import OutputSpec
from .assumptions import Assumption, assumptions_of, backward_values, compile_fits
from .backwards import keeps_arguments
from .eager_runs import EagerRunner
from .function import Retrace, make_function, set_call_arguments
from .function_keys import methods_check, methods_held, methods_key
from .display import readable, summary
from .fetch import fetch_positional, fetcher
from .single_use import once
from .streams import run_on_stream
from .transformable import calling
from .writes import Writer, make_writer

__all__ = ["Capture", "copy_module", "make_capture", "readable"]

_is_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active


def copy_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A GraphModule over a copy of ``gm``'s graph (nodes, names and ``meta`` copied; the
    values in ``meta`` shared): editing it leaves ``gm`` as it was."""
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class Capture:
    """A captured ``autograd.Function``: the consistent pair, its metadata, and ``__call__``.

    ``fwd``/``bwd`` are the pair (see docs/graph_contract.md); ``graph`` is the outer
    graph calling them once (runnable, in Dynamo's layout); ``inputs`` says where each fwd
    input comes from (``lifted`` ones are pulled out of objects, containers or closures);
    ``output_spec`` rebuilds the user's output structure. ``key`` is what the capture assumed
    of its arguments; calling it with arguments of other properties raises
    ``GuardMismatchError``.
    """

    function: type | None
    pair: Pair
    # Builds ``graph``; called on first access (no call needs the outer graph, and building
    # it costs as much as a third of a capture).
    _make_graph: Callable[[], fx.GraphModule] = dataclasses.field(repr=False, compare=False)
    inputs: tuple[InputSource, ...]
    non_differentiable_idx: tuple[int, ...]
    dirty_idx: tuple[int, ...]
    saved_for_backward_idx: tuple[int, ...]
    output_spec: OutputSpec
    top_level: tuple[bool, ...]
    key: tuple[Any, ...]
    argnames: tuple[str, ...]
    python_state: PythonState = NO_STATE
    # Attributes of argument objects left out of ``key`` (counters forward increments).
    masks: dict[int, frozenset[str]] = dataclasses.field(default_factory=dict)
    dynamic_dims: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    shape_guards: Any = None
    capture_seconds: float = 0.0
    _function: type[torch.autograd.Function] = dataclasses.field(repr=False, default=None)  # type: ignore[assignment]
    # Everything the capture assumed of the calls it serves, in the order a call is checked
    # (single use, key, values read outside the arguments, layout, shape guards, values read
    # from data; then what backward checks when it runs): see ``runtime/assumptions.py``.
    assumptions: tuple[Assumption, ...] = dataclasses.field(repr=False, default=())
    # The hot path, prepared by make_capture. ``fits(args)``: whether a call's (positional)
    # arguments fit this capture -- the assumptions' checks compiled into one function; the cache asks
    # it and nothing else. ``run(args)``: fetch the fwd inputs, apply the Function, rebuild the
    # user's output, without checking (the caller asked ``fits``).
    fits: Callable[[tuple[Any, ...]], bool] = dataclasses.field(repr=False, default=lambda args: False)
    # Python values forward and backward took out of tensor data (``tracer.values``); the
    # ones guarding forward are recomputed from each call's inputs (one check per read), those
    # guarding backward before each backward (``runtime.backwards``).
    data_reads: tuple[DataRead, ...] = ()
    run: Callable[[tuple[Any, ...]], Any] = dataclasses.field(repr=False, default=None)  # type: ignore[assignment]
    # ``function``'s methods when captured (``function_keys.methods_key``) and the objects the
    # key names by id: a direct call checks them (the cache keys them itself).
    methods: tuple[Any, ...] | None = dataclasses.field(repr=False, compare=False, default=None)
    _methods_held: list[Any] = dataclasses.field(repr=False, compare=False, default_factory=list)
    _same_methods: Callable[[type], bool] = dataclasses.field(repr=False, compare=False, default=lambda F: True)

    # One source of truth: the pair a capture runs is the one it shows, prints and saves. So
    # ``fwd``, ``bwd`` and ``graph`` are copies, made on each access: editing one (torch.fx
    # passes, ``recompile()``) changes that copy only, never this capture. To run edited
    # graphs, build a capture from them: ``minihop.with_graphs(cap, fwd=..., bwd=...)``
    # checks the graph contract again and runs (and shows) exactly those.

    @property
    def fwd(self) -> fx.GraphModule:
        """A copy of the fwd graph (``fwd_body_0``)."""
        return copy_module(self.pair.fwd)

    @property
    def bwd(self) -> fx.GraphModule:
        """A copy of the bwd graph (``bwd_body_0``)."""
        return copy_module(self.pair.bwd)

    @property
    def graph(self) -> fx.GraphModule:
        """A copy of the outer graph: runnable ``(*fwd_inputs) -> outputs``, calling the pair once."""
        return self._make_graph()

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Arguments to positions, as ``Function.apply`` binds them."""
        if self.function is None:  # loaded from an artifact: positions only
            if kwargs:
                raise TypeError(f"a loaded capture of {self.name} takes positional arguments only")
            return args
        return bind_arguments(self.function, args, kwargs)

    @property
    def name(self) -> str:
        return self.pair.function_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return self._under_compiler(args, kwargs)
        if self.methods is not None and not self._same_methods(self.function):
            raise self._methods_replaced()
        if not kwargs and self.fits(args):
            return self.run(args)
        args = self.bind(args, kwargs)
        for assumption in self.assumptions:  # the first that fails says why
            error = assumption.mismatch(args)
            if error is not None:
                raise error
        return self.run(args)

    def _methods_replaced(self) -> GuardMismatchError:
        return GuardMismatchError(
            f"{self.name}'s forward, backward, setup_context or vjp is not the one captured: "
            "the method was replaced, or its defaults or code, since this capture was made.",
            "A capture runs the graphs traced from the methods as they were; the Function now "
            "computes something else.",
            f"Capture again (minihop.capture({self.name}, ...)), or call it through "
            "minihop.apply or minihop.function, which capture again by themselves.")

    def on_stream(self, stream: Any) -> Callable[..., Any]:
        """This capture as a callable whose calls run on CUDA ``stream``: forward there (and so
        backward, by autograd's stream semantics), with the waits and ``record_stream`` calls
        that keep inputs, outputs and saved tensors valid (see ``runtime.streams``)."""
        def call(*args: Any, **kwargs: Any) -> Any:
            return run_on_stream(lambda: self(*args, **kwargs), (*args, *kwargs.values()), stream)

        return call

    def _under_compiler(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # torch.compile traces the Function itself (as it would F.apply): the same program,
        # captured by the compiler's own mechanism instead of minihop's generated code.
        if self.function is None:
            # A plain RuntimeError: the compiler can build it while tracing (not minihop's own
            # error class), so its message reaches the user.
            raise RuntimeError(
                f"minihop: a capture of {self.name} loaded from an artifact was called under "
                "torch.compile. Under the compiler minihop hands it the original Function "
                "class, which a loaded capture does not have. Call it outside torch.compile, "
                "or compile a function that calls the original Function (or minihop.apply).")
        return self.function.apply(*args, **kwargs)

    def __str__(self) -> str:
        return readable(self.graph)

    def __repr__(self) -> str:  # one line: the Function, its arguments, dynamic dimensions
        return summary(self.name, self.argnames, self.key, self.dynamic_dims)

    def fwd_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """The fwd graph's inputs for this call, in the graph contract's order (lifted tensors
        detached, size symbols as ints): what another system's fwd of this Function takes."""
        return fetcher(self.inputs)(self.bind(args, kwargs), {})

    def save(self, path: str) -> None:
        """Write the capture to ``path``, a versioned artifact ``minihop.load`` reads (format: ``runtime/artifact.py``)."""
        from .artifact import save_capture

        save_capture(self, path)


def _runner(function: type[torch.autograd.Function], inputs: tuple[InputSource, ...], arity: int,
            spec: OutputSpec, top_level: tuple[bool, ...],
            user_function: type | None = None, writer: Writer | None = None,
            eager_transformed: bool = False) -> Callable[[tuple[Any, ...]], Any]:
    """``args -> the user's output``: fetch, apply, rebuild, in the fewest steps this capture
    allows (decided here, once; see ``make_function`` for the Function's calling forms).
    ``writer`` puts what forward wrote outside its return value in place (``writes.py``)."""
    fetch = fetch_positional(inputs, arity)
    run = _plain_runner(function, fetch, spec, top_level, writer)
    transformable = getattr(function, "transformable", None)
    custom_vmap = user_function is not None and (eager_transformed or  # (the code asked what ctx is)
                                                 getattr(user_function, "vmap", None) is not torch.autograd.Function.vmap)
    if transformable is None and not custom_vmap:
        return run  # an old-style Function: torch.func refuses it, as it refuses eager's

    def run_transformed(args: tuple[Any, ...]) -> Any:
        if custom_vmap:
            # The user's own vmap rule is written for the user's arguments: run the Function
            # eagerly under transforms (the transform then sees exactly eager's Function).
            return user_function.apply(*args)  # type: ignore[union-attr]
        with calling(args):
            result = transformable.apply(*(args if fetch is None else fetch(args)))
        flat: list[Any] = [None] * len(top_level)
        for k, i in enumerate(transformable.order):
            flat[i] = result[k]
        if writer is not None:
            writer(args, flat)
        return spec.rebuild(flat, args)

    def run_any(args: tuple[Any, ...]) -> Any:
        if _transforms_active():
            return run_transformed(args)
        return run(args)

    return run_any


def _plain_runner(function: type[torch.autograd.Function], fetch: Callable[[tuple[Any, ...]], Any] | None,
                  spec: OutputSpec, top_level: tuple[bool, ...],
                  writer: Writer | None = None) -> Callable[[tuple[Any, ...]], Any]:
    apply = function.apply
    # None: the arguments are the fwd inputs (the common forms below skip the call entirely).
    get = fetch or _same
    if getattr(function, "uses_sink", False):
        def run_nested(args: tuple[Any, ...]) -> Any:
            sink: list[Any] = []
            result = apply(sink, *get(args))
            flat: list[Any] = [None] * (len(result) + len(sink))
            top = iter(result)
            nested = iter(sink)
            for i, is_top in enumerate(top_level):
                flat[i] = next(top) if is_top else next(nested)
            if writer is not None:
                writer(args, flat)
            return spec.rebuild(flat, args)
        return run_nested
    if writer is not None:
        # Forward wrote only tensors it also returns (``sink.append(y); return y``): every fwd
        # output is top-level, so the Function's result is the flat outputs.
        single = getattr(function, "single_output", False)

        def run_written(args: tuple[Any, ...]) -> Any:
            result = apply(*get(args))
            flat = (result,) if single else result
            writer(args, flat)
            return spec.rebuild(flat, args)
        return run_written
    # The Function's result is already the user's: one tensor, or the tuple of outputs in order.
    as_is = getattr(function, "single_output", False) or (
        spec.kind == "tuple" and all(c.kind == "tensor" for c in spec.children)
        and tuple(c.index for c in spec.children) == tuple(range(len(top_level))))
    if as_is:
        if fetch is None:
            return lambda args: apply(*args)
        return lambda args: apply(*fetch(args))
    if spec.kind == "tensor":
        return lambda args: apply(*get(args))[spec.index]
    return lambda args: spec.rebuild(apply(*get(args)), args)


def _same(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return args


def _with_replay(run: Callable[[tuple[Any, ...]], Any], state: PythonState,
                 pair: Pair, keep_args: bool) -> Callable[[tuple[Any, ...]], Any]:
    """``run``, then forward's Python writes replayed for the call (as eager's forward makes
    them on every call; tracing undid its own)."""
    writes = state.writes_in("forward")
    if keep_args or keeps_arguments(pair, state):
        inner = run

        def run(args: tuple[Any, ...]) -> Any:
            # Backward reads or writes state inside an argument object: forward keeps the
            # call's arguments on ctx (see make_function).
            set_call_arguments(args)
            try:
                return inner(args)
            finally:
                set_call_arguments(None)
    if not writes:
        return run

    def run_and_replay(args: tuple[Any, ...]) -> Any:
        out = run(args)
        for write in writes:
            write.replay(args)
        return out

    return run_and_replay


def make_capture(pair: Pair, outer: Callable[[], fx.GraphModule], function: type, key: tuple[Any, ...],
                 seconds: float, retrace: Retrace | None = None,
                 dynamic_dims: dict[int, tuple[int, ...]] | None = None,
                 shape_guards: Any = None,
                 python_state: PythonState = NO_STATE,
                 layout: tuple[Any, ...] | None = None,
                 masks: dict[int, frozenset[str]] | None = None,
                 args: tuple[Any, ...] = (), data_reads: tuple[DataRead, ...] = (),
                 eager: EagerRunner | None = None, eager_transformed: bool = False,
                 args_for_retrace: bool = False, rebound: Retrace | None = None) -> Capture:
    """``eager`` (``fallback="eager"``): runs the user's backward for a call where the
    captured one cannot stand for it (``eager_runs``); forward then keeps the call's arguments
    on ctx wherever that may happen (a backward traced again, attributes on ``y.grad_fn``).
    ``args_for_retrace``: a backward traced again needs the call's argument objects (the
    capture keeps its own weakly: ``tracer.kept_args``); forward keeps them on ctx too.
    ``rebound``: traces backward again where ``retrace`` is None and the class's ``backward``
    was rebound before ``.backward()`` (eager's autograd calls the new one); the call's arguments
    are not kept for it (forward's cost stays): traced with the capture's own, kept weakly."""
    keep_args = (eager is not None and (retrace is not None or bool(python_state.ctx_forward))) \
        or (args_for_retrace and retrace is not None)
    setup_style = function is not None and uses_setup_context(function)
    assumed = assumptions_of(pair, key, masks, dynamic_dims or {}, shape_guards, python_state, layout,
                             args, data_reads)
    # Backward's Python reads, as the record has them (their values at capture): backward
    # compares them when it runs.
    function_cls = make_function(pair, retrace or rebound, transformable=setup_style,
                                 generate_vmap_rule=bool(setup_style and function.generate_vmap_rule),
                                 state=python_state, backward_values=backward_values(assumed),
                                 bwd_reads=tuple(r for r in data_reads if r.guards_backward), keep_args=keep_args,
                                 eager=eager, user_cls=function)
    assumptions, run = once(pair.function_name, python_state.single_use, assumed,
        _with_replay(_runner(function_cls, pair.inputs, len(key[1]), pair.output_spec, pair.top_level,
                             function if setup_style else None, make_writer(pair.outside_writes), eager_transformed),
                     python_state, pair,
                     keep_args))
    methods = None if function is None else methods_key(function)
    return Capture(
        pair=pair, python_state=python_state, masks=dict(masks or {}), assumptions=assumptions,
        fits=compile_fits(assumptions),
        dynamic_dims=dict(dynamic_dims or {}), shape_guards=shape_guards,
        function=function, _make_graph=outer, inputs=pair.inputs,
        non_differentiable_idx=pair.non_differentiable_idx, dirty_idx=pair.dirty_idx,
        saved_for_backward_idx=pair.saved_for_backward_idx, output_spec=pair.output_spec,
        top_level=pair.top_level, key=key, argnames=pair.argnames, capture_seconds=seconds,
        _function=function_cls, data_reads=data_reads, run=run,
        methods=methods, _methods_held=[] if function is None else methods_held(function),
        _same_methods=(lambda F: True) if methods is None else methods_check(function, methods))
