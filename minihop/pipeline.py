"""The pipeline entry: the one place the stages are run, tracer -> rewire -> runtime.

Everything above it (``cache`` for ``minihop.apply``/``function``/``captured``, ``explain``,
``testing``, ``minihop.trace``, ``minihop.load``) calls these functions, never a stage:

  ``run_pipeline``  trace forward and backward (tracer), make the pair consistent (rewire),
                    build the runnable capture (runtime); also returns the raw trace.
  ``capture``       the same, the capture only (``minihop.capture``).
  ``trace``         a whole function: each Function it applies through tracer -> rewire.
  ``load``          a saved capture: runtime (artifact) -> runtime (capture).
  ``guard_key``     what a capture for a call is filed under (before tracing it).

The stages' names in ``__all__`` after these are re-exported: what the layer above reads.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

from .errors import InconsistentGraphsError, UnsupportedArgumentError, UnsupportedOperationError
from .rewire.contract import PairShape, check_consistent
from .rewire.outer import make_outer_graph
from .rewire.pair import make_pair
from .runtime.capture import Capture, make_capture
from .runtime.backwards import Fetched, live_slots
from .runtime.eager_runs import EagerRunner, refusing_fake_text, with_eager_fallback
from .runtime.function import MAX_VALUE_VARIANTS, GradLayout, Retrace
from .runtime.graph_reads import reads_default_dtype, reads_grad_mode
from .runtime.op import autograd_function_apply
from .runtime.function_keys import class_apply, methods_check, methods_held, methods_key
from .runtime.assumptions import layout_key, refuse_unlike_grads
from .runtime.display import show_value_key
from .runtime.located import as_called, real_run_shows
from .runtime.guards import call_key, describe_autocast, value_key
from .runtime.single_use import spending
from .runtime.streams import run_on_stream
from .spec import CtxAfter, DataRead, Pair, PythonState, RawCapture, ServedOnce
from .arguments import bind_arguments, marks
from .structure import argname, replace_tensors
from .tracer.bytecode import check_python
from .tracer.iterators import refuse_iterator_arguments
from .tracer.roots import arg_masks
from .tracer.messages import take_held
from .tracer.recorder import tracing
from .tracer.run_context import modes_refusal, observing_modes
from .tracer.kept_args import WeakArgument
from .tracer.trace import ASKED_WHAT, GradSpec, TraceInputs, function_parts, trace_function
from .user_code import lazy_module_refusal

__all__ = ["capture", "run_pipeline", "dynamic_dims", "guard_key", "load", "trace", "UNSET", "with_graphs", "refuse_shadowed_options",
           # the stages' records and helpers the layer above reads
           "Capture", "MAX_VALUE_VARIANTS", "PairShape", "autograd_function_apply", "check_consistent", "describe_autocast",
           "as_called", "class_apply", "function_parts", "methods_check", "methods_held", "methods_key", "modes_refusal", "observing_modes", "real_run_shows", "run_on_stream", "show_value_key", "take_held", "tracing", "value_key"]

class _Unset:
    """An option the caller did not pass (told apart from one passed with its default)."""
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def refuse_shadowed_options(fn_cls: type, args: tuple[Any, ...], options: Mapping[str, Any]) -> None:
    """An option passed to minihop (``dynamic=``) that is also a parameter of ``fn_cls.forward``
    which ``args`` do not fill: whose it is would be a guess, so it is refused. The caller fills
    the parameter positionally (the keyword is then minihop's), or leaves the option out."""
    passed = [name for name, value in options.items() if value is not UNSET]
    if not passed:
        return
    argnames = function_parts(fn_cls).argnames
    for name in passed:
        if name in argnames[len(args):]:
            raise UnsupportedArgumentError(
                f"{name}= is both an option of minihop's and a parameter of "
                f"{fn_cls.__qualname__}.forward ({', '.join(argnames)}), which the positional "
                "arguments do not fill.",
                f"minihop would take {name}= as its own option and never pass it to forward "
                "(or the other way round): the call is ambiguous.",
                f"Pass forward's {name} positionally (a keyword {name}= is then minihop's option), "
                f"or use minihop.function({fn_cls.__qualname__}, {name}=...) for the option.")


def capture(fn_cls: type, /, *args: Any, dynamic: bool | Mapping[int | str, Sequence[int]] | None = UNSET,
            **kwargs: Any) -> Capture:
    """Capture ``fn_cls`` (an ``autograd.Function``) for arguments like ``args``.

    Tensors in ``args`` are only read for their properties (shape, dtype, device,
    requires_grad): tracing runs on fake tensors. The result runs with ``cap(*args)``.

    ``dynamic=True`` traces every dimension of every tensor argument with a symbolic size;
    ``dynamic={"x": [0]}`` (argument name or position -> dimensions) only those. One such
    capture serves every call whose sizes satisfy the guards recorded while tracing. Marks
    the tensors carry (Dynamo's ``mark_dynamic``, ``maybe_mark_dynamic``,
    ``mark_static``) add or remove dimensions (see ``dynamic_dims``).

    >>> import torch, minihop
    >>> from minihop.demo import MySin
    >>> x = torch.randn(8, requires_grad=True)
    >>> cap = minihop.capture(MySin, x)
    >>> cap, [n.name for n in cap.fwd.graph.nodes if n.op == "placeholder"]
    (Capture(MySin, x: f32[8] grad), ['l_x_'])
    >>> cap(x).sum().backward()              # fwd_body_0, then bwd_body_0
    """
    refuse_shadowed_options(fn_cls, args, {"dynamic": dynamic})
    return run_pipeline(fn_cls, args, kwargs, False if dynamic is UNSET else dynamic)[1]


def run_pipeline(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any],
                       dynamic: bool | Mapping[int | str, Sequence[int]] | None = False, *,
                       eager_backward: bool = False) -> tuple[RawCapture, Capture]:
    """Run the pipeline: ``capture``, also returning the raw trace (``explain`` reads it).
    ``eager_backward`` (``fallback="eager"``): where backward, traced again for a call, is
    refused, the user's backward runs eagerly for that call (``tracer.eager_backward``)."""
    check_python()
    if torch._C._are_functorch_transforms_active():
        # Inside torch.func.grad/vmap/... (the arguments are wrappers): trace outside them, on plain
        # tensors with the wrappers' properties; the capture runs on wrapped tensors as torch code.
        with temporarily_clear_interpreter_stack():
            return run_pipeline(fn_cls, _plain_like(args), _plain_like(kwargs), dynamic, eager_backward=eager_backward)
    if torch.is_inference_mode_enabled():
        # Under inference_mode, with inference tensors (the serving setup): trace outside it,
        # on normal copies (an inference tensor has no version counter for the tracer to
        # watch), with grad off as inference mode has it; the capture then runs under
        # inference_mode like any torch code, as eager's F.apply does.
        with torch.inference_mode(False), torch.no_grad():
            return run_pipeline(fn_cls, _normal_copies(args), _normal_copies(kwargs), dynamic, eager_backward=eager_backward)
    start = time.perf_counter()
    masks = arg_masks(function_parts(fn_cls))  # function_parts refuses a non-Function
    args = bind_arguments(fn_cls, args, kwargs)
    refuse_iterator_arguments(fn_cls.__qualname__, args)  # before the trace could spend one
    if (lazy := lazy_module_refusal(fn_cls.__qualname__, args)) is not None:
        raise lazy
    dims = dynamic_dims(fn_cls, args, dynamic)
    key = guard_key(fn_cls, args, dims)  # before tracing: what the call was, not what it left
    raw = trace_function(fn_cls, args, {}, dynamic=dims, key_of=value_key, eager_fallback=eager_backward)
    _check_strict_marks(fn_cls, args, raw)
    pair = make_pair(raw)
    reads = _runtime_reads(raw.data_reads, pair)
    outer = functools.partial(make_outer_graph, pair, tuple(r for r in reads if r.guards_backward))
    retrace = None
    runner = EagerRunner(raw.eager_backward, pair) if eager_backward else None
    rebound = _backward_retracer(fn_cls, raw, pair, runner)  # (F.backward rebound before .backward(): make_capture)
    if raw.grad_assumptions or not raw.materialize_grads or raw.python_state.reads_in("backward") \
            or any(r.guards_backward for r in reads) or any(s.read_in_backward for s in pair.inputs) \
            or reads_grad_mode(pair.bwd_graph) or reads_default_dtype(pair.bwd_graph, torch.get_default_dtype()) \
            or raw.python_state.ctx_state is not None:  # create_graph=True; another default dtype; a second backward
        retrace = rebound
    cap = make_capture(pair, outer, fn_cls, key, time.perf_counter() - start, retrace, dims, raw.shape_guards,
                       raw.python_state, layout_key(args) if raw.reads_layout else None, masks, args, reads, eager=runner,
                       eager_transformed=ASKED_WHAT in raw.ctx_features, args_for_retrace=any(
                           type(a) is WeakArgument for a in raw.inputs_for_retrace.fake_args), rebound=rebound)
    return raw, cap


