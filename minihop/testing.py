"""Testing helpers: check a capture against eager PyTorch in one call.

Not part of the pipeline; a consumer of the public API. ``assert_matches_eager`` captures a
Function, runs the capture and eager ``F.apply`` on separate clones of the same arguments,
and compares outputs (values, structure, ``requires_grad``, aliasing with inputs), every
input's ``.grad`` after the same backward, and the pair's graph contract.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import types
from typing import Any

import torch.fx as fx

import torch

from .pipeline import UNSET, Capture, capture, check_consistent, refuse_shadowed_options
from .structure import Path, format_path, iter_leaves, replace_tensors

__all__ = ["assert_matches_eager", "assert_same_graph", "clone_args", "dynamo_graphs",
           "DynamoGraphs", "EagerComparison"]


@dataclasses.dataclass(frozen=True)
class EagerComparison:
    """What ``assert_matches_eager`` compared, for further assertions."""

    capture: Capture
    eager_output: Any
    captured_output: Any
    eager_args: tuple[Any, ...]
    captured_args: tuple[Any, ...]


def clone_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Fresh leaf copies of every tensor in ``args`` (same values and ``requires_grad``)."""
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
    if not ok:
        raise AssertionError(message)


def _loss(output: Any, seed: int) -> torch.Tensor | None:
    gen = torch.Generator().manual_seed(seed)
    total: torch.Tensor | None = None
    for _, leaf in iter_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.is_floating_point():
            w = torch.randn(leaf.shape, generator=gen, dtype=leaf.dtype).to(leaf.device)
            term = (leaf * w).sum()
            total = term if total is None else total + term
    return total


def assert_matches_eager(fn_cls: type, *args: Any, rtol: float | None = UNSET,
                         atol: float | None = UNSET, backward: bool = UNSET,
                         **kwargs: Any) -> EagerComparison:
    """Capture ``fn_cls`` and assert it behaves like ``fn_cls.apply`` on these arguments
    (``rtol``/``atol`` default: torch.testing's for the dtype; ``backward`` default True)."""
    refuse_shadowed_options(fn_cls, args, {"rtol": rtol, "atol": atol, "backward": backward})
    rtol, atol = (None if rtol is UNSET else rtol), (None if atol is UNSET else atol)
    backward = True if backward is UNSET else backward
    cap = capture(fn_cls, *args, **kwargs)
    check_consistent(cap.fwd, cap.bwd)
    eager_args = clone_args(args)
    mine_args = clone_args(args)
    eager_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    mine_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    eager_out = fn_cls.apply(*eager_args, **eager_kwargs)
    mine_out = cap(*mine_args, **mine_kwargs)

    eager_inputs = {id(t): p for p, t in iter_leaves((eager_args, eager_kwargs)) if isinstance(t, torch.Tensor)}
    mine_inputs = {id(t): p for p, t in iter_leaves((mine_args, mine_kwargs)) if isinstance(t, torch.Tensor)}
    eager_leaves = list(iter_leaves(eager_out))
    mine_leaves = list(iter_leaves(mine_out))
    _check(type(eager_out) is type(mine_out),
           f"output type differs: eager {type(eager_out).__name__}, minihop {type(mine_out).__name__}")
    _check([p for p, _ in eager_leaves] == [p for p, _ in mine_leaves],
           f"output structure differs:\n  eager:   {[format_path(p) for p, _ in eager_leaves]}\n"
           f"  minihop: {[format_path(p) for p, _ in mine_leaves]}")
    for (path, e), (_, m) in zip(eager_leaves, mine_leaves, strict=True):
        where = f"output{format_path(path)}"
        if isinstance(e, torch.Tensor):
            _check(isinstance(m, torch.Tensor), f"{where}: eager gives a tensor, minihop {type(m).__name__}")
            torch.testing.assert_close(m, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda s: f"{where}: {s}")
            _check(m.requires_grad == e.requires_grad,
                   f"{where}: requires_grad eager={e.requires_grad} minihop={m.requires_grad}")
            _check((id(m) in mine_inputs) == (id(e) in eager_inputs),
                   f"{where}: eager output {'is' if id(e) in eager_inputs else 'is not'} an input object; "
                   f"minihop's {'is' if id(m) in mine_inputs else 'is not'}")
        else:
            _check(type(e) is type(m) and e == m, f"{where}: eager {e!r}, minihop {m!r}")

    if backward:
        eager_loss = _loss(eager_out, 0)
        mine_loss = _loss(mine_out, 0)
        _check((eager_loss is None) == (mine_loss is None), "one side has no differentiable output")
        if eager_loss is not None and mine_loss is not None:
            eager_loss.backward()
            mine_loss.backward()
        eager_grads = [(p, t.grad) for p, t in iter_leaves((eager_args, eager_kwargs)) if isinstance(t, torch.Tensor)]
        mine_grads = [(p, t.grad) for p, t in iter_leaves((mine_args, mine_kwargs)) if isinstance(t, torch.Tensor)]
        for (path, eg), (_, mg) in zip(eager_grads, mine_grads, strict=True):
            where = f"grad of {format_path(path)}"
            _check((eg is None) == (mg is None),
                   f"{where}: eager {'None' if eg is None else 'a tensor'}, minihop {'None' if mg is None else 'a tensor'}")
            if eg is not None:
                torch.testing.assert_close(mg, eg, rtol=rtol, atol=atol, equal_nan=True, msg=lambda s: f"{where}: {s}")
    return EagerComparison(cap, eager_out, mine_out, eager_args, mine_args)


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


def _canonical(gm: fx.GraphModule, check_meta: bool, normalize: bool) -> list[str]:
    """One line per node with positional names (%0, %1, ...) instead of the graph's own."""
    index: dict[fx.Node, str] = {}
    lines: list[str] = []
    for node in gm.graph.nodes:
        index[node] = f"%{len(index)}"

        def show(a: Any) -> str:
            return index[a] if isinstance(a, fx.Node) else repr(a)

        args = fx.node.map_aggregate(node.args, lambda a: show(a))
        kwargs = {k: fx.node.map_aggregate(v, lambda a: show(a)) for k, v in node.kwargs.items()}
        line = f"{index[node]} = {_op_name(node, normalize)}{args!r}{kwargs if kwargs else ''}"
        if check_meta:
            val = node.meta.get("val", node.meta.get("example_value"))
            if isinstance(val, torch.Tensor):
                line += f"  # {str(val.dtype).removeprefix('torch.')}{list(val.shape)}"
        lines.append(line.replace("'", ""))
    return lines


def assert_same_graph(a: fx.GraphModule, b: fx.GraphModule, *, check_meta: bool = False,
                      normalize: bool = False) -> None:
    """Assert two GraphModules are the same program written the same way, up to node names.

    Strict by default: placeholders (count and order), each node's kind and target
    (``operator.mul`` is not the method ``mul``, nor ``torch.mul``), its arguments in order (as
    positions of earlier nodes, or constants by value) and the output structure; with
    ``check_meta``, also each node's ``meta["val"]`` shape and dtype. ``normalize=True``
    compares up to how an op is spelled: ``x.sin()``, ``torch.sin(x)``, ``x * y`` and
    ``x.mul(y)`` count as the same op (operand order still counts). On failure the message is
    a diff of the two graphs' lines.
    """
    left = _canonical(a, check_meta, normalize)
    right = _canonical(b, check_meta, normalize)
    if left != right:
        diff = "\n".join(difflib.unified_diff(left, right, "a", "b", lineterm=""))
        raise AssertionError(f"graphs differ (up to node names):\n{diff}")


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
    """
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
