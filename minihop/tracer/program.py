"""Trace an ordinary function (or ``nn.Module``) that applies Functions: ``minihop.trace``.

Place in the pipeline: the tracer, run over a whole function (``trace_program``). The user's
function runs on fake tensors while its torch calls are recorded into an outer graph; each
``F.apply`` it makes is handed to the pipeline entry's ``capture_apply`` (tracer -> rewire,
sharing the outer fake tensors) and recorded as one
``autograd_function_apply`` call on ``fwd_body_N`` / ``bwd_body_N``, followed by a ``getitem``
per output: the layout of the graphs in PyTorch's own tests.

The result is an executable ``GraphModule``: its inputs are the tensors the function reaches
(arguments, and tensors inside argument containers or objects), in order of first use, named
as Dynamo names them (``L_x_``; Dynamo may order lifted inputs differently);
``gm.meta["minihop_inputs"]`` lists where each comes from.
Parameters, buffers and closed-over tensors are attributes of the GraphModule. It returns what
the function returned, built as the function built it (one tensor, tuples, lists, dicts,
namedtuples, dataclasses and other objects, nested; constants as returned): the output node
holds the containers, and a call node builds each namedtuple or object. Running it gives
eager's outputs, and backward through it eager's gradients (the apply calls are torch's own
higher-order operator).

``Function.apply`` is intercepted by replacing it on ``torch.autograd.Function`` while the
function runs (under a lock; calls from other threads on real tensors pass through).
"""

from __future__ import annotations

import collections
import operator
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._functorch.autograd_function import autograd_function_apply
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import is_structseq

from ..errors import SideEffectError, UnsupportedArgumentError, UnsupportedOperationError, UnsupportedOutputError
from ..spec import Pair
from ..arguments import bind_arguments, marks
from ..structure import Path, attributes, format_path, iter_leaves, make_getter, replace_tensors
from ..returned import OutputSpec
from ..graph_names import body_names, constant_name, input_name, outer_input_name
from .frames import format_frame, user_frame, user_frame_of
from .recorder import GraphRecorder, RecordingMode
from .refusals import refusal_for
from .trace import TRACE_LOCK, TraceInputs

__all__ = ["trace_program"]

# One Function applied inside the traced function: its class and fake arguments -> the pair.
CaptureApply = Callable[[type, TraceInputs], Pair]

_intercept_lock = threading.Lock()