def with_graphs(cap: Capture, *, fwd: fx.GraphModule | None = None,
                bwd: fx.GraphModule | None = None) -> Capture:
    """A capture like ``cap`` that runs (and shows, prints and saves) edited graphs.

    ``cap.fwd``/``cap.bwd`` are copies: edit them with torch.fx, then build the capture that
    runs them with this call. The pair's contract is checked again (``check_consistent``),
    and the edited pair must keep ``cap``'s counts of inputs, outputs and saved values (its
    indices -- which inputs get grads, which outputs are non-differentiable -- carry over).
    The new capture keeps ``cap``'s guards; it cannot trace backward again for grads unlike
    the ones it was traced with (as a loaded capture cannot).
    """
    fwd_gm, bwd_gm = fwd if fwd is not None else cap.fwd, bwd if bwd is not None else cap.bwd
    shape = check_consistent(fwd_gm, bwd_gm)
    pair = cap.pair
    found = (shape.num_inputs, shape.num_outputs, shape.num_saved)
    expected = (len(pair.inputs), len(pair.top_level), pair.num_saved)
    if found != expected:
        raise InconsistentGraphsError(
            f"The edited graphs of {pair.function_name} take {found[0]} inputs, give {found[1]} "
            f"outputs and save {found[2]} values; the capture's pair: {expected[0]}, {expected[1]}, "
            f"{expected[2]}.",
            "The capture's indices (inputs, outputs, non-differentiable and saved values) belong "
            "to its pair; edited graphs must keep its signature.",
            "Edit the graphs' bodies only (keep placeholders and outputs), or capture again.")
    edited = dataclasses.replace(pair, fwd_graph=_copy_graph(fwd_gm.graph), bwd_graph=_copy_graph(bwd_gm.graph))
    new = make_capture(edited, functools.partial(make_outer_graph, edited), cap.function, cap.key,
                       cap.capture_seconds, None, cap.dynamic_dims, cap.shape_guards, cap.python_state,
                       None, cap.masks, (), cap.data_reads)
    # The call guards are cap's; a single-use cap's one call is spent by either capture.
    return dataclasses.replace(new, assumptions=cap.assumptions, fits=cap.fits,
                               run=spending(cap.assumptions, new.run))


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    """A copy the caller's later edits cannot reach."""
    new = fx.Graph()
    new._codegen = graph._codegen
    env: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        env[node] = new.node_copy(node, env.__getitem__)
    return new


