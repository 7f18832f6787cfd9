"""The audit's checks: one kept call, replayed under eager, minihop and Dynamo, compared.

The second half of ``pytest --minihop-audit`` (``minihop.audit``), run after the suite's last
test on the copies ``watch.py`` kept. For one call, eager ``F.apply`` is the reference. Each
system runs the call afresh once per *loss*: a fixed random ``grad_output`` on every
differentiable output together, then on each differentiable output alone (the others unused,
so a backward sees what eager gives an unused output: zeros, or None under
``set_materialize_grads(False)``). Compared: the outputs (structure, values, ``requires_grad``),
every input's ``.grad``, and where a run raises, whether eager raises at the same stage.
minihop's capture is also checked against the graph contract, and with Dynamo on, Dynamo's
``fwd_body``/``bwd_body`` against minihop's, strictly.

Invariant: the runs cannot see each other. Each run gets fresh copies of the arguments, the
Python state a capture says forward or backward writes is put back before every run and at
the end, and a Function whose writes minihop could not describe (a side-effect refusal) is not
run under Dynamo at all: an unknown write is never trusted to be harmless.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import random
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx

from ..errors import InconsistentGraphsError, MinihopError, SideEffectError
from ..pipeline import Capture, capture, check_consistent
from ..arguments import uses_setup_context
from ..structure import Path, format_path, iter_leaves
from ..testing import assert_same_graph, clone_args
from .watch import Call

__all__ = ["Verdict", "CallResult", "audit_call"]

_MAX_ALONE = 4  # outputs checked one by one (each is a fresh forward for every system)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One system's verdict on one call: ``verdict`` is a word of docs/audit.md's schema."""

    verdict: str
    message: str = ""
    code: str | None = None


@dataclasses.dataclass(frozen=True)
class CallResult:
    minihop: Verdict
    dynamo: Verdict | None
    graphs_equal: bool | None


@dataclasses.dataclass
class _Run:
    """What one system did with one call for one loss."""

    stage: str = ""  # "forward" or "backward" where it raised, else ""
    error: BaseException | None = None
    outputs: list[tuple[Path, Any]] = dataclasses.field(default_factory=list)
    grads: list[tuple[Path, torch.Tensor | None]] = dataclasses.field(default_factory=list)
    differentiable: int = 0


def _targets(output: Any) -> list[torch.Tensor]:
    """The outputs a loss can weigh: top-level floating tensors that require grad."""
    items = output if issubclass(type(output), tuple) else (output,)
    return [t for t in items if issubclass(type(t), torch.Tensor) and t.requires_grad and t.is_floating_point()]


def _loss(targets: list[torch.Tensor], alone: int | None) -> torch.Tensor | None:
    total: torch.Tensor | None = None
    for i, t in enumerate(targets):
        if alone is not None and i != alone:
            continue
        gen = torch.Generator().manual_seed(1000 + i)  # the same weights in every system and loss
        w = torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device)
        total = (t * w).sum() if total is None else total + (t * w).sum()
    return total


def _arg_leaves(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[Path, Any]]:
    for i, a in enumerate(args):
        yield from iter_leaves(a, (("arg", i),))
    for k, v in kwargs.items():
        yield from iter_leaves(v, (("kw", k),))


def _seed() -> None:
    """The same random streams for every run: a Function that draws random numbers gets the
    same draws under each system (the caller's streams are saved and put back around it all)."""
    torch.manual_seed(0)
    random.seed(0)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(0)


def _run(call_fn: Callable[..., Any], call: Call, alone: int | None, restore: Callable[[], None]) -> _Run:
    restore()
    args, kwargs = clone_args((call.args, call.kwargs))
    _seed()
    run = _Run()
    try:
        with torch.set_grad_enabled(call.grad_enabled):
            out = call_fn(*args, **kwargs)
    except Exception as e:
        return _Run("forward", e)
    run.outputs = list(iter_leaves(out))
    targets = _targets(out)
    run.differentiable = len(targets)
    loss = _loss(targets, alone) if call.grad_enabled else None
    if loss is not None:
        try:
            loss.backward()
        except Exception as e:
            return dataclasses.replace(run, stage="backward", error=e)
    run.grads = [(p, t.grad) for p, t in _arg_leaves(args, kwargs) if issubclass(type(t), torch.Tensor)]
    return run