class _Program:
    """State of one whole-function trace."""

    def __init__(self, argnames: tuple[str, ...], capture_apply: CaptureApply) -> None:
        self.capture_apply = capture_apply
        self.fake_mode = FakeTensorMode()
        self.argnames = argnames
        self.recorder = GraphRecorder(self._resolve, self._no_symbols)
        self.mode = RecordingMode(self.fake_mode, self._lift, lambda: "the traced function",
                                  lambda *a: None)
        self.sources: dict[int, tuple[Path, str]] = {}  # id(fake) -> (path, name)
        self.real_to_fake: dict[int, torch.Tensor] = {}
        self.attributes: dict[str, Any] = {}  # root attributes: bodies, parameters, constants
        self.attribute_of: dict[int, str] = {}  # id(fake) -> attribute name
        self.input_paths: list[str] = []
        self.applies = 0
        self.parameter_names: dict[int, str] = {}

    # -- values ---------------------------------------------------------------------------
    def fake_arg(self, path: Path, real: torch.Tensor) -> torch.Tensor:
        fake = self.real_to_fake.get(id(real))
        if fake is None:
            found = marks(real)
            if found is not None and found[0]:
                raise UnsupportedArgumentError(
                    f"minihop.trace got {format_path(path, self.argnames)} with dimension "
                    f"{min(found[0])} marked dynamic (Dynamo's mark_dynamic).",
                    "minihop.trace traces static shapes; a mark_dynamic dimension must be "
                    "symbolic (maybe_mark_dynamic ones are traced static, as a specialised "
                    "size would be).",
                    "Capture the Function on its own (minihop.apply or minihop.capture honour "
                    "the mark), or use maybe_mark_dynamic.")
            fake = self.fake_mode.from_tensor(real)
            self.real_to_fake[id(real)] = fake
            self.sources[id(fake)] = (path, input_name(path, self.argnames))
        return fake

    def _lift(self, real: torch.Tensor) -> torch.Tensor:
        """A real tensor reached by the function (parameter, buffer, closure): an attribute."""
        fake = self.real_to_fake.get(id(real))
        if fake is None:
            fake = self.fake_mode.from_tensor(real)
            self.real_to_fake[id(real)] = fake
            name = self.parameter_names.get(id(real), constant_name(len(self.attributes)))
            self.attributes[name] = real
            self.attribute_of[id(fake)] = name
        return fake

    def _resolve(self, rec: GraphRecorder, value: torch.Tensor) -> fx.Node:
        attribute = self.attribute_of.get(id(value))
        if attribute is not None:
            node = rec.create_node("get_attr", attribute, (), {}, name=attribute.replace(".", "_"))
            node.meta["val"] = value
            frame = user_frame()
            if frame is not None:
                node.meta["stack_trace"] = "".join(traceback.format_list([frame]))
            return node
        source = self.sources.get(id(value))
        if source is None:
            raise UnsupportedArgumentError(
                "The traced function used a tensor minihop did not see coming in.",
                "Every tensor must be an argument, reachable from one, or a closed-over value.",
                "Pass it as an argument.")
        path, name = source
        node = rec.create_node("placeholder", outer_input_name(name),
                               (), {}, name=name)
        node.meta["val"] = value
        self.input_paths.append(format_path(path, self.argnames))
        return node

    def _no_symbols(self, rec: GraphRecorder, symbol: Any) -> fx.Node:
        raise UnsupportedOperationError(
            f"minihop.trace met a symbolic size ({symbol}).", "minihop.trace traces static shapes.",
            "Use minihop.capture(F, ..., dynamic=True) for a single Function.")

    # -- one F.apply ------------------------------------------------------------------------
    def apply(self, fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        args = bind_arguments(fn_cls, args, kwargs)
        # Real tensors handed straight to apply (parameters, closed-over tensors) are lifted.
        args = tuple(replace_tensors(a, lambda _p, t: t if issubclass(type(t), FakeTensor) else self._lift(t),
                                     (("arg", i),)) for i, a in enumerate(args))
        recorder, self.mode.recorder = self.mode.recorder, None  # the Function's own ops are its bodies'
        try:
            pair = self.capture_apply(fn_cls, TraceInputs(self.fake_mode, args, torch.is_grad_enabled()))
        finally:
            self.mode.recorder = recorder
        if pair.outside_writes:
            raise SideEffectError(
                f"minihop.trace met {fn_cls.__qualname__}.apply, whose forward writes outside "
                f"its return value ({pair.outside_writes[0].location.describe(pair.argnames)}).",
                "A whole-function trace records one graph; it has no step that puts tensors "
                "into the caller's containers or objects.",
                "Capture this Function on its own (minihop.apply or minihop.capture), or return "
                "such tensors from its forward.")
        n = self.applies
        self.applies += 1
        fwd_name, bwd_name = body_names(n)
        self.attributes[fwd_name] = pair.fwd
        self.attributes[bwd_name] = pair.bwd
        rec = self.recorder
        frame = user_frame()
        where = "".join(traceback.format_list([frame])) if frame is not None else None
        inputs: list[Any] = []
        for source in pair.inputs:
            if source.path is not None:
                inputs.append(rec.node_for(make_getter(source.path)(args, {})))
            else:
                value = source.place.get(args) if source.fetched else source.constant
                inputs.append(rec.node_for(self.mode._fakeify(value)))
        fwd_node = rec.create_node("get_attr", fwd_name, (), {}, name=fwd_name)
        bwd_node = rec.create_node("get_attr", bwd_name, (), {}, name=bwd_name)
        call = rec.create_node("call_function", autograd_function_apply, (fwd_node, bwd_node, *inputs),
                               pair.apply_kwargs())
        for node in (fwd_node, bwd_node, call):
            node.meta["stack_trace"] = where  # one source line: printed as one block, as Dynamo's
        # Fresh fake outputs with eager's requires_grad (the traced ones were made under no_grad).
        needs_grad = torch.is_grad_enabled() and any(
            issubclass(type(a), torch.Tensor) and a.requires_grad for a in args)
        fwd_outs = [n for n in pair.fwd.graph.nodes if n.op == "output"][0].args[0][0]
        flat: list[torch.Tensor] = []
        self.mode.recorder = None  # making the fresh fakes is bookkeeping, not graph
        with self.fake_mode:
            for i, out in enumerate(fwd_outs):
                val = out.meta["val"]
                fresh = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device)
                differentiable = (pair.top_level[i] and i not in pair.non_differentiable_idx
                                  and (val.dtype.is_floating_point or val.dtype.is_complex))
                if needs_grad and differentiable:
                    fresh.requires_grad_(True)
                item = rec.create_node("call_function", operator.getitem, (call, i), {})
                item.meta["stack_trace"] = where
                rec.bind(fresh, item)
                flat.append(fresh)
        self.mode.recorder = recorder
        return pair.output_spec.rebuild(flat)