def trace(fn: Any, *args: Any, **kwargs: Any) -> fx.GraphModule:
    """Trace ``fn(*args, **kwargs)`` (a function or ``nn.Module``) into one GraphModule, each
    ``F.apply`` it makes captured into ``fwd_body_N``/``bwd_body_N`` (``tracer.program``).

    >>> import torch, minihop
    >>> from minihop.demo import MySin
    >>> gm = minihop.trace(lambda a: MySin.apply(a * 2).sum(), torch.randn(4, requires_grad=True))
    >>> [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    ['fwd_body_0', 'bwd_body_0']
    """
    from .tracer.program import trace_program  # on first use: a capture does not need it

    return trace_program(fn, args, kwargs, _pair_for_apply)


def _pair_for_apply(fn_cls: type, inputs: TraceInputs) -> Pair:
    """One Function applied inside ``trace``, on the outer trace's fake arguments."""
    return make_pair(trace_function(fn_cls, (), {}, retrace=inputs, key_of=value_key))


def load(path: str) -> Capture:
    """Load a capture saved by ``Capture.save``: runnable and differentiable as before.

    >>> import os, tempfile, torch, minihop
    >>> from minihop.demo import MySin
    >>> x = torch.randn(4, requires_grad=True)
    >>> path = os.path.join(tempfile.mkdtemp(), "mysin.minihop")
    >>> minihop.capture(MySin, x).save(path)
    >>> loaded = minihop.load(path)          # no MySin needed from here on
    >>> torch.allclose(loaded(x), x.sin())
    True
    """
    from .runtime.artifact import read_capture  # on first use: a capture does not need it

    saved = read_capture(path)
    return make_capture(saved.pair, functools.partial(make_outer_graph, saved.pair), None, saved.key, 0.0,
                        dynamic_dims=saved.dynamic_dims, shape_guards=saved.shape_guards, python_state=saved.python_state)


