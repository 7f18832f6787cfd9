"""``minihop.check_consistent``: the graph contract, on minihop's pairs, Dynamo's and broken ones.

Broken pairs are built by hand with ``torch.fx.Graph`` from a small good pair,

    fwd(x, y)       -> ((x * y,), (y, x))
    bwd(g, y, x)    -> (g * y, g * x)

changing one thing at a time, and the messages are pinned.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx as fx

import minihop
from minihop.rewire.contract import PairShape


# ---------------------------------------------------------------------------------------------
# Building pairs by hand
# ---------------------------------------------------------------------------------------------

def f32(*shape: int) -> torch.Tensor:
    """Metadata stand-in for ``node.meta['val']`` (only shape and dtype are read)."""
    return torch.empty(shape, device="meta")


def i64(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.int64, device="meta")


def ph(g: fx.Graph, name: str, val: Any) -> fx.Node:
    node = g.placeholder(name)
    if val is not None:
        node.meta["val"] = val
    return node


def call(g: fx.Graph, fn: Callable[..., Any], *args: Any, val: Any = None) -> fx.Node:
    node = g.call_function(fn, args)
    if val is not None:
        node.meta["val"] = val
    return node


def module(build: Callable[[fx.Graph], Any]) -> fx.GraphModule:
    """A GraphModule whose output is whatever ``build`` returns."""
    g = fx.Graph()
    g.output(build(g))
    return fx.GraphModule(torch.nn.Module(), g)


def good_fwd(shape: tuple[int, ...] = (3,)) -> fx.GraphModule:
    def build(g: fx.Graph) -> Any:
        x = ph(g, "x", f32(*shape))
        y = ph(g, "y", f32(*shape))
        out = call(g, operator.mul, x, y, val=f32(*shape))
        return ((out,), (y, x))
    return module(build)


def good_bwd(shape: tuple[int, ...] = (3,), *, grad_shape: tuple[int, ...] | None = None,
             saved_shapes: tuple[tuple[int, ...], ...] | None = None,
             returns: Callable[[fx.Graph, fx.Node, fx.Node, fx.Node], Any] | None = None
             ) -> fx.GraphModule:
    def build(g: fx.Graph) -> Any:
        grad = ph(g, "g", f32(*(grad_shape or shape)))
        ys, xs = saved_shapes or (shape, shape)
        y = ph(g, "y", f32(*ys))
        x = ph(g, "x", f32(*xs))
        if returns is not None:
            return returns(g, grad, y, x)
        return (call(g, operator.mul, grad, y, val=f32(*shape)),
                call(g, operator.mul, grad, x, val=f32(*shape)))
    return module(build)


def rejects(fwd: fx.GraphModule, bwd: fx.GraphModule, pattern: str) -> minihop.InconsistentGraphsError:
    with pytest.raises(minihop.InconsistentGraphsError, match=pattern) as info:
        minihop.check_consistent(fwd, bwd)
    return info.value


# ---------------------------------------------------------------------------------------------
# check_consistent: accepts good pairs
# ---------------------------------------------------------------------------------------------

class TestAccepts:
    def test_hand_built_pair(self) -> None:
        """The hand-built good pair passes and its counts are returned."""
        assert minihop.check_consistent(good_fwd(), good_bwd()) == PairShape(2, 1, 2)

    def test_none_gradient(self) -> None:
        """None in bwd's output is allowed (no gradient flows to that input)."""
        bwd = good_bwd(returns=lambda g, grad, y, x: (call(g, operator.mul, grad, y, val=f32(3)), None))
        assert minihop.check_consistent(good_fwd(), bwd) == PairShape(2, 1, 2)

    def test_without_metadata(self) -> None:
        """Graphs without meta['val'] are checked on counts alone."""

        def fwd_build(g: fx.Graph) -> Any:
            x = ph(g, "x", None)
            return ((call(g, torch.sin, x),), (x,))

        def bwd_build(g: fx.Graph) -> Any:
            grad = ph(g, "g", None)
            x = ph(g, "x", None)
            return (call(g, operator.mul, grad, call(g, torch.cos, x)),)

        assert minihop.check_consistent(module(fwd_build), module(bwd_build)) == PairShape(1, 1, 1)

    def test_nothing_saved(self) -> None:
        """An empty saved tuple: bwd takes only the grads."""

        def fwd_build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(2))
            return ((call(g, operator.mul, x, 2, val=f32(2)),), ())

        def bwd_build(g: fx.Graph) -> Any:
            grad = ph(g, "g", f32(2))
            return (call(g, operator.mul, grad, 2, val=f32(2)),)

        assert minihop.check_consistent(module(fwd_build), module(bwd_build)) == PairShape(1, 1, 0)

    def test_broadcast_shaped_gradient(self) -> None:
        """A gradient of a broadcast shape (summed back by autograd) is accepted."""

        def fwd_build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(4))
            y = ph(g, "y", f32(3, 4))
            return ((call(g, operator.add, x, y, val=f32(3, 4)),), ())

        def bwd_build(g: fx.Graph) -> Any:
            grad = ph(g, "g", f32(3, 4))
            return (grad, grad)

        assert minihop.check_consistent(module(fwd_build), module(bwd_build)) == PairShape(2, 1, 0)

    def test_does_not_mutate(self) -> None:
        """check_consistent only reads the graphs."""
        fwd, bwd = good_fwd(), good_bwd()
        before = (fwd.code, bwd.code)
        minihop.check_consistent(fwd, bwd)
        assert (fwd.code, bwd.code) == before

    @pytest.mark.parametrize("case", ["mul", "two_outputs", "lifted", "integer", "nondiff"])
    def test_minihop_pairs(self, case: str) -> None:
        """Pairs captured by minihop pass, with counts matching their graphs."""
        fn, args = _MINIHOP_CASES[case]
        cap = minihop.capture(fn, *args)
        shape = minihop.check_consistent(cap.fwd, cap.bwd)
        fwd_placeholders = [n for n in cap.fwd.graph.nodes if n.op == "placeholder"]
        bwd_placeholders = [n for n in cap.bwd.graph.nodes if n.op == "placeholder"]
        assert shape.num_inputs == len(fwd_placeholders)
        assert shape.num_outputs + shape.num_saved == len(bwd_placeholders)

    def test_dynamo_pair(self) -> None:
        """The fwd_body_0/bwd_body_0 pair torch 2.13's Dynamo makes for a Function passes."""
        recorded: list[fx.GraphModule] = []

        def backend(gm: fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
            recorded.append(gm)
            return gm.forward

        torch._dynamo.reset()
        compiled = torch.compile(lambda x, y: _TwoOut.apply(x, y), fullgraph=True, backend=backend)
        x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        a, b = compiled(x, y)
        (a + b).sum().backward()
        torch.testing.assert_close(x.grad, y.detach() + 1)
        (gm,) = recorded
        fwd, bwd = gm.fwd_body_0, gm.bwd_body_0
        assert minihop.check_consistent(fwd, bwd) == PairShape(2, 2, 2)
        torch._dynamo.reset()


class _Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


class _TwoOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y, x + 1

    @staticmethod
    def backward(ctx, g, g2):
        x, y = ctx.saved_tensors
        return g * y + g2, g * x


class _Lifted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, wb):
        return x * wb[0] + wb[1]

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Index(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        return x[idx] * 1

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        return torch.zeros(4).index_add(0, idx, g), None


class _NonDiff(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        idx = x.argsort()
        ctx.mark_non_differentiable(idx)
        return x * 2, idx

    @staticmethod
    def backward(ctx, g, _gi):
        return g * 2


_MINIHOP_CASES: dict[str, tuple[type, tuple[Any, ...]]] = {
    "mul": (_Mul, (torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True))),
    "two_outputs": (_TwoOut, (torch.randn(3, requires_grad=True), torch.randn(3))),
    "lifted": (_Lifted, (torch.randn(3, requires_grad=True), (torch.randn(3), torch.randn(3)))),
    "integer": (_Index, (torch.randn(4, requires_grad=True), torch.tensor([0, 2, 2]))),
    "nondiff": (_NonDiff, (torch.randn(5, requires_grad=True),)),
}


# ---------------------------------------------------------------------------------------------
# check_consistent: rejects broken pairs
# ---------------------------------------------------------------------------------------------

class TestRejects:
    def test_too_few_bwd_outputs(self) -> None:
        """(a) bwd returning fewer values than fwd has inputs."""
        bwd = good_bwd(returns=lambda g, grad, y, x: (call(g, operator.mul, grad, y, val=f32(3)),))
        rejects(good_fwd(), bwd, re.escape("(a) bwd returns 1 values, expected one per fwd input (2: x, y)"))

    def test_too_many_bwd_outputs(self) -> None:
        """(a) bwd returning more values than fwd has inputs."""
        bwd = good_bwd(returns=lambda g, grad, y, x: (grad, grad, None))
        rejects(good_fwd(), bwd, re.escape("(a) bwd returns 3 values, expected one per fwd input (2: x, y)"))

    def test_bare_bwd_output(self) -> None:
        """(a) a bwd returning a single value for a two-input fwd."""
        bwd = good_bwd(returns=lambda g, grad, y, x: grad)
        rejects(good_fwd(), bwd, re.escape("(a) bwd returns 1 values"))

    def test_missing_grad_input(self) -> None:
        """(b) bwd without the grad placeholder for fwd's one output."""

        def build(g: fx.Graph) -> Any:
            y = ph(g, "y", f32(3))
            x = ph(g, "x", f32(3))
            return (y, x)

        rejects(good_fwd(), module(build),
                re.escape("(b)/(c) bwd takes 2 inputs, expected 1 grads + 2 saved = 3"))

    def test_extra_grad_input(self) -> None:
        """(b) bwd with one grad placeholder too many."""

        def build(g: fx.Graph) -> Any:
            grad = ph(g, "g", f32(3))
            ph(g, "g2", f32(3))
            y = ph(g, "y", f32(3))
            x = ph(g, "x", f32(3))
            return (call(g, operator.mul, grad, y), call(g, operator.mul, grad, x))

        rejects(good_fwd(), module(build),
                re.escape("(b)/(c) bwd takes 4 inputs, expected 1 grads + 2 saved = 3"))

    def test_grad_input_shape_mismatch(self) -> None:
        """(b) a grad placeholder whose shape is not its output's."""
        rejects(good_fwd(), good_bwd(grad_shape=(2,)),
                re.escape("(b) grad input 0 (g) does not match fwd output 0 (float32[2] vs float32[3])"))

    def test_fwd_output_not_a_pair(self) -> None:
        """(c) fwd returning a bare tensor instead of ((outs), (saved))."""

        def build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(3))
            y = ph(g, "y", f32(3))
            return call(g, operator.mul, x, y, val=f32(3))

        err = rejects(module(build), good_bwd(), re.escape("(c) fwd must return ((outputs...), (saved...))"))
        assert "fwd returns mul" in str(err)

    def test_fwd_output_flat_tuple(self) -> None:
        """(c) fwd returning (out, saved_0, saved_1) flat."""

        def build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(3))
            y = ph(g, "y", f32(3))
            return (call(g, operator.mul, x, y, val=f32(3)), y, x)

        rejects(module(build), good_bwd(), re.escape("(c) fwd must return ((outputs...), (saved...))"))

    def test_fwd_saved_not_a_tuple(self) -> None:
        """(c) fwd returning ((out,), saved) with saved a bare node."""

        def build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(3))
            y = ph(g, "y", f32(3))
            return ((call(g, operator.mul, x, y, val=f32(3)),), x)

        rejects(module(build), good_bwd(), re.escape("(c) fwd must return ((outputs...), (saved...))"))

    def test_saved_order_count_mismatch(self) -> None:
        """(c) fwd saving one value while bwd expects two."""

        def build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(3))
            y = ph(g, "y", f32(3))
            return ((call(g, operator.mul, x, y, val=f32(3)),), (y,))

        rejects(module(build), good_bwd(),
                re.escape("(b)/(c) bwd takes 3 inputs, expected 1 grads + 1 saved = 2"))

    def test_saved_shape_mismatch(self) -> None:
        """(c) a saved placeholder in bwd whose shape differs from what fwd saves."""
        rejects(good_fwd(), good_bwd(saved_shapes=((4,), (3,))),
                re.escape("(c) saved 0: bwd placeholder y is float32[4], fwd saves float32[3]"))

    def test_saved_dtype_mismatch(self) -> None:
        """(c) a saved placeholder in bwd whose dtype differs from what fwd saves."""

        def build(g: fx.Graph) -> Any:
            grad = ph(g, "g", f32(3))
            y = ph(g, "y", f32(3))
            x = ph(g, "x", i64(3))
            return (call(g, operator.mul, grad, y), call(g, operator.mul, grad, x))

        rejects(good_fwd(), module(build),
                re.escape("(c) saved 1: bwd placeholder x is int64[3], fwd saves float32[3]"))

    def test_gradient_for_integer_input(self) -> None:
        """(a) a gradient for an integer-tensor fwd input (it must be None)."""

        def fwd_build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(4))
            idx = ph(g, "idx", i64(2))
            out = call(g, operator.getitem, x, idx, val=f32(2))
            return ((out,), (idx,))

        def bwd_build(g: fx.Graph) -> Any:
            grad = ph(g, "g", f32(2))
            idx = ph(g, "idx", i64(2))
            gx = call(g, torch.zeros, 4, val=f32(4))
            return (gx, call(g, torch.ones_like, idx, val=i64(2)))

        rejects(module(fwd_build), module(bwd_build),
                re.escape("(a) bwd output 1 is a gradient for idx, an integer tensor (torch.int64); "
                          "it must be None"))

    def test_gradient_for_non_tensor_input(self) -> None:
        """(a) a gradient for a fwd input that is a Python int (a size, say)."""

        def fwd_build(g: fx.Graph) -> Any:
            x = ph(g, "x", f32(3))
            n = ph(g, "n", 3)
            return ((call(g, operator.mul, x, n, val=f32(3)),), (n,))

        def bwd_build(g: fx.Graph) -> Any:
            grad = ph(g, "g", f32(3))
            n = ph(g, "n", 3)
            return (call(g, operator.mul, grad, n, val=f32(3)), grad)

        rejects(module(fwd_build), module(bwd_build),
                re.escape("(a) bwd output 1 is a gradient for fwd input n, which is a int, not a tensor"))

    def test_gradient_of_lower_rank(self) -> None:
        """(a) a gradient with fewer dimensions than its input."""
        bwd = good_bwd(shape=(2, 3), returns=lambda g, grad, y, x: (
            call(g, torch.sum, grad, val=f32()), call(g, operator.mul, grad, x, val=f32(2, 3))))
        rejects(good_fwd((2, 3)), bwd,
                re.escape("(a) bwd output 0 has shape [], fwd input x has [2, 3]"))

    def test_every_problem_listed(self) -> None:
        """Several violations are all reported in one error."""

        def build(g: fx.Graph) -> Any:
            grad = ph(g, "g", f32(2))
            y = ph(g, "y", f32(5))
            ph(g, "x", f32(3))
            return (grad,)

        err = rejects(good_fwd(), module(build), re.escape("inconsistent in 3 place(s)"))
        text = str(err)
        assert "(a) bwd returns 1 values" in text
        assert "(b) grad input 0 (g)" in text
        assert "(c) saved 0: bwd placeholder y" in text

    def test_error_kinds(self) -> None:
        """The error is a MinihopError and a ValueError, with the shared message layout."""
        err = rejects(good_fwd(), good_bwd(grad_shape=(2,)), "MH401")
        assert isinstance(err, minihop.MinihopError) and isinstance(err, ValueError)
        assert "Why: " in str(err) and "What to do: " in str(err)

    def test_broken_dynamo_style_pair(self) -> None:
        """A minihop pair with one bwd output dropped is rejected."""
        cap = minihop.capture(_Mul, *_MINIHOP_CASES["mul"][1])
        bwd = fx.GraphModule(torch.nn.Module(), _drop_last_output(cap.bwd.graph))
        rejects(cap.fwd, bwd, re.escape("(a) bwd returns 1 values, expected one per fwd input (2: "))


def _drop_last_output(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph`` whose output tuple loses its last item."""
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        if node.op == "output":
            (value,) = node.args
            new.output(tuple(env[v] if isinstance(v, fx.Node) else v for v in value[:-1]))
        else:
            env[node] = new.node_copy(node, lambda n: env[n])
    return new
