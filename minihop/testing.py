"""Testing helpers: check a capture against eager PyTorch in one call.

Not part of the pipeline; a consumer of the public API. ``assert_matches_eager`` captures a
Function, runs the capture and eager ``F.apply`` on separate clones of the same arguments,
and compares outputs (values, structure, ``requires_grad``, aliasing with inputs), every
input's ``.grad`` after the same backward, and the pair's graph contract.
``assert_pair_matches_eager`` does the same for another system's fwd/bwd pair, fed the fwd
inputs in the order the graph contract defines (docs/oracle.md). Every helper hides itself from
pytest's tracebacks (``__tracebackhide__``), so a failure points at the test's own line.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import re
import types
from typing import Any

import torch.fx as fx

import torch

from .pipeline import UNSET, Capture, capture, check_consistent, refuse_shadowed_options
from .structure import Path, format_path, iter_leaves, replace_tensors

__all__ = ["assert_matches_eager", "assert_pair_matches_eager", "assert_same_graph", "clone_args",
           "dynamo_graphs", "DynamoGraphs", "EagerComparison"]


@dataclasses.dataclass(frozen=True)
class EagerComparison:
    """What ``assert_matches_eager`` compared, for further assertions."""

    capture: Capture
    eager_output: Any
    captured_output: Any
    eager_args: tuple[Any, ...]
    captured_args: tuple[Any, ...]


def clone_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Fresh leaf copies of every tensor in ``args`` (same values and ``requires_grad``).

    >>> import torch
    >>> x = torch.ones(2, requires_grad=True)
    >>> (c,) = clone_args((x,))
    >>> c is x, c.requires_grad, c.is_leaf
    (False, True, True)
    """
    __tracebackhide__ = True
    memo: dict[int, torch.Tensor] = {}

    def clone(_path: Path, t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            c = t.detach().clone()
            if t.requires_grad:
                c.requires_grad_(True)
            memo[id(t)] = c
        return memo[id(t)]

    return tuple(replace_tensors(a, clone, (("arg", i),)) for i, a in enumerate(args))


def _check(ok: bool, message: str) -> None:
    """The oracle's checks as explicit raises: a bare ``assert`` is stripped under ``python -O``,
    and the oracle would stop checking types, structure, requires_grad, aliasing and grads."""
    __tracebackhide__ = True
    if not ok:
        raise AssertionError(message)


def _loss(output: Any, seed: int) -> torch.Tensor | None:
    gen = torch.Generator().manual_seed(seed)
    total: torch.Tensor | None = None
    for _, leaf in iter_leaves(output):
        if issubclass(type(leaf), torch.Tensor) and leaf.requires_grad and leaf.is_floating_point():
            w = torch.randn(leaf.shape, generator=gen, dtype=leaf.dtype).to(leaf.device)
            term = (leaf * w).sum()
            total = term if total is None else total + term
    return total


def assert_matches_eager(fn_cls: type, *args: Any, rtol: float | None = UNSET,
                         atol: float | None = UNSET, backward: bool = UNSET, seed: int = UNSET,
                         **kwargs: Any) -> EagerComparison:
    """Capture ``fn_cls`` and assert it behaves like ``fn_cls.apply`` on these arguments.

    Compares outputs (values, structure, ``requires_grad``, aliasing with inputs) and, after
    the same backward (a fixed random weighting of every differentiable output), every
    input's ``.grad``; checks the pair's graph contract. Both runs start from torch's random
    generator seeded with ``seed`` (forward and backward alike), so a Function that draws
    random numbers (dropout) compares; the caller's generator state is restored afterwards.
    Returns an ``EagerComparison`` for further assertions. Defaults: ``rtol``/``atol``
    torch.testing's for the dtype, ``backward=True``, ``seed=0``; an option named like an
    argument of ``fn_cls.forward`` that ``args`` leave unfilled is refused, never shadowed.

    >>> import torch, minihop.demo
    >>> result = assert_matches_eager(minihop.demo.MySin, torch.randn(4, requires_grad=True))
    >>> result.capture.name
    'MySin'
    """
    __tracebackhide__ = True
    refuse_shadowed_options(fn_cls, args, {"rtol": rtol, "atol": atol, "backward": backward, "seed": seed})
    rtol, atol = (None if rtol is UNSET else rtol), (None if atol is UNSET else atol)
    backward = True if backward is UNSET else backward
    seed = 0 if seed is UNSET else seed
    cap = capture(fn_cls, *args, **kwargs)
    check_consistent(cap.fwd, cap.bwd)
    eager_args = clone_args(args)
    mine_args = clone_args(args)
    eager_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    mine_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    with torch.random.fork_rng(devices=_rng_devices(args)):
        torch.manual_seed(seed)  # the same draws on both sides: random Functions compare
        eager_out = fn_cls.apply(*eager_args, **eager_kwargs)
        torch.manual_seed(seed)
        mine_out = cap(*mine_args, **mine_kwargs)
        _compare_outputs(eager_out, mine_out, eager_args, eager_kwargs, mine_args, mine_kwargs, rtol, atol)
        if backward:
            _compare_grads(eager_out, mine_out, (eager_args, eager_kwargs), (mine_args, mine_kwargs),
                           rtol, atol, seed)
    return EagerComparison(cap, eager_out, mine_out, eager_args, mine_args)


def _rng_devices(args: Any) -> list[Any]:
    """The CUDA devices whose generators a call on ``args`` may draw from (fork_rng saves them)."""
    return sorted({t.device for _, t in iter_leaves(args)
                   if issubclass(type(t), torch.Tensor) and t.device.type == "cuda"}, key=str)


def _compare_outputs(eager_out: Any, mine_out: Any, eager_args: Any, eager_kwargs: Any,
                     mine_args: Any, mine_kwargs: Any, rtol: float | None, atol: float | None) -> None:
    __tracebackhide__ = True
    eager_inputs = {id(t): p for p, t in iter_leaves((eager_args, eager_kwargs)) if issubclass(type(t), torch.Tensor)}
    mine_inputs = {id(t): p for p, t in iter_leaves((mine_args, mine_kwargs)) if issubclass(type(t), torch.Tensor)}
    eager_leaves = list(iter_leaves(eager_out))
    mine_leaves = list(iter_leaves(mine_out))
    _check(type(eager_out) is type(mine_out),
           f"output type differs: eager {type(eager_out).__name__}, minihop {type(mine_out).__name__}")
    _check([p for p, _ in eager_leaves] == [p for p, _ in mine_leaves],
           f"output structure differs:\n  eager:   {[format_path(p) for p, _ in eager_leaves]}\n"
           f"  minihop: {[format_path(p) for p, _ in mine_leaves]}")
    for (path, e), (_, m) in zip(eager_leaves, mine_leaves, strict=True):
        where = f"output{format_path(path)}"
        if issubclass(type(e), torch.Tensor):
            _check(issubclass(type(m), torch.Tensor),
                   f"{where}: eager gives a tensor, minihop {type(m).__name__}")
            torch.testing.assert_close(m, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda s: f"{where}: {s}")
            _check(m.requires_grad == e.requires_grad,
                   f"{where}: requires_grad eager={e.requires_grad} minihop={m.requires_grad}")
            _check((id(m) in mine_inputs) == (id(e) in eager_inputs),
                   f"{where}: eager output {'is' if id(e) in eager_inputs else 'is not'} an input object; "
                   f"minihop's {'is' if id(m) in mine_inputs else 'is not'}")
        else:
            _check(type(e) is type(m) and e == m,
                   f"{where}: eager {e!r}, minihop {m!r}")


def _compare_grads(eager_out: Any, mine_out: Any, eager_inputs: Any, mine_inputs: Any,
                   rtol: float | None, atol: float | None, seed: int, side: str = "minihop") -> None:
    """Run the same backward on both outputs (a fixed random weighting of every
    differentiable output, backward's own draws seeded alike) and compare every input's grad."""
    __tracebackhide__ = True
    eager_loss = _loss(eager_out, 0)
    mine_loss = _loss(mine_out, 0)
    _check((eager_loss is None) == (mine_loss is None),
           "one side has no differentiable output")
    if eager_loss is not None and mine_loss is not None:
        torch.manual_seed(seed + 1)
        eager_loss.backward()
        torch.manual_seed(seed + 1)
        mine_loss.backward()
    eager_grads = [(p, t.grad) for p, t in iter_leaves(eager_inputs) if issubclass(type(t), torch.Tensor)]
    mine_grads = [(p, t.grad) for p, t in iter_leaves(mine_inputs) if issubclass(type(t), torch.Tensor)]
    for (path, eg), (_, mg) in zip(eager_grads, mine_grads, strict=True):
        where = f"grad of {format_path(path)}"
        _check((eg is None) == (mg is None),
               f"{where}: eager {'None' if eg is None else 'a tensor'}, {side} {'None' if mg is None else 'a tensor'}")
        if eg is not None:
            torch.testing.assert_close(mg, eg, rtol=rtol, atol=atol, equal_nan=True, msg=lambda s: f"{where}: {s}")


def assert_pair_matches_eager(fn_cls: type, args: tuple[Any, ...], fwd: fx.GraphModule | fx.Graph,
                              bwd: fx.GraphModule | fx.Graph, *, kwargs: dict[str, Any] | None = None,
                              rtol: float | None = None, atol: float | None = None,
                              seed: int = 0) -> EagerComparison:
    """Assert another system's fwd/bwd pair for ``fn_cls`` behaves like ``fn_cls.apply(*args)``.

    ``fwd``/``bwd`` (GraphModules or graphs; from a compiler, or ``dynamo_graphs(F, ...).fwd``
    and ``.bwd``) must follow the graph contract (docs/graph_contract.md), which is checked
    first. They are run as one op (``minihop.ops.autograd_function_apply``) on the fwd inputs in
    the contract's order: the tensors forward touches in order of first use, lifted ones
    (inside objects, containers, closures, globals) included and detached, then tensor
    arguments forward never used. minihop captures ``fn_cls`` to learn that order and the
    non-differentiable outputs; the pair's fwd outputs are compared with the tensors of
    eager's output in structure order, and every argument's ``.grad`` after the same backward.
    Random draws are seeded alike on both sides, as in ``assert_matches_eager``.

    >>> import torch, minihop.demo
    >>> x = torch.randn(4, requires_grad=True)
    >>> cap = minihop.capture(minihop.demo.MySin, x)   # or another system's pair
    >>> _ = assert_pair_matches_eager(minihop.demo.MySin, (x,), cap.fwd, cap.bwd)
    """
    __tracebackhide__ = True
    from .ops import autograd_function_apply

    kwargs = dict(kwargs or {})
    fwd_gm, bwd_gm = _as_module(fwd), _as_module(bwd)
    check_consistent(fwd_gm, bwd_gm)
    cap = capture(fn_cls, *args, **kwargs)
    placeholders = [n for n in fwd_gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(cap.inputs):
        order = ", ".join(src.name for src in cap.inputs)
        raise AssertionError(
            f"the pair's fwd takes {len(placeholders)} inputs ({', '.join(n.name for n in placeholders)}); "
            f"the graph contract gives {fn_cls.__qualname__} {len(cap.inputs)}: {order}")
    eager_args, pair_args = clone_args(args), clone_args(args)
    eager_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    pair_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    inputs = cap.fwd_inputs(*pair_args, **pair_kwargs)
    for i, (node, src, value) in enumerate(zip(placeholders, cap.inputs, inputs, strict=True)):
        val = node.meta.get("val", node.meta.get("example_value"))
        if issubclass(type(val), torch.Tensor) and issubclass(type(value), torch.Tensor) and (
                val.shape != value.shape or val.dtype != value.dtype):
            raise AssertionError(
                f"fwd input {i}: the pair's placeholder {node.name} is {_describe(val)}, but the "
                f"contract's input {i} is {src.name} ({src.description}), {_describe(value)}")
    with torch.random.fork_rng(devices=_rng_devices(args)):
        torch.manual_seed(seed)
        eager_out = fn_cls.apply(*eager_args, **eager_kwargs)
        torch.manual_seed(seed)
        pair_out = autograd_function_apply(fwd_gm, bwd_gm, *inputs,
                                           non_differentiable_idx=cap.non_differentiable_idx,
                                           dirty_idx=cap.dirty_idx)
        eager_tensors = [(p, t) for p, t in iter_leaves(eager_out) if issubclass(type(t), torch.Tensor)]
        if len(eager_tensors) != len(pair_out):
            raise AssertionError(f"the pair's fwd returns {len(pair_out)} outputs; eager's output holds "
                                 f"{len(eager_tensors)} tensors: {[format_path(p) for p, _ in eager_tensors]}")
        # Compare position by position; only outputs eager differentiates take part in backward.
        pair_leaves = tuple(o if e.requires_grad else o.detach()
                            for (_, e), o in zip(eager_tensors, pair_out, strict=True))
        for (path, e), o in zip(eager_tensors, pair_leaves, strict=True):
            where = f"output{format_path(path)}"
            torch.testing.assert_close(o, e, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda s, where=where: f"{where}: {s}")
        _compare_grads(tuple(e for _, e in eager_tensors), pair_leaves, (eager_args, eager_kwargs),
                       (pair_args, pair_kwargs), rtol, atol, seed, side="the pair")
    return EagerComparison(cap, eager_out, pair_out, eager_args, pair_args)


def _as_module(g: fx.GraphModule | fx.Graph) -> fx.GraphModule:
    return g if issubclass(type(g), fx.GraphModule) else fx.GraphModule(torch.nn.Module(), g)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


# Names under which the same operation may appear in different systems' graphs.
_OPERATOR_NAMES = {operator.add: "add", operator.sub: "sub", operator.mul: "mul",
                   operator.truediv: "div", operator.neg: "neg", operator.matmul: "matmul",
                   operator.getitem: "getitem", operator.pow: "pow", operator.floordiv: "floor_divide",
                   operator.mod: "remainder", operator.abs: "abs", operator.pos: "positive",
                   operator.invert: "bitwise_not", operator.and_: "bitwise_and",
                   operator.or_: "bitwise_or", operator.xor: "bitwise_xor",
                   operator.lshift: "bitwise_left_shift", operator.rshift: "bitwise_right_shift",
                   operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge",
                   operator.eq: "eq", operator.ne: "ne", operator.iadd: "add_",
                   operator.isub: "sub_", operator.imul: "mul_", operator.itruediv: "div_"}


def _op_name(node: fx.Node, normalize: bool) -> str:
    target = node.target
    if node.op == "call_method":
        if not normalize:
            return f"Tensor.{target}"
        dunder = getattr(operator, str(target), None) if str(target).startswith("__") else None
        return _OPERATOR_NAMES.get(dunder, str(target))  # x.__mul__(y) is x.mul(y)
    if node.op == "call_function":
        if normalize and target in _OPERATOR_NAMES:
            return _OPERATOR_NAMES[target]
        name = getattr(target, "__name__", str(target))
        if normalize and (getattr(torch, name, None) is target or getattr(torch.Tensor, name, None) is target):
            return name
        return f"{getattr(target, '__module__', '')}.{name}"
    return f"{node.op}:{target}" if node.op == "get_attr" else node.op


def _canonical(graph: fx.Graph, check_meta: bool, normalize: bool) -> tuple[list[str], list[str]]:
    """Two lines per node: one with positional names (%0, %1, ...), compared; one with the
    graph's own names and the user's source line (``meta["stack_trace"]``), shown in a diff."""
    index: dict[fx.Node, str] = {}
    lines: list[str] = []
    shown: list[str] = []
    for node in graph.nodes:
        index[node] = f"%{len(index)}"
        op = _op_name(node, normalize)
        line = f"{index[node]} = {op}{_operands(node, index)}"
        named = f"{node.name} = {op}{_operands(node, {n: n.name for n in index})}"
        if check_meta:
            val = node.meta.get("val", node.meta.get("example_value"))
            if issubclass(type(val), torch.Tensor):
                meta = f"  # {str(val.dtype).removeprefix('torch.')}{list(val.shape)}"
                line, named = line + meta, named + meta
        lines.append(line)
        shown.append(named)
    return lines, shown


def _operands(node: fx.Node, names: dict[fx.Node, str]) -> str:
    def show(a: Any) -> str:
        return names[a] if issubclass(type(a), fx.Node) else repr(a)

    args = fx.node.map_aggregate(node.args, show)
    kwargs = {k: fx.node.map_aggregate(v, show) for k, v in node.kwargs.items()}
    return f"{args!r}{kwargs if kwargs else ''}".replace("'", "")


def _user_line(node: fx.Node) -> str:
    """The innermost frame of a node's recorded stack trace: ``file.py:12: return x.sin()``."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', trace)
    if not frames:
        return ""
    file, line, code = frames[-1]
    return f"{file.rsplit('/', 1)[-1]}:{line}: {code.strip()}"


def _graph_diff(left: list[str], right: list[str], shown_a: list[str], shown_b: list[str],
                where_a: list[str], where_b: list[str]) -> str:
    """A unified diff of the compared lines, printed with each graph's own node names; under a
    changed line, the user's source line that made the node (where the graph recorded one)."""
    out = ["--- a", "+++ b"]
    matcher = difflib.SequenceMatcher(a=left, b=right, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            same = [f" {line}" for line in shown_a[i1:i2]]
            out.extend(same if len(same) <= 5 else [*same[:2], " ...", *same[-2:]])
            continue
        # Lines that read the same by name but differ by position (an operand naming another
        # node of the same name) also show their positional form.
        alike = set(shown_a[i1:i2]) & set(shown_b[j1:j2])
        for sign, shown, lines, where, lo, hi in (("-", shown_a, left, where_a, i1, i2),
                                                  ("+", shown_b, right, where_b, j1, j2)):
            for k in range(lo, hi):
                out.append(f"{sign}{shown[k]}" + (f"    [{lines[k]}]" if shown[k] in alike else ""))
                if where[k]:
                    out.append(f"      at {where[k]}")
    return "\n".join(out)


def assert_same_graph(a: fx.GraphModule | fx.Graph, b: fx.GraphModule | fx.Graph, *,
                      check_meta: bool = False, normalize: bool = False) -> None:
    """Assert two graphs (GraphModules or ``fx.Graph``s) are the same program written the same
    way, up to node names.

    Strict by default: placeholders (count and order), each node's kind and target
    (``operator.mul`` is not the method ``mul``, nor ``torch.mul``), its arguments in order (as
    positions of earlier nodes, or constants by value) and the output structure; with
    ``check_meta``, also each node's ``meta["val"]`` shape and dtype. ``normalize=True``
    compares up to how an op is spelled: ``x.sin()``, ``torch.sin(x)``, ``x * y`` and
    ``x.mul(y)`` count as the same op (operand order still counts). On failure the message is
    a diff (``-`` a's lines, ``+`` b's) naming nodes by their own names, each changed line
    followed by the user's source line that made it, where the graph recorded one.

    >>> import torch, torch.fx
    >>> f = torch.fx.symbolic_trace(lambda x: x.sin() * 2)
    >>> g = torch.fx.symbolic_trace(lambda y: y.sin() * 2)
    >>> assert_same_graph(f, g.graph)   # names differ; the programs are the same
    """
    __tracebackhide__ = True
    ga = a if issubclass(type(a), fx.Graph) else a.graph
    gb = b if issubclass(type(b), fx.Graph) else b.graph
    left, shown_a = _canonical(ga, check_meta, normalize)
    right, shown_b = _canonical(gb, check_meta, normalize)
    if left != right:
        where_a, where_b = [_user_line(n) for n in ga.nodes], [_user_line(n) for n in gb.nodes]
        raise AssertionError("graphs differ (up to node names):\n"
                             + _graph_diff(left, right, shown_a, shown_b, where_a, where_b))


@dataclasses.dataclass(frozen=True)
class DynamoGraphs:
    """What torch's Dynamo captured for one ``F.apply`` call: the outer graph and its bodies."""

    outer: fx.GraphModule
    fwd: fx.GraphModule
    bwd: fx.GraphModule


class _Recorded(Exception):
    """Raised in place of running Dynamo's compiled code: the graphs are all ``dynamo_graphs`` wants."""


def dynamo_graphs(fn_cls: type, *args: Any, **kwargs: Any) -> DynamoGraphs:
    """Dynamo's graphs for ``fn_cls.apply(*args, **kwargs)`` (uses the public torch.compile).

    minihop never needs Dynamo; this helper exists so a test can compare both systems. It
    leaves the caller's state alone: the arguments are cloned, the compiled code never runs
    (so a Function's Python side effects, which Dynamo replays after its graph, do not happen
    a second time), and nothing is reset (each call compiles its own fresh code object, so the
    caller's own ``torch.compile`` caches and recompile limits are untouched).

    >>> import torch, minihop.demo
    >>> d = dynamo_graphs(minihop.demo.MySin, torch.randn(4, requires_grad=True))
    >>> _ = assert_pair_matches_eager(minihop.demo.MySin, (torch.randn(4, requires_grad=True),), d.fwd, d.bwd)
    """
    __tracebackhide__ = True
    import torch.compiler  # public API; imported here so minihop's import stays light

    graphs: list[fx.GraphModule] = []

    def record(gm: fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)

        def stop(*_: Any) -> Any:
            raise _Recorded
        return stop

    def call(*a: Any, **k: Any) -> Any:
        return fn_cls.apply(*a, **k)

    # Dynamo caches per code object: a fresh one per call is a fresh compile for this class.
    # dynamic=False: static shapes, as a first compile after a reset has (automatic dynamic
    # remembers earlier sizes by source location, which every call here shares).
    fresh = types.FunctionType(call.__code__.replace(), call.__globals__, "call", None, call.__closure__)
    compiled = torch.compile(fresh, backend=record, fullgraph=True, dynamic=False)
    try:
        compiled(*clone_args(args), **dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True)))
    except _Recorded:
        pass
    outer = graphs[-1]
    bodies = dict(outer.named_children())
    fwd_name = next((n for n in bodies if n.startswith("fwd_body")), None)
    bwd_name = next((n for n in bodies if n.startswith("bwd_body")), None)
    if fwd_name is None or bwd_name is None:
        raise ValueError(
            f"Dynamo did not capture {fn_cls.__qualname__}.apply as an autograd_function_apply: its "
            "graph has no fwd_body/bwd_body.\nDynamo inlines forward when no tensor argument "
            "requires grad or grad mode is off; pass an argument with requires_grad=True.")
    return DynamoGraphs(outer, bodies[fwd_name], bodies[bwd_name])