def _runtime_reads(reads: tuple[DataRead, ...], pair: Pair) -> tuple[DataRead, ...]:
    """``reads`` with each backward read's saved inputs named by their index among ``pair``'s
    saved values (the tracer names them by fwd node), as the runtime receives them."""
    index = {node: i for i, node in enumerate(pair.saved_fwd_nodes)}
    return tuple(dataclasses.replace(r, bwd_inputs=tuple(
        (kind, index[ref]) if kind == "saved" else (kind, ref) for kind, ref in r.bwd_inputs))
        if r.guards_backward else r for r in reads)


def guard_key(fn_cls: type, args: tuple[Any, ...], dims: dict[int, tuple[int, ...]] | None) -> tuple[Any, ...]:
    """The key a capture of ``fn_cls`` for these (bound) arguments is filed under."""
    return call_key(args, dims, arg_masks(function_parts(fn_cls)))


def _plain_like(value: Any) -> Any:
    """``value`` with every torch.func-wrapped tensor replaced by a plain, empty tensor of the
    same logical shape, strides, dtype, device and requires_grad."""
    def plain(_path: Any, t: torch.Tensor) -> torch.Tensor:
        if not torch._C._functorch.is_functorch_wrapped_tensor(t):
            return t
        try:
            stride = tuple(t.stride())
        except RuntimeError:
            stride = tuple(torch.empty(t.shape, device="meta").stride())
        return torch.empty_strided(tuple(t.shape), stride, dtype=t.dtype, device=t.device,
                                   requires_grad=t.requires_grad)

    return replace_tensors(value, plain, ())


def _normal_copies(value: Any) -> Any:
    """``value`` with each inference tensor replaced by a normal tensor with its values,
    strides, dtype and device (made outside inference mode)."""
    def normal(_path: Any, t: torch.Tensor) -> torch.Tensor:
        if not t.is_inference():
            return t
        copy = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
        return copy.copy_(t)

    return replace_tensors(value, normal, ())


def _backward_retracer(fn_cls: type, raw: RawCapture, pair: Pair, eager: EagerRunner | None = None) -> Retrace:
    """Trace backward again for other grads or Python values backward reads (see runtime). ``eager``:
    where that trace is refused, a variant that runs the user's backward eagerly for this call."""
    traced = _backward_tracer(fn_cls, raw, pair)
    return refusing_fake_text(traced, pair.function_name) if eager is None else with_eager_fallback(traced, eager)