def _first_difference(eager: _Run, other: _Run, names: tuple[str, ...]) -> str | None:
    """The first way ``other`` differs from eager, in words, or None."""
    if eager.error is not None or other.error is not None:
        if eager.error is None:
            return f"raises in {other.stage} ({type(other.error).__name__}: {_line(other.error)}); eager does not"
        if other.error is None:
            return f"eager raises in {eager.stage} ({type(eager.error).__name__}: {_line(eager.error)}); this does not"
        if eager.stage != other.stage:
            return f"eager raises in {eager.stage}, this in {other.stage}"
        return None
    if [p for p, _ in eager.outputs] != [p for p, _ in other.outputs]:
        return (f"output structure: eager {[format_path(p) for p, _ in eager.outputs]}, "
                f"this {[format_path(p) for p, _ in other.outputs]}")
    for (path, e), (_, o) in zip(eager.outputs, other.outputs, strict=True):
        where = f"output{format_path(path)}"
        if issubclass(type(e), torch.Tensor) != issubclass(type(o), torch.Tensor):
            return f"{where}: eager {type(e).__name__}, this {type(o).__name__}"
        if issubclass(type(e), torch.Tensor):
            problem = _close(o, e)
            if problem:
                return f"{where}: {problem}"
            if e.requires_grad != o.requires_grad:
                return f"{where}: requires_grad eager={e.requires_grad}, this={o.requires_grad}"
        elif type(e) is not type(o) or not _equal(e, o):
            return f"{where}: eager {e!r:.60}, this {o!r:.60}"
    for (path, e), (_, o) in zip(eager.grads, other.grads, strict=True):
        where = f"grad of {format_path(path, names)}"
        if (e is None) != (o is None):
            return f"{where}: eager {'None' if e is None else 'a tensor'}, this {'None' if o is None else 'a tensor'}"
        if e is not None and o is not None:
            problem = _close(o, e)
            if problem:
                return f"{where}: {problem}"
    return None


