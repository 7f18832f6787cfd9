"""The bwd variants of one capture, and the case a backward is in.

Place in the pipeline: runtime (``function.make_function`` makes one ``Backwards`` per capture;
its generated backward asks it for the bwd to run when that can differ from the traced one).

bwd was traced with fake grads. If the user's backward read something of its grads that can
differ at run time (strides, contiguity, ``requires_grad``, or, with
``set_materialize_grads(False)``, whether a grad is None), the real grads are checked against
what the trace assumed; on a difference ``retrace`` produces (once per distinct case) a bwd
traced for the real grads. A backward that read nothing of its grads pays nothing.

Backward value guards: a backward that took Python values out of its grads or saved values
(``if x.sum() > 0``, ``range(int(n))``; ``DataRead``s guarding backward) has, per case above,
a list of bwd variants, each with the values it was traced for. Before each backward, each
variant's value graphs run on the real grads and saved values; the first whose values all
match runs. None: backward is traced again with the real values (a new variant; past
``MAX_VALUE_VARIANTS`` the oldest is dropped, with a warning). Only such backwards pay this.

Backward's Python reads (``PythonState.reads_in("backward")``) and the tensors it reads from a
global, a cell or an attribute (``live_slots``) are part of the case: eager's backward reads
them when it runs, so a value unlike the traced one takes another bwd.

A backward that read ``torch.is_grad_enabled()`` (``READS_GRAD_MODE`` nodes) was traced with
grad mode off, as an ordinary backward runs; under ``create_graph=True`` eager's reads True, so
that case's bwd is traced again with grad mode on (``grad_on``).

The default dtype where backward's ops may read it (``graph_reads.reads_default_dtype``), and the
class's ``backward``/``vjp`` as autograd finds them when backward runs: another is another case.

A backward that writes the plain values on ctx (``ctx.calls += 1``; ``PythonState.ctx_state``)
leaves them on the runtime's ctx (``CtxAfter``, ``ctx.minihop_ctx``); they are part of the
case, so a second backward of the call (``retain_graph=True``) runs a bwd traced from them.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from ..errors import UnsupportedOperationError, notice
from ..spec import GRAD_TOGGLE, NO_STATE, CtxAfter, DataRead, Pair, PythonState, ServedOnce
from ..structure import make_getter
from .codegen import emit
from .graph_reads import applied_functions, reads_default_dtype, reads_grad_mode
from .function_keys import backward_methods
from .guards import value_key

__all__ = ["Backwards", "EagerVariant", "Fetched", "GradLayout", "MAX_VALUE_VARIANTS", "Retrace", "Unfetched", "fetch_now", "live_key", "keeps_arguments", "live_slots",
           "same_properties", "tensor_key"]

# Per fwd output: (stride, requires_grad) of the real grad, or None when it is absent.
GradLayout = tuple[tuple[tuple[int, ...], bool] | None, ...]
# Returns a bwd traced for that layout (and the call's arguments, when backward reads Python
# state in them; and the call's grads, one per fwd output, and saved values, when backward
# reads their values); per saved value it takes, the index of that value among this
# capture's saved values, or, for a tensor the captured backward did not read (a key added
# since to an argument's dict on ctx), a ``Fetched`` taking it from its place when
# backward runs; per gradient it returns, the index of its fwd input among this capture's fwd
# inputs (-1 for such a fetched tensor).
# And backward's Python writes in that case (``StateWrite``s, replayed when it runs), and the
# values it read from the grads and saved values (``DataRead``s guarding backward).
# The last argument: trace it with grad mode on (for ``create_graph=True``, see ``grad_on``).
Retrace = Callable[[GradLayout, tuple[Any, ...], Sequence[Any], Sequence[Any], bool],
                   tuple[fx.GraphModule, tuple[Any, ...], tuple[int, ...], tuple[Any, ...],
                         tuple[DataRead, ...]]]

# Bwd variants kept per grad case for the values backward reads (as ``cache_limit`` bounds
# captures): past it, the oldest is dropped (always right; it costs a trace if it comes back).
MAX_VALUE_VARIANTS = 8


class _Never:
    """Equal to nothing: an assumption with symbolic sizes is checked by retracing."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