def _backward_tracer(fn_cls: type, raw: RawCapture, pair: Pair) -> Retrace:
    """``_backward_retracer``'s trace."""
    saved_index = {name: i for i, name in enumerate(pair.saved_names)}
    input_index = {source.name: i for i, source in enumerate(pair.inputs)}

    def retrace(layout: GradLayout, call_args: tuple[Any, ...],
                grads: Sequence[Any], saved: Sequence[Any], grad_mode: bool = False,
                ctx_state: dict[str, Any] | None = None) -> tuple[Any, ...]:
        specs = tuple(None if g is None else GradSpec(g[0], g[1]) for g in layout)
        call_data = ({i: _unwrapped(g) for i, g in enumerate(grads) if g is not None},
                     {node: _unwrapped(v) for node, v in zip(pair.saved_fwd_nodes, saved, strict=True)})
        with temporarily_clear_interpreter_stack():  # traced outside torch.func, as at capture
            variant_raw = raw.rerun_backward(specs, call_args, call_data, grad_mode=grad_mode, ctx_state=ctx_state)
        variant = make_pair(variant_raw)
        refuse_unlike_grads(pair.function_name, variant, grads)  # (a grad's view-ness: no fake has it)
        # A tensor the captured backward did not read, fetched from its place when backward
        # runs (as every such tensor is): the variant's saved value taken from there.
        fetched = {i: Fetched(fetch, key) for i, fetch, key in live_slots(variant)}
        missing = [n for i, n in enumerate(variant.saved_names) if n not in saved_index and i not in fetched]
        missing += [s.name for s in variant.inputs if s.name not in input_index and not s.read_in_backward]
        if missing:
            raise UnsupportedOperationError(
                f"{pair.function_name}.backward, traced again for this call (its grads, or a Python "
                f"value it reads, differ from the captured backward's, or it was rebound), reads forward "
                f"values ({', '.join(missing)}) that forward did not save.",
                "Forward has already run; it saved only what the captured backward needed.",
                "Make backward read the same forward values whatever its grads look like and "
                "whatever the code it calls is.")
        return (variant.bwd, tuple(saved_index[n] if n in saved_index else fetched[i]
                                   for i, n in enumerate(variant.saved_names)),
                tuple(input_index.get(s.name, -1) for s in variant.inputs),
                (*variant_raw.python_state.writes_in("backward"), *_ctx_after(variant_raw.python_state),
                 *_served_once(variant_raw.python_state)),
                tuple(r for r in _runtime_reads(variant_raw.data_reads, pair) if r.guards_backward))

    return retrace


def _served_once(state: PythonState) -> tuple[ServedOnce, ...]:
    """A variant that may serve only its own call, marked so among its writes (never filed)."""
    return (ServedOnce(state.single_use),) if state.single_use else ()


def _ctx_after(state: PythonState) -> tuple[CtxAfter, ...]:
    """The plain ctx values a backward that writes ctx left, as a write the runtime makes."""
    return () if state.ctx_state is None else (CtxAfter(state.ctx_state[1]),)


def _unwrapped(value: Any) -> Any:
    """A backward's grad or saved value as a plain tensor with its values (under
    torch.func.grad it is wrapped; a vmap-batched one has no single value)."""
    functorch = torch._C._functorch
    while issubclass(type(value), torch.Tensor) and functorch.is_functorch_wrapped_tensor(value):
        if functorch.is_batchedtensor(value):
            raise UnsupportedOperationError(
                "A Function's backward is traced again for a call under torch.func.vmap (it takes "
                "Python values out of its grads or saved values, or reads Python state that may "
                "have changed since forward, or runs code minihop did not analyse).",
                "Tracing it again takes its grads' and saved values' values, and a batched tensor "
                "holds one value per batch element (eager refuses data-dependent control flow "
                "under vmap).",
                "Compute with tensor ops instead (torch.where), call it outside vmap, or run it "
                "eagerly with minihop.function(F, fallback='eager').")
        value = functorch.get_unwrapped(value)
    return value


def dynamic_dims(fn_cls: type, args: tuple[Any, ...],
                 dynamic: bool | Mapping[int | str, Sequence[int]] | None) -> dict[int, tuple[int, ...]]:
    """Normalise ``dynamic`` to {argument position: dimensions}, with the marks the tensor
    arguments carry (``marks``): ``mark_dynamic``/``maybe_mark_dynamic`` dimensions added,
    ``mark_static`` ones taken out (``mark_dynamic`` wins over ``mark_static``, as in Dynamo)."""
    dims = _policy_dims(fn_cls, args, dynamic)
    for i, a in enumerate(args):
        found = marks(a)
        if found is not None:
            strict, weak, static = found
            chosen = (set(dims.get(i, ())) | strict | weak) - (static - strict)
            dims[i] = tuple(sorted(chosen))
            if not dims[i]:
                del dims[i]
    return dims