def _close(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
    except AssertionError as e:
        # assert_close's lines after its headline: what differs, and by how much
        lines = [ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()]
        return "; ".join(lines[:2]) or str(e)[:200]
    return None


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


def _argnames(fn_cls: type) -> tuple[str, ...]:
    """forward's positional parameter names after ctx: what a grad's message calls an input."""
    try:
        params = inspect.signature(fn_cls.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return tuple(names if uses_setup_context(fn_cls) else names[1:])


def _compare(eager_runs: list[_Run], runs: list[_Run], losses: list[str], names: tuple[str, ...]) -> str | None:
    for label, e, r in zip(losses, eager_runs, runs, strict=True):
        diff = _first_difference(e, r, names)
        if diff is not None:
            return f"{diff} [{label}]"
    return None


@contextlib.contextmanager
def _written_state(cap: Capture | None, call: Call) -> Iterator[Callable[[], None]]:
    """A function that puts back, before each run, the Python state ``cap`` says the
    Function writes; the state is put back once more on the way out."""
    writes = cap.python_state.writes if cap is not None else ()
    if not writes:
        yield lambda: None
        return
    bound = cap.bind(call.args, call.kwargs) if cap is not None else ()
    saved = []
    for w in writes:
        value = w.place.get(bound)
        saved.append((w, list(value) if w.kind == "extend" else value))

    def restore() -> None:
        for w, value in saved:
            if w.kind == "extend":
                w.place.get(bound)[:] = value
            else:
                w.place.set(bound, value)
    try:
        yield restore
    finally:
        restore()


class _Reference:
    """Eager's runs of one call, made once and on first need: the "all outputs" loss, then
    each differentiable output alone."""

    def __init__(self, fn_cls: type, call: Call, restore: Callable[[], None]) -> None:
        self.fn_cls, self.call, self.restore = fn_cls, call, restore
        self._runs: list[_Run] | None = None
        self._losses: list[tuple[str, int | None]] | None = None

    @property
    def losses(self) -> list[tuple[str, int | None]]:
        if self._losses is None:
            first = _run(self.fn_cls.apply, self.call, None, self.restore)
            alone = first.differentiable if first.differentiable > 1 else 0  # one output alone is "all"
            self._losses = [("grad_output on all outputs", None)] + [
                (f"grad_output on output {i} alone", i) for i in range(min(alone, _MAX_ALONE))]
            self._runs = [first]
        return self._losses

    @property
    def runs(self) -> list[_Run]:
        losses = self.losses
        if self._runs is not None and len(self._runs) < len(losses):
            self._runs += [_run(self.fn_cls.apply, self.call, alone, self.restore) for _, alone in losses[1:]]
        return self._runs or []

    def runs_of(self, call_fn: Callable[..., Any]) -> list[_Run]:
        """``call_fn``'s runs of the same call, one per loss."""
        return [_run(call_fn, self.call, alone, self.restore) for _, alone in self.losses]

    def difference(self, runs: list[_Run]) -> str | None:
        return _compare(self.runs, runs, [label for label, _ in self.losses], _argnames(self.fn_cls))


def _minihop(cap: Capture | None, refusal: Exception | None, eager: _Reference) -> Verdict:
    if issubclass(type(refusal), SideEffectError):  # writes nobody described: not run again, eager included
        return Verdict("refused", refusal.found.splitlines()[0][:200], refusal.code)
    if issubclass(type(refusal), MinihopError):
        if eager.runs[0].error is not None:
            return Verdict("agrees", f"eager raises too ({type(eager.runs[0].error).__name__})", refusal.code)
        return Verdict("refused", refusal.found.splitlines()[0][:200], refusal.code)
    if refusal is not None or cap is None:
        first = eager.runs[0]
        if refusal is not None and first.stage == "forward" and type(first.error) is type(refusal):
            return Verdict("agrees", f"eager raises too ({type(refusal).__name__})")  # as eager's own error
        return Verdict("error", f"capture raised {type(refusal).__name__}: {_line(refusal) if refusal else ''}")
    try:
        check_consistent(cap.fwd, cap.bwd)
    except InconsistentGraphsError as e:
        return Verdict("differs", f"graph contract: {_line(e)}", e.code)
    diff = eager.difference(eager.runs_of(cap))
    return Verdict("differs", diff) if diff is not None else Verdict("agrees")


def _dynamo(fn_cls: type, call: Call, cap: Capture | None, eager: _Reference) -> tuple[Verdict, bool | None]:
    graphs: list[fx.GraphModule] = []

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    def call_apply(*a: Any, **k: Any) -> Any:
        return fn_cls.apply(*a, **k)

    # Dynamo caches per code object: a fresh one is a fresh compile, and the suite's caches
    # are left alone. Static shapes, as a first compile has.
    fresh = types.FunctionType(call_apply.__code__.replace(), call_apply.__globals__, "call",
                               None, call_apply.__closure__)
    runs = eager.runs_of(torch.compile(fresh, backend=backend, fullgraph=True, dynamic=False))
    first = runs[0]
    if first.error is not None and first.stage == "forward" and eager.runs[0].error is None:
        # Unsupported is Dynamo refusing (a graph break under fullgraph); anything else is a
        # crash. Told by its class's name: minihop never imports torch._dynamo itself.
        kind = "breaks" if _is_dynamo_unsupported(first.error) else "error"
        return Verdict(kind, f"{type(first.error).__name__}: {_line(first.error)}"), None
    diff = eager.difference(runs)
    hops = [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function"
            and getattr(n.target, "__name__", "") == "autograd_function_apply"]
    graphs_equal: bool | None = None
    note = ""
    needs_grad = call.grad_enabled and any(
        issubclass(type(t), torch.Tensor) and t.requires_grad for _, t in _arg_leaves(call.args, call.kwargs))
    if not needs_grad:
        note = "; inlined by Dynamo (no input needs a grad)" if not hops else ""
    elif len(hops) != 1:
        note = f"; not one autograd_function_apply in Dynamo's graph ({len(hops)})"
    elif cap is not None:
        bodies = dict(graphs[0].named_children())
        try:
            for prefix, mine in (("fwd_body", cap.fwd), ("bwd_body", cap.bwd)):
                theirs = next(m for n, m in bodies.items() if n.startswith(prefix))
                assert_same_graph(mine, theirs, check_meta=True)
            graphs_equal = True
        except (AssertionError, StopIteration):
            graphs_equal = False
    if diff is not None:
        return Verdict("differs", diff + note), graphs_equal
    return Verdict("agrees", note.removeprefix("; ")), graphs_equal


def audit_call(fn_cls: type, call: Call, dynamo: bool) -> CallResult:
    """minihop's (and optionally Dynamo's) verdict on one kept call."""
    cap: Capture | None = None
    refusal: Exception | None = None
    try:
        with torch.set_grad_enabled(call.grad_enabled):  # a capture is for the grad mode it was made in
            cap = capture(fn_cls, *call.args, **call.kwargs)
    except Exception as e:
        refusal = e
    with _written_state(cap, call) as restore:
        eager = _Reference(fn_cls, call, restore)
        mine = _minihop(cap, refusal, eager)
        if not dynamo:
            return CallResult(mine, None, None)
        if issubclass(type(refusal), SideEffectError):
            return CallResult(mine, Verdict("not audited", "minihop could not describe the Python state "
                                            "this Function writes, so it cannot be put back between runs"), None)
        try:
            dyn, graphs_equal = _dynamo(fn_cls, call, cap, eager)
        except Exception as e:
            dyn, graphs_equal = Verdict("error", f"{type(e).__name__}: {_line(e)}"), None
        return CallResult(mine, dyn, graphs_equal)


def _is_dynamo_unsupported(error: BaseException) -> bool:
    """Whether ``error`` is (a subclass of) ``torch._dynamo.exc.Unsupported``, by the classes'
    names and modules, without importing Dynamo."""
    return any(c.__name__ == "Unsupported" and c.__module__ == "torch._dynamo.exc"
               for c in type(error).__mro__)
