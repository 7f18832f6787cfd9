"""The records passed down the pipeline: the contract between its stages.

Shared vocabulary of tracer (which discovers inputs, Python state and data reads), rewire
(which orders them) and runtime (which fetches them from the caller's arguments on every
call). What crosses a stage boundary is defined here: ``RawCapture`` (tracer -> rewire) and
``Pair`` (rewire -> runtime); the stages import it from here, never from each other.
Where a value lives outside the graphs has one model, ``place.Place`` (a ``Root`` plus steps),
re-exported here: guards, replayed writes, outside writes and lifted inputs all use it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .place import MISSING, UNMATCHED, Place, Root, arg_place
from .structure import Path
from .returned import OutputSpec, fresh

__all__ = ["AUTOCAST_DEVICES", "CtxAfter", "DataRead", "EFFECT", "GRAD_TOGGLE", "READS_GRAD_MODE", "InputSource", "LIFTED_FROM", "CTX_HELD", "MISSING", "UNMATCHED",
           "NO_STATE", "NO_WORLD", "OutsideWrite", "Pair", "Place", "PythonState", "RANGE_CHECK", "RawCapture", "Root",
           "StateRead", "StateWrite", "arg_place", "same_value"]


@dataclasses.dataclass(frozen=True)
class InputSource:
    """One forward graph input and where its value comes from.

    ``place`` locates it: in the caller's arguments (an ``arg``/``kw`` root; ``path`` is then
    that place as a ``structure`` path), or through a closure cell or a global (see below);
    None for a tensor held as ``constant``.
    ``arg_index`` is set when the input *is* one of forward's tensor arguments: it receives
    the gradient the user's backward returns at that position. Lifted inputs (from objects,
    containers, closures) have ``arg_index is None`` and never receive a gradient, as in eager.
    With dynamic shapes, a size symbol is an input too: ``dim`` is then set. A tensor reached
    through a closure cell, a global or a module held there is fetched anew on every call from
    its ``place`` (a global or cell root and the steps to it: ``fetched``), as eager would read
    it; one reached another way is held as ``constant``.
    """

    name: str
    description: str
    place: Place | None
    arg_index: int | None
    constant: torch.Tensor | None = None
    dim: int | None = None  # a size symbol: ``place``'s tensor's size along ``dim``
    read_in_backward: bool = False  # read by backward from ``place`` when backward runs (not by fwd)

    @property
    def path(self) -> Path | None:
        """The place in the call's arguments as a path (``structure.make_getter``'s), or None."""
        place = self.place
        if place is None or not place.root.uses_args:
            return None
        return ((place.root.kind, place.root.key), *place.steps)

    @property
    def fetched(self) -> bool:
        """Reached through a global or a closure cell: fetched from there on every call."""
        return self.place is not None and not self.place.root.uses_args

    @property
    def lifted(self) -> bool:
        return self.arg_index is None


@dataclasses.dataclass(frozen=True)
class OutsideWrite:
    """Forward put a value at ``location``; a capture repeats that on every call.

    ``output`` is the fwd output holding the tensor (a hidden output: not part of the
    user's return value, never differentiable); for a Python value it is None and ``value``
    is the value forward wrote (a constant of the capture, like every Python value it saw).
    """

    location: Place
    output: int | None
    value: Any = None


# -- Python state ------------------------------------------------------------------------
# What forward/backward read and write of Python state outside their arguments' tensors
# (found by ``tracer.pystate``; guarded and replayed by the runtime; reported by ``explain``).


@dataclasses.dataclass(frozen=True)
class StateRead:
    """A Python value forward or backward read; the graphs are valid while it is unchanged.

    ``phase`` is the method that read it; reads by backward are checked again when backward
    runs (the value may change between forward and backward, as eager's backward would see).
    """

    place: Place
    phase: str
    line: str | None = None
    # A backward read's value key as backward found it while traced (forward's writes put
    # back: a memo forward filled), or None: the key is taken from the place after the trace
    # (which left the caller's state as it found it, before forward).
    seen: Any = dataclasses.field(default=None, compare=False)



@dataclasses.dataclass(frozen=True)
class StateWrite:
    """A write to Python state the Function did not create, replayed on every call.

    ``kind``: ``"add"`` (``place += payload``, a counter), ``"extend"`` (the list at ``place``
    gets ``payload``'s items appended), ``"set"`` (``place = payload``, a constant; ``MISSING``
    deletes it, as ``opts.pop("k")`` does) or ``"copy"`` (``place = `` a fresh deep copy of
    ``payload``, a container of constants: eager's forward makes a new one on every call) or
    ``"discard"`` (backward deleted a memo entry forward wrote: deleted where still there) or
    ``"call"`` (the ``functools.lru_cache`` helper at ``place`` called with ``payload``'s
    ``(args, kwargs)``: the trace bypassed its cache; or ``warnings.warn_explicit``, a library's
    deprecation given again on every call: ``tracer.messages``).
    """

    place: Place
    kind: str
    payload: Any
    phase: str
    line: str | None = None

    def replay(self, args: tuple[Any, ...], ctx: Any = None) -> None:
        # A number computed from symbolic sizes (``structure.Computed``) is this call's.
        payload = fresh(self.payload, args, copy_containers=False)
        if self.kind == "call":
            self.place.get(args)(*payload[0], **payload[1])  # an lru_cache helper: its cache as eager's
        elif self.kind == "add":
            self.place.set(args, self.place.get(args) + payload)
        elif self.kind == "extend":
            self.place.get(args).extend(payload)
        elif self.kind == "copy":
            self.place.set(args, copy.deepcopy(payload))
        elif self.kind == "discard":  # backward emptied a memo; gone already (the caller): as eager
            try:
                self.place.set(args, MISSING)
            except (KeyError, AttributeError):
                pass
        else:
            self.place.set(args, payload)

    def describe(self) -> str:
        if self.kind == "call" and self.place.description == "warnings.warn_explicit":
            text, category = self.payload[0][:2]
            return f"a library's {category.__name__} {text!r} given again, where eager gives it"
        if self.kind == "call":
            shown = ", ".join([*map(repr, self.payload[0]), *(f"{k}={v!r}" for k, v in self.payload[1].items())])
            return f"{self.place.description}({shown}) called again (its lru_cache's entries and counts)"
        if self.kind == "add":
            return f"{self.place.description} += {self.payload!r}"
        if self.kind == "extend":
            return f"{self.place.description}.extend({list(self.payload)!r})"
        if self.kind == "discard":
            return f"del {self.place.description} (where it is still there)"
        if self.payload is MISSING:
            return f"del {self.place.description}"
        return f"{self.place.description} = {self.payload!r}"


@dataclasses.dataclass(frozen=True)
class PythonState:
    """Everything a capture took from, and did to, Python state outside its arguments'
    tensors: the one record that guards, replay, ``explain`` and the errors read."""

    reads: tuple[StateRead, ...] = ()
    writes: tuple[StateWrite, ...] = ()
    # Why the capture may serve only the call it was traced for: what its code read or ran
    # that minihop cannot bound (``tracer.opaque``), each with its source line.
    single_use: tuple[str, ...] = ()
    # Backward wrote the plain values on ctx (``ctx.calls += 1``, ``ctx.trail.append(n)``):
    # ``(before, after)``, the user's plain ctx attributes (``effects.ctx_values``) as backward
    # found and left them; None when it changed none. A second backward (``retain_graph``)
    # reads ``after``, as eager's ctx holds it: the runtime keys backward on them.
    ctx_state: tuple[Any, Any] | None = None
    # The user's attributes on ctx as forward left them (eager's ``y.grad_fn`` is that ctx: the
    # caller may read or set them before ``.backward()``): ``(name, value)``, the value where it
    # is an immutable plain one (numbers, strings, tuples of them), else ``CTX_HELD``; and
    # ``(name, MISSING)`` for a name backward looked up and did not find (``getattr(ctx, k, d)``).
    ctx_forward: tuple[tuple[str, Any], ...] = ()
    # Weak references to the tensors the code could reach outside its arguments when traced
    # (``tracer.identity``): a call passing one as an argument never reuses the capture. (Not
    # compared: two live weak references compare their tensors, elementwise.)
    outside_tensors: tuple[Any, ...] = dataclasses.field(default=(), compare=False)

    def reads_in(self, phase: str) -> tuple[StateRead, ...]:
        return tuple(r for r in self.reads if r.phase == phase)

    def writes_in(self, *phases: str) -> tuple[StateWrite, ...]:
        return tuple(w for w in self.writes if w.phase in phases)

    @property
    def backward_uses_args(self) -> bool:
        """Whether backward reads or writes state inside an argument object (forward then
        keeps the call's arguments for it)."""
        return any(x.place.uses_args for x in (*self.reads_in("backward"), *self.writes_in("backward")))


NO_STATE = PythonState()
# In ``PythonState.ctx_forward``: an attribute holding a tensor, an object, a mutable container
# or a number of symbolic sizes (a capture has no one value of it to show the caller).
class _Held:
    def __repr__(self) -> str:
        return "CTX_HELD"


CTX_HELD: Any = _Held()


@dataclasses.dataclass(frozen=True)
class CtxAfter:
    """Among a bwd variant's writes: the plain ctx values its backward left (``PythonState.
    ctx_state``'s ``after``), kept on the runtime's ctx for the next backward of that call."""

    state: Any

    def replay(self, args: tuple[Any, ...], ctx: Any = None) -> None:
        ctx.minihop_ctx = copy.deepcopy(self.state)


@dataclasses.dataclass(frozen=True)
class ServedOnce:
    """Among a bwd variant's writes: its trace stood for the call it was traced for (backward
    traced again for that call made the call's Python writes itself, as eager's would, and
    some of them minihop cannot repeat), so the runtime never runs it for another backward."""

    reasons: tuple[str, ...]

    def replay(self, args: tuple[Any, ...], ctx: Any = None) -> None:
        return None  # the writes were made by the trace, for this call


@dataclasses.dataclass(frozen=True)
class KeepsUserCtx:
    """Among the writes of a backward run eagerly for a call (``fallback="eager"``): the user's
    ctx it ran on (``held[0]``, once it ran), kept on the runtime's ctx (``minihop_rebuilt``), so
    that a later backward of the call (``retain_graph=True``) runs on it too, as eager's backwards
    of one call share one ctx (``runtime.grad_fn``)."""

    held: list[Any]

    def replay(self, args: tuple[Any, ...], ctx: Any = None) -> None:
        if ctx is not None and self.held:
            ctx.minihop_rebuilt = self.held[0]


@dataclasses.dataclass(frozen=True)
class DataRead:
    """A Python value the user's code took out of a tensor's data (``.item()``, ``bool(t)``,
    ``torch.equal``) and the trace continued with.

    ``kind`` is ``"constant"`` (computed from Python values only: its value is fixed by what
    the call key and the Python-state guards already fix) or ``"guarded"`` (computed from the
    inputs' values: ``graph`` recomputes it from ``sources``, fetched from each call's
    arguments as fwd inputs are, and a call whose recomputed value differs from ``value`` does
    not fit the capture) or ``"unbacked"`` (``.item()``, ``nonzero``, a mask's count: the
    graphs compute it on every call, ``value`` names its symbol; nothing to guard).
    ``clone_inputs``: ``graph`` writes in place, so it runs on copies.

    A ``guarded`` read in backward is computed from what backward receives: ``bwd_inputs``
    names each input of ``graph``: ``("grad", i)`` fwd output i's grad, ``("saved", s)`` a
    saved value (the tracer's fwd node; the runtime's index among the capture's saved
    values), ``("const", v)`` a value fixed at capture. The runtime runs it before each
    backward to pick the bwd traced for that value (or to trace one).
    """

    kind: str
    phase: str
    op: str
    value: Any
    line: str | None
    graph: Any = dataclasses.field(default=None, compare=False, repr=False)
    sources: tuple[InputSource, ...] = ()
    clone_inputs: bool = False
    bwd_inputs: tuple[tuple[str, Any], ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def guards_forward(self) -> bool:
        """Whether each call's inputs are checked against it before the captured forward."""
        return self.kind == "guarded" and self.phase == "forward"

    @property
    def guards_backward(self) -> bool:
        """Whether each backward's grads and saved values are checked against it."""
        return self.kind == "guarded" and self.phase == "backward"

    def describe(self) -> str:
        return f"{self.op} in {self.phase} == {self.value!r}"

    def holds(self, compute: Callable[..., Any], inputs: list[Any]) -> bool:
        """Whether ``compute`` (``graph``'s code) gives exactly the captured value on
        ``inputs`` (a call's). Under grad mode it runs under no_grad on detached values, so
        that autograd records nothing of the check; on copies where ``graph`` writes in place
        (never into the caller's tensors)."""
        if _is_grad() or self.clone_inputs:
            with torch.no_grad():
                inputs = [(v.detach().clone() if self.clone_inputs else v.detach())
                          if issubclass(type(v), torch.Tensor) else v for v in inputs]
                return same_value(self.value, compute(*inputs))
        return same_value(self.value, compute(*inputs))


_is_grad = torch.is_grad_enabled


def same_value(a: Any, b: Any) -> bool:
    """Exact equality, as the trace specialised on these bits (NaN is its own value here)."""
    if type(a) is not type(b):
        return False
    if issubclass(type(a), (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if issubclass(type(a), (float, complex)):
        return bool(a == b or (a != a and b != b))
    return bool(a == b)


# The place every capture reads for torch.distributed's default group, when none is
# initialised: graphs traced then hold no rank or world size (an artifact may carry them).
NO_WORLD = "torch.distributed's process group (none initialised)"
# The meta key marking the ``_set_grad_enabled`` calls rewire wraps a body in (not the
# user's own): the runtime leaves them out where eager runs backward with grad mode on.
GRAD_TOGGLE = "minihop_grad_toggle"
# Meta key of a bwd node where the user's backward read ``torch.is_grad_enabled()``: the graph
# holds the answer it was traced with, so ``create_graph=True`` needs a bwd traced with grad on.
READS_GRAD_MODE = "minihop_reads_grad_mode"

# The meta key of a node kept for its effect on state outside the graph's values (torch's
# random state read or set, ``.grad`` accumulated): how it is handled, for ``explain``.
EFFECT = "minihop_effect"

# The attribute on a lifted input's detached copy (the runtime detaches lifted inputs) naming
# the tensor it came from: backward() inside backward accumulates into that one's ``.grad``.
LIFTED_FROM = "_minihop_lifted_from"

# The meta key of the nodes the tracer adds to check an unbacked size's value range (its size
# read, each bound's comparison and assert: what torch.fx's ``insert_deferred_runtime_asserts``
# adds once a body is traced). Rewire names them after the rest of the body, as that pass
# does; on an assert it holds the checked expression (the message names the comparison node).
RANGE_CHECK = "minihop_range_check"

AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")  # (a key's autocast state: runtime.guards, tracer.settings)


@dataclasses.dataclass(frozen=True)
class RawCapture:
    """Both raw graphs and what tracing learned; input to ``rewire.make_pair``."""

    function_name: str
    argnames: tuple[str, ...]
    fwd_graph: fx.Graph
    fwd_inputs: tuple[tuple[fx.Node, InputSource], ...]
    fwd_outputs: tuple[fx.Node, ...]
    top_level: tuple[bool, ...]
    aliased: tuple[bool, ...]
    output_spec: OutputSpec
    non_differentiable_idx: tuple[int, ...]
    dirty_idx: tuple[int, ...]
    bwd_graph: fx.Graph
    grad_inputs: tuple[fx.Node | None, ...]
    grad_names: tuple[str | None, ...]
    grad_handed: tuple[bool, ...]  # per fwd output: backward was handed a tensor, not None
    bwd_saved: tuple[tuple[fx.Node, fx.Node], ...]
    arg_grads: tuple[fx.Node | None, ...]
    arg_inputs: tuple[fx.Node | None, ...]
    saved_for_backward: tuple[fx.Node | None, ...]
    names: dict[fx.Node, str]
    materialize_grads: bool
    return_trace: str | None
    once_differentiable: bool
    # The tracer's own records (``tracer.trace``), opaque to the other stages.
    grad_assumptions: tuple["GradAssumption", ...]
    inputs_for_retrace: "TraceInputs"
    shape_guards: "ShapeGuards | None"
    ctx_features: tuple[str, ...]
    reads_layout: bool
    python_state: PythonState
    # Traces backward again (``(grad_specs, call_args) -> RawCapture``), forward as it ran.
    rerun_backward: Callable[..., "RawCapture"]
    outside_writes: tuple[OutsideWrite, ...] = ()
    # How many times the traced backward read ``ctx.saved_tensors`` (each read unpacks every
    # saved tensor in eager: ``saved_tensors_hooks``' unpack runs that many times).
    saved_reads: int = 1
    # Python values forward and backward took out of tensor data, in the order read.
    data_reads: tuple[DataRead, ...] = ()
    # Runs the user's backward for real on a ctx rebuilt for a call (``tracer.eager_backward.
    # EagerBackward``): fallback="eager"'s backward where tracing it again for that call is
    # refused, or where the caller touched the user's attributes on ``y.grad_fn``.
    eager_backward: Any = None


@dataclasses.dataclass(frozen=True)
class Pair:
    """A consistent forward/backward pair and the metadata needed to run it.

    ``inputs`` describes each fwd input in placeholder order; ``top_level[i]`` says whether
    fwd output i is an output of the Function in eager's sense (an item of the returned
    tuple), and only those carry gradients. ``saved_for_backward_idx`` lists the saved
    values that came from ``ctx.save_for_backward`` (autograd checks their versions).
    """

    function_name: str
    fwd_graph: fx.Graph
    bwd_graph: fx.Graph
    inputs: tuple[InputSource, ...]
    top_level: tuple[bool, ...]
    non_differentiable_idx: tuple[int, ...]
    dirty_idx: tuple[int, ...]
    saved_for_backward_idx: tuple[int, ...]
    num_saved: int
    output_spec: OutputSpec
    materialize_grads: bool
    argnames: tuple[str, ...]
    once_differentiable: bool
    grad_assumptions: tuple[Any, ...]
    saved_names: tuple[str, ...]
    ctx_saved: tuple[tuple[str, int] | None, ...]
    # What forward put outside its return value (``spec.OutsideWrite``); a tensor written
    # there is a hidden fwd output: after the user's outputs, never top-level.
    outside_writes: tuple[OutsideWrite, ...] = ()
    saved_reads: int = 1  # reads of ctx.saved_tensors in backward (see RawCapture)
    # The raw trace's fwd node of each saved value, in order: how a backward traced again
    # (which shares the raw fwd graph) names this pair's saved values.
    saved_fwd_nodes: tuple[fx.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def apply_kwargs(self) -> dict[str, list[int]]:
        """The keywords of an ``autograd_function_apply`` call on this pair, as Dynamo writes them."""
        kwargs = {"non_differentiable_idx": list(self.non_differentiable_idx),
                  "saved_for_backward_idx": list(self.saved_for_backward_idx)}
        if self.dirty_idx:
            kwargs["dirty_idx"] = list(self.dirty_idx)
        return kwargs

    # GraphModules only when read (printing, saving, Dynamo's layout): the runtime runs code
    # emitted from the graphs directly, and fx's code generation is a third of a capture.
    @functools.cached_property
    def fwd(self) -> fx.GraphModule:
        """The fwd graph as a GraphModule (``fwd_body_0``)."""
        return fx.GraphModule(torch.nn.Module(), self.fwd_graph, class_name="fwd_body_0")

    @functools.cached_property
    def bwd(self) -> fx.GraphModule:
        """The bwd graph as a GraphModule (``bwd_body_0``)."""
        return fx.GraphModule(torch.nn.Module(), self.bwd_graph, class_name="bwd_body_0")