def trace_program(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  capture_apply: CaptureApply) -> fx.GraphModule:
    """Trace ``fn(*args, **kwargs)`` (a function or ``nn.Module``) into one GraphModule, each
    Function it applies captured by ``capture_apply``."""
    import inspect

    target = fn.forward if issubclass(type(fn), torch.nn.Module) else fn
    argnames = tuple(inspect.signature(target).parameters)
    if kwargs:
        bound = inspect.signature(target).bind(*args, **kwargs)
        bound.apply_defaults()
        args = tuple(bound.args)
    program = _Program(argnames, capture_apply)
    if issubclass(type(fn), torch.nn.Module):
        for name, tensor in (*fn.named_parameters(), *fn.named_buffers()):
            program.parameter_names[id(tensor)] = name
    fake_args = tuple(replace_tensors(a, program.fake_arg, (("arg", i),)) for i, a in enumerate(args))
    original = torch.autograd.Function.__dict__["apply"]

    thread = threading.get_ident()

    def intercepted(cls: type, *a: Any, **k: Any) -> Any:
        # Every apply the traced function makes (in this thread, outside a Function being
        # traced) is captured, whatever tensors it gets: arguments' fakes, parameters, constants.
        if threading.get_ident() == thread and program.mode.recorder is not None:
            return program.apply(cls, a, k)
        return original.__func__(cls, *a, **k)

    with TRACE_LOCK, _intercept_lock:
        torch.autograd.Function.apply = classmethod(intercepted)  # type: ignore[method-assign,assignment]
        program.mode.recorder = program.recorder
        try:
            with program.fake_mode, program.mode:
                out = fn(*fake_args)
        except Exception as e:
            refusal = refusal_for(e, "the traced function", None, format_frame(user_frame_of(e)))
            if refusal is None:
                raise  # the user's own, eager's own, or minihop's refusal: unchanged
            raise refusal from e
        finally:
            program.mode.recorder = None
            torch.autograd.Function.apply = original  # type: ignore[method-assign]
    rec = program.recorder
    rec.graph.output(_output_argument(program, out))
    # Inputs were created at first use; list them first, in that order.
    placeholders = [n for n in rec.graph.nodes if n.op == "placeholder"]
    first = next(iter(rec.graph.nodes))
    for node in placeholders:
        first.prepend(node) if node is not first else None
        first = node.next if node is first else first
    gm = fx.GraphModule(program.attributes, rec.graph, class_name="GraphModule")
    gm.meta["minihop_inputs"] = list(program.input_paths)
    return gm


