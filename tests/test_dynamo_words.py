"""Graphs in the user's own words (issue 18): minihop's bodies equal Dynamo's strictly.

Each case is a Function whose forward and backward use one Python operator, method or torch
function the way a user writes it. Its capture must (1) match eager (outputs and every
input's grad) and (2) equal ``torch.compile(fullgraph=True)``'s ``fwd_body_0``/``bwd_body_0``
under ``assert_same_graph``'s strict default (node kind, target, operand order, constants,
shapes and dtypes): ``2 * x`` is ``operator.mul(2, x)``, ``x.mul(y)`` a method node, ``r += g``
``operator.iadd`` with later uses of ``r`` reading the tensor the user named.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx
from torch.autograd import Function

import minihop
from minihop.testing import assert_matches_eager, assert_same_graph, dynamo_graphs

Body = Callable[..., Any]


def make_function(name: str, fwd: Body, bwd: Body) -> type:
    """A Function that saves its inputs, runs ``fwd(*inputs)`` and ``bwd(*grads, *inputs)``."""

    class Case(Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> Any:
            ctx.save_for_backward(*inputs)
            out = fwd(*inputs)
            return out

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> Any:
            inputs = ctx.saved_tensors
            return bwd(*grads, *inputs)

    Case.__name__ = Case.__qualname__ = name
    return Case


def x8() -> torch.Tensor:
    return torch.rand(8, 8, requires_grad=True) + 0.5


def two() -> tuple[torch.Tensor, ...]:
    return (x8(), x8())


def one() -> tuple[torch.Tensor, ...]:
    return (x8(),)


def with_ints() -> tuple[torch.Tensor, ...]:
    # A float input that needs a grad (Dynamo captures a HOP only then) and an int tensor.
    return (x8(), torch.randint(1, 7, (8, 8)))


# --- forward and backward bodies, written as users write them -----------------------------

def scalar_left(x: torch.Tensor) -> torch.Tensor:
    r = 2 * x
    r2 = 1 + r
    return r2 - 3


def scalar_left_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return 2 * g


def reflected(x: torch.Tensor) -> torch.Tensor:
    d = x + 1
    return 1 - x + 3.0 / d


def reflected_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    d = x + 1
    return g * (-1 - 3.0 / (d * d))


def augmented(x: torch.Tensor) -> torch.Tensor:
    r = x.clone()
    r += x
    r *= 0.5
    r -= 1
    r /= 2
    return r


def augmented_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    r = g.clone()
    r *= 0.5
    return r


def invert(x: torch.Tensor, m: torch.Tensor) -> Any:
    keep = x > 1
    drop = ~keep
    return x * drop, m.clone()


def invert_bwd(g: torch.Tensor, gm: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> Any:
    keep = x > 1
    return g * ~keep, None


def power(x: torch.Tensor) -> torch.Tensor:
    return x ** 2 + 2 ** x


def power_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return g * (2 * x + 2 ** x * 0.6931471805599453)


def methods(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.mul(y).div(6.0).add(y).sub(x)


def methods_bwd(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Any:
    return g.mul(y).div(6.0).sub(g), g.mul(x).div(6.0).add(g)


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


def matmul_bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
    return g @ w.t(), x.t() @ g


def torch_functions(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.add(torch.mul(x, y), y, alpha=2)


def torch_functions_bwd(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Any:
    return torch.mul(g, y), torch.add(torch.mul(g, x), g, alpha=2)


def unary(x: torch.Tensor) -> torch.Tensor:
    return -x + abs(x) + x.neg()


def unary_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return -g + g * torch.sign(x) - g


def positive(x: torch.Tensor) -> torch.Tensor:
    return x * (+x)


def positive_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return 2 * g * (+x)


def floor_mod(x: torch.Tensor, y: torch.Tensor) -> Any:
    return x * 1 + (x // y) + (x % y) + 3 % x - 3 // x


def floor_mod_bwd(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Any:
    return g // 1 + g % 2, g * 0


def comparisons(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    both = (x < y) & (x <= 2) | (x > y) ^ (x >= 1)
    same = (x == y) | (2 == x) | (x != 0.5) | (0 < x)
    return x * both * same * x.gt(0)


def comparisons_bwd(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Any:
    return g * (x > 0) * (x != y), g * (g >= 0)


def bits(x: torch.Tensor, m: torch.Tensor) -> Any:
    k = (m & 3) | (m ^ 5)
    k = (k << 1) >> 2
    k = 1 << k
    return x * k, k


def bits_bwd(g: torch.Tensor, gk: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> Any:
    k = (m & 3) | (m ^ 5)
    k = (k << 1) >> 2
    k = 1 << k
    return g * k, None


def every_inplace_bit_op(m: torch.Tensor) -> torch.Tensor:
    # Called from forward and from backward (Dynamo inlines it in each, as minihop traces it).
    k = m.clone()
    k &= 6
    k |= 1
    k ^= 2
    k <<= 1
    k >>= 1
    k //= 2
    k %= 5
    return k


def inplace_bits(x: torch.Tensor, m: torch.Tensor) -> Any:
    k = every_inplace_bit_op(m)
    return x * k, k


def inplace_bits_bwd(g: torch.Tensor, gk: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> Any:
    return g * every_inplace_bit_op(m), None


def inplace_methods(x: torch.Tensor) -> torch.Tensor:
    r = x.clone()
    r.mul_(2)
    r.add_(1)
    return r * x


def inplace_methods_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    r = x.clone()
    r.mul_(4)
    r.add_(1)
    return g * r


def inplace_chain(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.mul_(2).add_(1)
    z = x.contiguous().mul(y)  # contiguous() returns x itself: only this expression reads it
    return z + x


def inplace_chain_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = g.clone()
    out.mul_(2).add_(x).sub_(x)
    return out * x + g


def inplace_through_python(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    torch.nn.functional.relu(y, inplace=True)  # a Python function: y, not its result, is read on
    return torch.nn.functional.gelu(y) + y


def inplace_through_python_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = g.clone()
    torch.nn.functional.hardtanh(out, inplace=True)
    return out * x


def out_argument(x: torch.Tensor) -> torch.Tensor:
    r = torch.empty_like(x)
    torch.mul(x, 2, out=r)
    return r + x


def out_argument_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    r = torch.empty_like(g)
    torch.mul(g, 3, out=r)
    return r


def matmul_assign(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    r = x.clone()
    r @= w
    return r


def matmul_assign_bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
    gx = g.clone()
    gx @= w.t()
    return gx, x.t() @ g


def unused_grad(x: torch.Tensor, y: torch.Tensor) -> Any:
    return x * y, x + y


def unused_grad_bwd(g: torch.Tensor, g2: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Any:
    return g * y, g * x  # g2 unused: its placeholder carries a shape and dtype, as Dynamo's


CASES: dict[str, tuple[Body, Body, Callable[[], tuple[torch.Tensor, ...]]]] = {
    "scalar_left": (scalar_left, scalar_left_bwd, one),
    "reflected": (reflected, reflected_bwd, one),
    "augmented_assignment": (augmented, augmented_bwd, one),
    "invert": (invert, invert_bwd, with_ints),
    "power": (power, power_bwd, one),
    "methods": (methods, methods_bwd, two),
    "matmul": (matmul, matmul_bwd, two),
    "torch_functions": (torch_functions, torch_functions_bwd, two),
    "unary": (unary, unary_bwd, one),
    "positive": (positive, positive_bwd, one),
    "inplace_chain": (inplace_chain, inplace_chain_bwd, one),
    "floor_mod": (floor_mod, floor_mod_bwd, two),
    "comparisons": (comparisons, comparisons_bwd, two),
    "bits": (bits, bits_bwd, with_ints),
    "inplace_bits": (inplace_bits, inplace_bits_bwd, with_ints),
    "inplace_methods": (inplace_methods, inplace_methods_bwd, one),
    "inplace_through_python": (inplace_through_python, inplace_through_python_bwd, one),
    "out_argument": (out_argument, out_argument_bwd, one),
    "matmul_assignment": (matmul_assign, matmul_assign_bwd, two),
    "unused_grad": (unused_grad, unused_grad_bwd, two),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bodies_equal_dynamos_strictly(name: str) -> None:
    fwd, bwd, make_args = CASES[name]
    fn_cls = make_function(name, fwd, bwd)
    torch.manual_seed(0)
    args = make_args()
    assert_matches_eager(fn_cls, *args)
    cap = minihop.capture(fn_cls, *args)
    dg = dynamo_graphs(fn_cls, *args)
    assert_same_graph(cap.fwd, dg.fwd, check_meta=True)
    assert_same_graph(cap.bwd, dg.bwd, check_meta=True)


class Augmented(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(w)
        r = x.clone()
        r += w
        r *= 0.5
        scaled = 2 * r
        return scaled

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        (w,) = ctx.saved_tensors
        g = grad_out.clone()
        g *= 0.5
        g += 0
        return 2 * g, 2 * g


def test_node_names_follow_dynamos() -> None:
    """Node names are Dynamo's too: the user's variables (``r``, then ``r_1`` after ``r += w``),
    the grad placeholder named after backward's parameter. (Input placeholders are named after
    the call's argument sources, which differ here: dynamo_graphs calls ``F.apply(*a)``.)"""
    args = two()
    assert_matches_eager(Augmented, *args)
    cap = minihop.capture(Augmented, *args)
    dg = dynamo_graphs(Augmented, *args)
    for mine, theirs in ((cap.fwd, dg.fwd), (cap.bwd, dg.bwd)):
        assert_same_graph(mine, theirs, check_meta=True)
        assert [n.name for n in mine.graph.nodes if n.op.startswith("call")] == \
            [n.name for n in theirs.graph.nodes if n.op.startswith("call")]
    grad_placeholder = [next(iter(gm.graph.nodes)).name for gm in (cap.bwd, dg.bwd)]
    assert grad_placeholder == ["grad_out", "grad_out"]