_NEVER = _Never()


def _symbolic(value: Any) -> bool:
    return any(_symbolic(v) for v in value) if issubclass(type(value), (tuple, list)) else \
        issubclass(type(value), (torch.SymInt, torch.SymFloat, torch.SymBool))


class Backwards:
    """The bwd code for each (grad case, Python state, values read, create_graph) seen so
    far; built lazily. A case is ``(key, n)``: the grad/state key, and the ``n``-th variant
    traced for it (the values it read are its guards)."""

    def __init__(self, pair: Pair, top_idx: tuple[int, ...], retrace: Retrace | None,
                 state: PythonState = NO_STATE, values: Sequence[Any] = (),
                 reads: tuple[DataRead, ...] = (), user_cls: type | None = None) -> None:
        self.pair = pair
        self.top_idx = top_idx
        self.retrace = retrace
        # Python values backward reads (``values``: the capture's backward ``Assumption``s of
        # them, ``assumptions.backward_values``): checked when backward runs (eager's backward
        # reads them then), and a bwd traced again for values unlike the captured ones.
        # And tensors backward reads from a global, cell or attribute (``live_slots``): a
        # tensor there of other properties than the traced one needs another bwd too.
        live = live_slots(pair)
        self.state_reads = (*(a.fetch for a in values),
                            *(lambda call_args, f=fetch: live_key(fetch_now(f, call_args)) for _, fetch, _ in live))
        self.state_base = (*(a.key for a in values), *(base if base is _NEVER else value_key(base) for _, _, base in live))
        position = {i: p for p, i in enumerate(top_idx)}
        self.checks = tuple((position[a.index], a.query, a.args, dict(a.kwargs))
                            for a in pair.grad_assumptions)
        self.materialize = pair.materialize_grads
        self.num_inputs = len(pair.inputs)
        # The plain values on ctx forward left, where backward writes them (else None).
        self.ctx_before = None if state.ctx_state is None else state.ctx_state[0]
        # The default dtype bwd was traced under (with forward): backward's factory ops read it
        # (torch.ones(n)), and eager's reads it when backward runs, so another one is another case.
        self.dtype = torch.get_default_dtype() if reads_default_dtype(pair.bwd_graph, torch.get_default_dtype()) else None
        self.user_cls, self.methods = user_cls, backward_methods(user_cls)
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
        self.writes: dict[Any, tuple[Any, ...]] = {self.base_case: (
            *state.writes_in("backward"), *(() if state.ctx_state is None else (CtxAfter(state.ctx_state[1]),)))}
        self.plain: Callable[..., Any] | None = None  # the traced bwd without its body toggles
        self.warned = False
        # Backwards in several threads: one picks or adds a variant at a time.
        self.lock = threading.RLock()

    @property
    def needs_key(self) -> bool:
        return bool(self.checks) or not self.materialize or bool(self.state_reads) or self.reads_values \
            or self.ctx_before is not None

    def key_of_expected(self) -> Any:
        nones = (False,) * len(self.top_idx) if not self.materialize else ()
        key = (nones, tuple(_NEVER if _symbolic(a.expected) else a.expected
                            for a in self.pair.grad_assumptions), self.state_base, self.dtype, self.methods)
        return key if self.ctx_before is None else (key, value_key(self.ctx_before))

    def key_of(self, top_grads: tuple[Any, ...], call_args: tuple[Any, ...] = (), ctx_state: Any = None) -> Any:
        """``ctx_state``: the plain ctx values an earlier backward of the call left (None:
        forward's), where backward writes ctx."""
        nones = tuple(g is None for g in top_grads) if not self.materialize else ()
        key = (nones, tuple(None if top_grads[p] is None else q(top_grads[p], *args, **kwargs)
                            for p, q, args, kwargs in self.checks),
               tuple(value_key(read(call_args)) for read in self.state_reads),  # usually one or two
               self.dtype and torch.get_default_dtype(), backward_methods(self.user_cls, self.methods and self.methods[2]))
        if self.ctx_before is None:
            return key
        return (key, value_key(self.ctx_before if ctx_state is None else ctx_state))

    def get(self, key: Any, create_graph: bool, top_grads: tuple[Any, ...],
            call_args: tuple[Any, ...] = (), grads: Sequence[Any] = (),
            saved: Sequence[Any] = (), ctx_state: Any = None) -> tuple[Callable[..., Any], tuple[int, ...] | None, tuple[Any, ...]]:
        """The code for this backward: ``(code, saved_map, writes)``; ``grads`` (one per fwd
        output) and ``saved`` (this capture's) are the backward's own, for value guards."""
        with self.lock:
            case = self.case_of(key, top_grads, call_args, grads, saved, ctx_state)
            writes = self.writes[case]
            found = self.code.get((case, create_graph))
            if found is not None:
                return (*found, self.writes.get((case, "grad on"), writes) if create_graph else writes)
            traced = self.variants[case][0]
            if create_graph and self.retrace is not None and type(traced) is not EagerVariant \
                    and reads_grad_mode(traced.graph if traced is not None else self.pair.bwd_graph):
                return self.grad_on(case, top_grads, call_args, grads, saved, ctx_state)
            applied = applied_functions(traced.graph if traced is not None else self.pair.bwd_graph) \
                if create_graph and type(traced) is not EagerVariant else []
            if applied:  # (here: no trace again with grad on, a capture loaded from an artifact)
                raise UnsupportedOperationError(
                    f"{self.pair.function_name}.backward applies {', '.join(applied)}, and runs with create_graph=True.",
                    "Under create_graph eager's graph holds that Function's node, whose own backward the "
                    "double backward calls; this bwd graph holds its forward ops.", "Capture the Function "
                    "again in this process (it traces backward again with grad on), or run it eagerly (fallback='eager').")
            if case == self.base_case and self.plain is not None:
                return self.plain, None, writes  # the traced case, without toggles: right in either mode
            gm, saved_map, input_map = self.variants[case]
            if gm is None:
                gm = self.pair.bwd
            if create_graph and type(gm) is not EagerVariant:
                gm = _strip_grad_toggles(gm)
            code = gm.forward
            if input_map != tuple(range(self.num_inputs)):
                code = _scatter_grads(code, input_map, self.num_inputs)
            identity = saved_map == tuple(range(self.pair.num_saved))
            found = (code, None if identity else saved_map)
            if case[1] == -1:  # served once: not kept past its call (an eager run's user ctx dies with the call's graph)
                del self.variants[case], self.writes[case]
            else:
                self.code[(case, create_graph)] = found
            return (*found, writes)

    def grad_on(self, case: tuple[Any, int], top_grads: tuple[Any, ...], call_args: tuple[Any, ...],
                grads: Sequence[Any], saved: Sequence[Any],
                ctx_state: Any = None) -> tuple[Callable[..., Any], tuple[int, ...] | None, tuple[Any, ...]]:
        """``case``'s bwd traced again with grad mode on: its backward read the mode, and eager's
        reads True under ``create_graph=True`` (the traced bwd holds False)."""
        retrace = typing.cast(Retrace, self.retrace)  # get() asks only where there is one
        seeded = {} if ctx_state is None else {"ctx_state": ctx_state}
        gm, saved_map, input_map, writes, _reads = retrace(self.layout_of(top_grads), call_args, grads, saved, True, **seeded)
        code = gm.forward if type(gm) is EagerVariant else _strip_grad_toggles(gm).forward
        if input_map != tuple(range(self.num_inputs)):
            code = _scatter_grads(code, input_map, self.num_inputs)
        found = (code, None if saved_map == tuple(range(self.pair.num_saved)) else saved_map)
        if not _served_once(writes):  # (else traced again next time)
            self.code[(case, True)] = found
            self.writes[(case, "grad on")] = writes
        return (*found, writes)

    def layout_of(self, top_grads: tuple[Any, ...]) -> GradLayout:
        layout: list[Any] = [None] * len(self.pair.top_level)
        for p, i in enumerate(self.top_idx):
            g = top_grads[p]
            layout[i] = None if g is None else (tuple(g.stride()), g.requires_grad)
        return tuple(layout)

    def case_of(self, key: Any, top_grads: tuple[Any, ...], call_args: tuple[Any, ...],
                grads: Sequence[Any], saved: Sequence[Any], ctx_state: Any = None) -> tuple[Any, int]:
        """The variant for ``key`` whose values this backward's grads and saved values give
        (traced now if none)."""
        for n, checks in self.cases.get(key, ()):
            if all(check(grads, saved) for check in checks) and self.fetches_fit(key, n, call_args):
                return (key, n)
        if self.retrace is None:
            raise UnsupportedOperationError(
                f"{self.pair.function_name}.backward received grads unlike the ones it was "
                "traced with (their layout, or which are None), and this capture cannot "
                "trace backward again (it was loaded from an artifact).",
                "Its backward reads properties of its grads (or Python values that changed "
                "since forward, or the class's backward was rebound), so another case needs another trace.",
                "Capture the Function again in this process (minihop.capture).")
        seeded = {} if ctx_state is None else {"ctx_state": ctx_state}  # else forward's
        gm, saved_map, input_map, writes, reads = self.retrace(self.layout_of(top_grads), call_args, grads, saved,
                                                               False, **seeded)
        if _served_once(writes):
            # Traced for this call only (its writes made by the trace): never filed, so the
            # next backward of this key is traced again, as this one was.
            case = (key, -1)  # (get() forgets it once it has its code: never in self.code)
            self.variants[case] = (gm, saved_map, input_map)
            self.writes[case] = writes
            return case
        cases = self.cases.setdefault(key, [])
        if len(cases) >= MAX_VALUE_VARIANTS:
            self.drop(key, cases.pop(0)[0])
        case = (key, self.traced)
        self.traced += 1
        cases.append((case[1], tuple(_bwd_value_check(r) for r in reads)))
        self.variants[case] = (gm, saved_map, input_map)
        self.writes[case] = writes
        return case  # traced for these very values: no check needed

    def fetches_fit(self, key: Any, n: int, call_args: tuple[Any, ...]) -> bool:
        """Whether each tensor variant ``n`` fetches that the captured backward did not read
        (``Fetched``: not in the key) is still there with the properties it was traced for
        (a list's position means another item once the list's length changed)."""
        variant = self.variants.get((key, n))
        return variant is None or all(f.fits(call_args) for f in variant[1] if type(f) is Fetched)

    def drop(self, key: Any, n: int) -> None:
        """Forget variant ``n`` of ``key`` (past ``MAX_VALUE_VARIANTS``)."""
        if not self.warned:
            self.warned = True
            notice(
                f"minihop: {self.pair.function_name}.backward was traced for "
                f"{MAX_VALUE_VARIANTS} different values it reads from its grads or saved "
                "values; the oldest trace is dropped for each new one (results stay right; "
                "each costs a trace). Compute with tensor ops (torch.where) to avoid this.",
                stacklevel=5)
        for create_graph in (False, True):
            self.code.pop(((key, n), create_graph), None)
        self.variants.pop((key, n), None)
        self.writes.pop((key, n), None)