def _check_strict_marks(fn_cls: type, args: tuple[Any, ...], raw: RawCapture) -> None:
    """A dimension marked with ``mark_dynamic`` that the trace fixed to one size is refused,
    as Dynamo raises ``ConstraintViolationError`` (sizes 0 and 1 excepted: they are
    specialised before tracing, silently, as Dynamo does)."""
    if raw.shape_guards is None:
        return
    for i, d, size in raw.shape_guards.fixed:
        found = marks(args[i])
        if found is not None and d in found[0] and args[i].shape[d] not in (0, 1):
            raise UnsupportedArgumentError(
                f"{raw.function_name}: dimension {d} of {argname(i, raw.argnames)} is marked dynamic "
                f"(torch._dynamo.mark_dynamic), but its code specialised it to {size}.",
                "A dimension marked with mark_dynamic must stay symbolic; the code fixed it "
                "to one size (a comparison with a constant, a Python int made from it, ...).",
                "Use torch._dynamo.maybe_mark_dynamic (symbolic unless specialised), or remove "
                "the mark.")


def _policy_dims(fn_cls: type, args: tuple[Any, ...],
                 dynamic: bool | Mapping[int | str, Sequence[int]] | None) -> dict[int, tuple[int, ...]]:
    """The dimensions ``dynamic`` itself names (None and False: none)."""
    if dynamic is None or dynamic is False:
        return {}
    if dynamic is True:
        return {i: tuple(range(a.dim())) for i, a in enumerate(args)
                if issubclass(type(a), torch.Tensor) and a.dim() > 0}
    if not issubclass(type(dynamic), Mapping):
        raise UnsupportedArgumentError(
            f"dynamic={dynamic!r} for {fn_cls.__qualname__}: a {type(dynamic).__name__}.",
            "dynamic= is True, False, None, or a mapping from an argument (name or position) to "
            "the dimensions that are dynamic, as torch.export's dynamic_shapes names them per input.",
            "Write dynamic=True for every dimension, or e.g. dynamic={'x': [0]}.")
    argnames = function_parts(fn_cls).argnames
    dims: dict[int, tuple[int, ...]] = {}
    for name, which in dynamic.items():
        index = argnames.index(name) if issubclass(type(name), str) and name in argnames else name
        if issubclass(type(index), int) and 0 <= index < len(args) and type(args[index]) is int and not which:
            dims[index] = ()  # an int argument traced as a SymInt
            continue
        if not issubclass(type(index), int) or not (0 <= index < len(args)) or not issubclass(type(args[index]), torch.Tensor):
            raise UnsupportedArgumentError(
                f"dynamic names {name!r}, which is not a tensor argument of {fn_cls.__qualname__} "
                f"(arguments: {', '.join(argnames)}).",
                "Only dimensions of tensor arguments, and int arguments themselves, can be dynamic.",
                "Name a tensor argument by name or position, e.g. dynamic={'x': [0]}, or an int "
                "argument with no dimensions, e.g. dynamic={'k': []}.")
        dims[index] = _checked_dims(fn_cls, argname(index, argnames), args[index], which)
    return dims


def _checked_dims(fn_cls: type, name: str, tensor: torch.Tensor, which: Any) -> tuple[int, ...]:
    """``which`` (dimensions of ``tensor``) checked as torch.export checks ``dynamic_shapes``:
    ints (or a mapping keyed by them) within the tensor's rank, negatives counted from the end."""
    rank = tensor.dim()

    def refuse(found: str) -> UnsupportedArgumentError:
        return UnsupportedArgumentError(
            f"dynamic names {found} of {name} for {fn_cls.__qualname__}, a {rank}-d tensor "
            f"(shape {tuple(tensor.shape)}).",
            "A dynamic dimension must exist: an int d with -rank <= d < rank (torch.export "
            "refuses others too); minihop would otherwise make another dimension symbolic.",
            f"Name dimensions of {name} that exist"
            + (", or leave the 0-d tensor out of dynamic=." if rank == 0 else f", 0..{rank - 1}."))

    if issubclass(type(which), (str, bytes)) or not issubclass(type(which), (Sequence, Mapping, set, frozenset)):
        raise refuse(f"{which!r} (not a list of dimensions)")
    found = []
    for d in which:
        if type(d) is not int or not -rank <= d < rank:
            raise refuse(f"dimension {d!r}")
        found.append(d % rank)
    return tuple(found)