# Constants printed into the graph's code as themselves (their repr reads back in fx's globals).
_LITERALS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
             torch.layout, torch.memory_format)


def _is_literal(value: Any) -> bool:
    return type(value) in _LITERALS or (type(value) is tuple and all(_is_literal(v) for v in value))


def _output_argument(program: _Program, value: Any) -> Any:
    """``fn``'s result as the output node's argument: what the GraphModule rebuilds and returns.

    Tensors become their nodes; tuples, lists and dicts (literal keys) stay containers, printed
    as literals (``return {'a': add, 'b': [mul, 3]}``); literal constants stay in the code. Built
    by one call node each, as fx's tracer builds them: a namedtuple, structseq or ``torch.Size``
    by its class (``point = Point(add, mul)``), an ``OrderedDict`` by its class, a dataclass or
    other object holding tensors by ``build_<Class>`` (a copy of the traced object with its
    attributes set, as the runtime's ``OutputSpec`` rebuilds one: no constructor is re-run and
    no class is registered anywhere). Other constants (enums, tensor-free objects) are
    attributes of the GraphModule, returned as the object the traced call returned.
    """
    rec = program.recorder

    def build(target: Any, args: tuple[Any, ...]) -> fx.Node:
        return rec.create_node("call_function", target, args, {})

    if issubclass(type(value), torch.Tensor):
        return rec.node_for(value)
    if _is_literal(value):
        return value
    kind = type(value)
    if kind in (tuple, list):
        return kind(_output_argument(program, v) for v in value)
    items = {k: _output_argument(program, v) for k, v in value.items()} if issubclass(type(value), dict) else {}
    if kind in (dict, collections.OrderedDict) and all(_is_literal(k) for k in value):
        return items if kind is dict else build(kind, (items,))
    if issubclass(type(value), tuple) and hasattr(value, "_fields"):
        return build(kind, tuple(_output_argument(program, v) for v in value))
    if issubclass(type(value), tuple) and (kind is torch.Size or is_structseq(value)):  # fx reads it as a tuple
        return build(kind, (tuple(_output_argument(program, v) for v in value),))
    if kind is dict:  # keys the code cannot spell: the dict is built from its values
        spec = OutputSpec("dict", keys=tuple(value), children=_slots(len(value)))
        return build(_builder(spec, "build_dict"), tuple(items.values()))
    if not any(issubclass(type(leaf), torch.Tensor) for _, leaf in iter_leaves(value)):
        name = f"_output_constant{sum(n.startswith('_output_constant') for n in program.attributes)}"
        program.attributes[name] = value
        return rec.create_node("get_attr", name, (), {}, name=name)
    if issubclass(type(value), (tuple, list, dict)):
        raise UnsupportedOutputError(
            f"The traced function returned a {kind.__qualname__} holding tensors, a subclass "
            f"of {kind.__mro__[1].__qualname__}.",
            "minihop.trace rebuilds tuples, lists, dicts, OrderedDicts, namedtuples, "
            "structseqs, dataclasses and plain objects; a container subclass may need "
            "arguments its constructor alone knows.",
            "Return a plain tuple, list or dict (or a namedtuple or dataclass) instead.")
    attrs = attributes(value)  # an object holding tensors: iter_leaves looked into it
    spec = OutputSpec("object", keys=tuple(attrs), children=_slots(len(attrs)),
                      template=replace_tensors(value, lambda _p, _t: None))  # no fakes kept alive
    return build(_builder(spec, f"build_{kind.__name__}"),
                 tuple(_output_argument(program, v) for v in attrs.values()))


def _slots(n: int) -> tuple[OutputSpec, ...]:
    return tuple(OutputSpec("tensor", index=i) for i in range(n))


def _builder(spec: OutputSpec, name: str) -> Any:
    """A call target rebuilding ``spec`` from its children's values, named for gm.code."""

    def rebuild(*values: Any) -> Any:
        return spec.rebuild(values)

    rebuild.__name__ = rebuild.__qualname__ = name
    return rebuild