class EagerVariant:
    """A variant that runs the user's backward itself for one call (``fallback="eager"``: tracing
    it again for that call was refused). ``forward(*grads, *saved)`` gives one gradient per
    forward argument; its Python writes are the user's code's own. Served once, never filed."""

    __slots__ = ("forward",)

    def __init__(self, forward: Callable[..., tuple[Any, ...]]) -> None:
        self.forward = forward


def _served_once(writes: tuple[Any, ...]) -> bool:
    """Whether a variant's trace serves its own call only (``spec.ServedOnce`` among its writes)."""
    return any(type(w) is ServedOnce for w in writes)


class Unfetched:
    """What a place backward reads when it runs held: nothing (``ctx.parts["b"]``, the caller
    deleted "b" since forward). Only the bwd that takes it raises ``error``: a variant traced
    for the dict as it is now does not read it, as eager's backward does not."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class Fetched:
    """A variant's saved value that the captured backward did not read: a tensor fetched from
    its place when backward runs (``fetch``), traced with the properties ``key`` says."""

    __slots__ = ("fetch", "same")

    def __init__(self, fetch: Callable[[tuple[Any, ...]], Any], key: Any) -> None:
        self.fetch = fetch
        self.same = same_properties(key) or (lambda t: False)  # symbolic: traced again each time

    def __call__(self, call_args: tuple[Any, ...]) -> Any:
        return fetch_now(self.fetch, call_args)

    def fits(self, call_args: tuple[Any, ...]) -> bool:
        value = fetch_now(self.fetch, call_args)
        return issubclass(type(value), torch.Tensor) and self.same(value)


def live_key(value: Any) -> Any:
    """A live slot's key when backward runs: the fetched tensor's ``tensor_key``, or a key of its own
    for what is not a tensor there (gone, or a list's position moved): never the traced one's."""
    return tensor_key(value) if issubclass(type(value), torch.Tensor) else ("absent", type(value).__name__)


def fetch_now(fetch: Callable[[tuple[Any, ...]], Any], call_args: tuple[Any, ...]) -> Any:
    """What ``fetch`` finds now, or ``Unfetched`` where its key or attribute is gone."""
    try:
        return fetch(call_args)
    except (LookupError, AttributeError) as e:
        return Unfetched(e)


def live_slots(pair: Pair) -> tuple[tuple[int, Callable[[tuple[Any, ...]], Any], Any], ...]:
    """Per saved value that is a tensor backward reads when it runs (``InputSource.
    read_in_backward``, passed through fwd): ``(saved index, fetch, key)``. ``fetch(call_args)``
    gives what its place holds now (a global, cell or attribute; or a module argument's
    parameter or buffer, from the call's arguments), ``key`` the traced tensor's properties."""
    placeholders = [n for n in pair.fwd_graph.nodes if n.op == "placeholder"]
    sources = dict(zip(placeholders, pair.inputs, strict=True))
    saved_nodes = pair.fwd_graph.output_node().args[0][1]
    slots = []
    for i, node in enumerate(saved_nodes):
        source = sources.get(node)
        if source is None or not source.read_in_backward:
            continue
        if source.fetched:
            fetch: Callable[[tuple[Any, ...]], Any] = source.place.get
        elif source.path is not None:
            fetch = lambda call_args, g=make_getter(source.path): g(call_args, {})
        else:
            continue
        slots.append((i, fetch, tensor_key(node.meta.get("val"))))
    return tuple(slots)


def same_properties(key: Any) -> Callable[[Any], bool] | None:
    """``t -> bool``: whether tensor ``t`` has the properties ``key`` (a ``tensor_key``) says,
    compiled once (no key built per backward); None for a key never equal (symbolic sizes)."""
    if key is _NEVER or key[0] != "tensor":
        return None
    _, shape, dtype, device, layout, requires_grad = key
    plain = (torch.Tensor, torch.nn.Parameter)
    return lambda t: (type(t) in plain and t.shape == shape and str(t.dtype) == dtype
                      and str(t.device) == device and str(t.layout) == layout
                      and t.requires_grad == requires_grad)


def keeps_arguments(pair: Pair, state: PythonState) -> bool:
    """Whether backward needs the call's arguments: it reads or writes Python state in them,
    or reads a module argument's tensor when it runs (forward keeps them on ctx)."""
    return state.backward_uses_args or reads_argument_tensors(pair)


def reads_argument_tensors(pair: Pair) -> bool:
    """Whether backward reads a tensor of an argument (a module's) when it runs."""
    return any(s.read_in_backward and not s.fetched and s.path is not None for s in pair.inputs)


def tensor_key(value: Any) -> Any:
    """What a bwd traced for a tensor relies on: its type, shape, dtype, device, layout,
    requires_grad (symbolic sizes: never equal, so a changed tensor is traced again)."""
    if not issubclass(type(value), torch.Tensor):
        return _NEVER
    if _symbolic(tuple(value.shape)):
        return _NEVER
    kind = "tensor" if type(value) in (torch.Tensor, torch.nn.Parameter) or type(value).__name__ == "FakeTensor" \
        else type(value).__qualname__
    return (kind, tuple(value.shape), str(value.dtype), str(value.device), str(value.layout), value.requires_grad)


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
            if i >= 0:  # (-1: a tensor the variant fetched from its place; no gradient goes there)
                grads[i] = g
        return tuple(grads)

    return run


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