def test_printed_code_is_what_the_user_wrote() -> None:
    """``print(minihop.capture(F, x))`` shows ``2 * x``, ``r += g`` and ``~m``."""

    class Words(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            m = x > 1
            r = 2 * x
            r += g
            return r * ~m

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            return grad, grad

    text = str(minihop.capture(Words, x8(), x8()))
    assert '= 2 * l_x_' in text and 'r: "f32[8, 8]" = 2 * l_x_' in text
    assert 'r += l_g_;  r_1: "f32[8, 8]" = r' in text
    assert '= ~m' in text


def test_inplace_assignment_keeps_eager_aliasing() -> None:
    """``r += g`` stays in place on every call: the result is ``r`` itself, its version bumped."""

    class AddInto(Function):
        @staticmethod
        def forward(ctx: Any, r: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            r += g
            ctx.mark_dirty(r)
            return r

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            return grad, grad

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        leaf = torch.rand(4, requires_grad=True)
        return leaf.clone(), torch.rand(4, requires_grad=True)

    cap = minihop.capture(AddInto, *make())
    assert any(n.target is operator.iadd for n in cap.fwd.graph.nodes)
    r, g = make()
    before = r._version
    out = cap(r, g)
    assert out is r and r._version > before
    expected_r, expected_g = r.detach().clone(), g.detach().clone()
    out.sum().backward()
    torch.testing.assert_close(g.grad, torch.ones_like(expected_g))


def test_strict_is_the_default_and_normalize_is_documented() -> None:
    """``x * y`` against ``x.mul(y)``: different strictly, the same with ``normalize=True``;
    operand order counts in both modes."""

    def star(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b

    def method(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.mul(b)

    def swapped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return b * a

    with pytest.raises(AssertionError, match=r"-mul = _operator\.mul\(a, b\)\n\+mul = Tensor\.mul\(a, b\)"):
        assert_same_graph(fx.symbolic_trace(star), fx.symbolic_trace(method))
    assert_same_graph(fx.symbolic_trace(star), fx.symbolic_trace(method), normalize=True)
    for normalize in (False, True):
        with pytest.raises(AssertionError, match="graphs differ"):
            assert_same_graph(fx.symbolic_trace(star), fx.symbolic_trace(swapped), normalize=normalize)
    assert "normalize=True" in (assert_same_graph.__doc__ or "")


def test_unused_grad_placeholder_without_materialized_grads() -> None:
    """With ``set_materialize_grads(False)`` backward is still traced with a tensor for each
    grad (as Dynamo traces it); one it only tests against None carries the output's shape and
    dtype, as Dynamo's placeholder does."""

    class SeesNone(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> Any:
            ctx.set_materialize_grads(False)
            idx = x.argmax()
            ctx.mark_non_differentiable(idx)
            return x * 2, idx

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor, g_idx: Any) -> torch.Tensor:
            return g * 2 if g_idx is None else g * 2 + 1

    x = x8()
    assert_matches_eager(SeesNone, x)
    cap = minihop.capture(SeesNone, x)
    dg = dynamo_graphs(SeesNone, x)
    assert_same_graph(cap.bwd, dg.bwd, check_meta=True)
    unused = [n for n in cap.bwd.graph.nodes if n.op == "placeholder"][1]
    assert unused.name == "unused_0" and unused.meta["val"].dtype == torch.int64


# --- where minihop's words still differ from Dynamo's (docs/oracle.md) ----------------------
# Every Function the suite hands to assert_matches_eager is compared with Dynamo's bodies by the
# sweep (tests/dynamo_sweep.py); these pin docs/oracle.md's listed differences one by one.

def two_names(x: torch.Tensor) -> torch.Tensor:
    r = x.clone()
    z = r.mul_(2)
    return z + r


def two_names_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return 4 * g


def dunder_by_name(x: torch.Tensor) -> torch.Tensor:
    return x.__mul__(3)


def dunder_by_name_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return 3 * g


@pytest.mark.parametrize("name,fwd,bwd", [("two_names", two_names, two_names_bwd),
                                          ("dunder_by_name", dunder_by_name, dunder_by_name_bwd)])
def test_readme_known_differences_in_words(name: str, fwd: Body, bwd: Body) -> None:
    """docs/oracle.md's "Where minihop's words still differ": right values and grads, forward
    written differently from Dynamo's (equal up to spelling for the dunder). If one starts to
    agree, drop its line there."""
    fn_cls = make_function(name, fwd, bwd)
    args = one()
    assert_matches_eager(fn_cls, *args)
    cap = minihop.capture(fn_cls, *args)
    dg = dynamo_graphs(fn_cls, *args)
    with pytest.raises(AssertionError, match="graphs differ"):
        assert_same_graph(cap.fwd, dg.fwd)
    assert_same_graph(cap.bwd, dg.bwd, check_meta=True)
    if name == "dunder_by_name":
        assert_same_graph(cap.fwd, dg.fwd, normalize=True)


def property_in_backward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def property_in_backward_bwd(g: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    return g @ b.mT, a.mT @ g


def test_readme_known_difference_property_of_a_saved_input() -> None:
    """``b.mT`` in backward on a saved input: Dynamo computes it in its outer graph from the
    argument and hands it to both bodies as an extra input (saved by fwd, grad None); minihop
    computes it in backward from the saved tensor, as eager's backward does."""
    fn_cls = make_function("property_in_backward", property_in_backward, property_in_backward_bwd)
    args = two()
    assert_matches_eager(fn_cls, *args)
    cap = minihop.capture(fn_cls, *args)
    dg = dynamo_graphs(fn_cls, *args)

    def placeholders(gm: fx.GraphModule) -> list[fx.Node]:
        return [n for n in gm.graph.nodes if n.op == "placeholder"]

    assert len(placeholders(dg.fwd)) == len(placeholders(cap.fwd)) + 2
    assert [n.target for n in dg.outer.graph.nodes if n.target is getattr] == [getattr, getattr]
    assert [n.args[1] for n in cap.bwd.graph.nodes if n.target is getattr] == ["mT", "mT"]
    assert len(dg.bwd.graph.output_node().args[0]) == len(cap.bwd.graph.output_node().args[0]) + 2


def integer_argument(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return x * m


def integer_argument_bwd(g: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> Any:
    return g * m, torch.zeros(g.shape)


def test_readme_known_difference_grad_for_an_integer_argument() -> None:
    """backward returns a tensor for an integer argument: eager drops it, and DESIGN's contract
    (a) has bwd give None there; Dynamo's bwd returns the user's tensor. Both compute it."""
    fn_cls = make_function("integer_argument", integer_argument, integer_argument_bwd)
    args = with_ints()
    assert_matches_eager(fn_cls, *args)
    cap = minihop.capture(fn_cls, *args)
    dg = dynamo_graphs(fn_cls, *args)
    assert_same_graph(cap.fwd, dg.fwd, check_meta=True)
    mine, theirs = (gm.graph.output_node().args[0] for gm in (cap.bwd, dg.bwd))
    assert mine[1] is None and isinstance(theirs[1], fx.Node) and theirs[1].target is torch.zeros
    assert [n.target for n in cap.bwd.graph.nodes if n.op == "call_function"] == \
        [n.target for n in dg.bwd.graph.nodes if n.op == "call_function"]


NO_SOURCE = """
class NoSource(Function):
    @staticmethod
    def forward(ctx, x):
        r = x.clone()
        r.mul_(2)
        return r + 1

    @staticmethod
    def backward(ctx, g):
        return 2 * g
"""


def test_readme_known_difference_code_without_a_source_file() -> None:
    """A Function exec'd from a string: minihop cannot read the statement ``r.mul_(2)``, so the
    in-place result rebinds ``r`` (``r + 1`` reads the write's node; Dynamo's reads the clone)."""
    namespace: dict[str, Any] = {"__name__": "no_source_file", "Function": Function}
    exec(compile(NO_SOURCE, "<no source file>", "exec"), namespace)  # noqa: S102
    fn_cls, args = namespace["NoSource"], one()
    assert_matches_eager(fn_cls, *args)
    cap = minihop.capture(fn_cls, *args)
    dg = dynamo_graphs(fn_cls, *args)
    with pytest.raises(AssertionError, match=r"\n-outs = _operator.add\(r, 1\)    \[%4 = _operator.add\(%3, 1\)\]\n.*\n\+outs = _operator.add\(r, 1\)    \[%4 = _operator.add\(%2, 1\)\]\n"):
        assert_same_graph(cap.fwd, dg.fwd)
    assert_same_graph(cap.bwd, dg.bwd, check_meta=True)


def test_operator_slots_outside_a_trace_are_torchs() -> None:
    """After a capture, torch.Tensor's operators (which carry minihop's thin wrapper from the
    first trace on) give eager's results, errors and NotImplemented fallbacks unchanged."""
    minihop.capture(make_function("Scalar", scalar_left, scalar_left_bwd), x8())
    x, m = torch.arange(1.0, 5.0), torch.tensor([1, 2, 3, 4])

    class Other:
        def __rmul__(self, other: Any) -> str:
            return "other"

    assert torch.equal(2 * x, torch.tensor([2.0, 4.0, 6.0, 8.0]))
    assert torch.equal(~m, torch.tensor([-2, -3, -4, -5])) and torch.equal(-x, x.neg())
    assert torch.equal(abs(-x), x) and torch.equal(3 % x, torch.tensor([0.0, 1.0, 0.0, 3.0]))
    r = x.clone()
    r += 1
    assert torch.equal(r, x + 1) and r._version == 1
    assert x * Other() == "other"
    with pytest.raises(TypeError):
        x @ "a"  # type: ignore[operator]
