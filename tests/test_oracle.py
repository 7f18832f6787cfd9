"""minihop as a reference oracle (issue 5): ``minihop.trace``, ``minihop.ops``, the testing
helpers, artifacts, the pytest plugin and ``python -m minihop show``.

Graph goldens are derived by hand from the seed's expected outer graphs
(``/work/shared/seed/pytorch_autograd_function_rewire.diff``), never pasted from minihop's own
output. Every run is compared with eager PyTorch: outputs, ``requires_grad`` and every
``.grad``. The three checks that need a fresh interpreter (artifact loading, the plugin in a
separate project, the CLI) each run one subprocess, started together with the module.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch.autograd import Function

import minihop
from minihop.runtime.capture import readable
from minihop.testing import assert_same_graph, clone_args, dynamo_graphs
from test_seed_graphs import (
    AliasingOutput,
    LinearFunction,
    MarkNonDifferentiable,
    MySin,
    RewiredBwdOutput,
    UdfOutput,
    UserDefinedObjectAsInput,
    linear_args,
    mark_non_differentiable_args,
    one_8x8_arg,
    rewired_bwd_output_args,
    two_8x8_args,
    user_defined_object_args,
)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def r(*shape: int, grad: bool = True, seed: int = 0) -> torch.Tensor:
    """A random float32 leaf, reproducible."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


def tensors(value: Any) -> list[torch.Tensor]:
    """Tensors inside tuples, lists, dicts and objects, in structure order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return [t for v in vars(value).values() for t in tensors(v)]
    return []


def weighted_loss(outputs: list[torch.Tensor], differentiable: list[bool]) -> torch.Tensor | None:
    """Sum of each selected output times fixed random weights (the same weights on both sides)."""
    total: torch.Tensor | None = None
    for i, (out, use) in enumerate(zip(outputs, differentiable, strict=True)):
        if use:
            w = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + i))
            term = (out * w).sum()
            total = term if total is None else total + term
    return total


def assert_grads_equal(eager_args: Any, other_args: Any) -> None:
    """Every tensor reachable from the arguments has the same ``.grad`` (or None) on both sides."""
    eager_t, other_t = tensors(eager_args), tensors(other_args)
    assert len(eager_t) == len(other_t)
    for i, (e, o) in enumerate(zip(eager_t, other_t, strict=True)):
        assert (e.grad is None) == (o.grad is None), (
            f"tensor {i} of the arguments: eager grad {'None' if e.grad is None else 'set'}, "
            f"other {'None' if o.grad is None else 'set'}")
        if e.grad is not None:
            torch.testing.assert_close(o.grad, e.grad, msg=lambda s: f"grad of argument tensor {i}: {s}")


def outer_text(gm: fx.GraphModule) -> str:
    """``readable(gm)`` up to the first nested class: the outer graph alone."""
    return readable(gm).partition("\n    class fwd_body_")[0].rstrip("\n")


def golden(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def apply_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and getattr(n.target, "__name__", "") == "autograd_function_apply"]


def assert_trace_runs_like_eager(fn: Callable[..., Any], gm: fx.GraphModule, args: tuple[Any, ...],
                                 gm_inputs: Callable[[tuple[Any, ...]], tuple[torch.Tensor, ...]]) -> None:
    """``gm(*inputs)`` and eager ``fn(*args)`` on separate clones: outputs, requires_grad, every grad."""
    eager_args, traced_args = clone_args(args), clone_args(args)
    eager_out = tensors(fn(*eager_args))
    traced_out = tensors(gm(*gm_inputs(traced_args)))
    assert len(traced_out) == len(eager_out)
    for i, (e, t) in enumerate(zip(eager_out, traced_out, strict=True)):
        torch.testing.assert_close(t, e, msg=lambda s: f"output {i}: {s}")
        assert t.requires_grad == e.requires_grad, f"output {i}: requires_grad eager={e.requires_grad} traced={t.requires_grad}"
    flags = [e.requires_grad for e in eager_out]
    eager_loss, traced_loss = weighted_loss(eager_out, flags), weighted_loss(traced_out, flags)
    assert eager_loss is not None and traced_loss is not None
    eager_loss.backward()
    traced_loss.backward()
    assert_grads_equal(eager_args, traced_args)


# ---------------------------------------------------------------------------------------------
# minihop.trace: the seed's outer graphs
# ---------------------------------------------------------------------------------------------
# Each golden is the seed's expected outer graph with, as the only differences, the
# `saved_for_backward_idx = [...]` keyword torch 2.13 prints on the apply call, a function
# returning one tensor returning it (`return add` where Dynamo's graph returns `(add,)` for its
# bytecode to unpack: minihop.trace returns what the function returns, as torch.fx's
# symbolic_trace does), and the ones noted beside it.

def fn_rewired_bwd_output(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = RewiredBwdOutput.apply(torch.cos(x), torch.cos(y))
    return z[0] + z[1]


# Seed test_rewired_bwd_output, static shapes: the seed marks dim 0 dynamic; without that the
# size symbols s77/s17 leave the placeholders and the apply call, `[s17, 8]` becomes `[8, 8]`,
# and saved_for_backward_idx indexes (a, cos, result) as [0, 1, 2]. The seed names the two
# torch.cos results `arg`/`arg_1` (Dynamo's name for the values bound to Function.apply's
# `*args`); minihop names nodes after their op, `cos`/`cos_1`. Everything else is the seed's,
# including the layout: the cos calls and the apply's nodes come from one source line
# (`z = Add.apply(...)`), so no blank line separates them.
REWIRED_BWD_OUTPUT_OUTER = golden('''
    class GraphModule(torch.nn.Module):
        def forward(self, L_x_: "f32[8, 8]", L_y_: "f32[8, 8]"):
            l_x_ = L_x_
            l_y_ = L_y_

            cos: "f32[8, 8]" = torch.cos(l_x_);  l_x_ = None
            cos_1: "f32[8, 8]" = torch.cos(l_y_);  l_y_ = None
            fwd_body_0 = self.fwd_body_0
            bwd_body_0 = self.bwd_body_0
            autograd_function_apply = torch.ops.higher_order.autograd_function_apply(fwd_body_0, bwd_body_0, cos, cos_1, non_differentiable_idx = [], saved_for_backward_idx = [0, 1, 2]);  fwd_body_0 = bwd_body_0 = cos = cos_1 = None
            getitem: "f32[8, 8]" = autograd_function_apply[0]
            getitem_1: "f32[8, 8]" = autograd_function_apply[1];  autograd_function_apply = None

            add: "f32[8, 8]" = getitem + getitem_1;  getitem = getitem_1 = None
            return add
    ''')


def fn_udf_output(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = UdfOutput.apply(x, y)
    return z[0].a + z[0].b + z[1]


# Seed test_udf_output, unchanged but for saved_for_backward_idx.
UDF_OUTPUT_OUTER = golden('''
    class GraphModule(torch.nn.Module):
        def forward(self, L_x_: "f32[8, 8]", L_y_: "f32[8, 8]"):
            l_x_ = L_x_
            l_y_ = L_y_

            fwd_body_0 = self.fwd_body_0
            bwd_body_0 = self.bwd_body_0
            autograd_function_apply = torch.ops.higher_order.autograd_function_apply(fwd_body_0, bwd_body_0, l_x_, l_y_, non_differentiable_idx = [], saved_for_backward_idx = []);  fwd_body_0 = bwd_body_0 = l_x_ = l_y_ = None
            getitem: "f32[8, 8]" = autograd_function_apply[0]
            getitem_1: "f32[8, 8]" = autograd_function_apply[1]
            getitem_2: "f32[8, 8]" = autograd_function_apply[2];  autograd_function_apply = None

            add: "f32[8, 8]" = getitem + getitem_1;  getitem = getitem_1 = None
            add_1: "f32[8, 8]" = add + getitem_2;  add = getitem_2 = None
            return add_1
    ''')


def fn_aliasing_output(x: torch.Tensor) -> torch.Tensor:
    y = AliasingOutput.apply(x)
    if y is x:
        return torch.cos(y)
    return torch.sin(y)


# Seed test_aliasing_output. The seed names the apply's output `y`, the user's local variable
# (Dynamo reads it from the bytecode); minihop does not see local names, so it is `getitem`.
ALIASING_OUTPUT_OUTER = golden('''
    class GraphModule(torch.nn.Module):
        def forward(self, L_x_: "f32[8, 8]"):
            l_x_ = L_x_

            fwd_body_0 = self.fwd_body_0
            bwd_body_0 = self.bwd_body_0
            autograd_function_apply = torch.ops.higher_order.autograd_function_apply(fwd_body_0, bwd_body_0, l_x_, non_differentiable_idx = [], saved_for_backward_idx = []);  fwd_body_0 = bwd_body_0 = l_x_ = None
            getitem: "f32[8, 8]" = autograd_function_apply[0];  autograd_function_apply = None

            sin: "f32[8, 8]" = torch.sin(getitem);  getitem = None
            return sin
    ''')


def fn_user_defined_object(x: torch.Tensor, weird: Any, z: torch.Tensor) -> torch.Tensor:
    return UserDefinedObjectAsInput.apply(x, weird, z)


# Seed test_user_defined_object_as_input (the seed's `f(x, weird, z)`): the apply call and
# getitem are the seed's lines. The seed hides the signature (unchanged context); minihop lists
# inputs in order of first use, which here is the apply call's order, so the lifted
# weird.b/weird.c come first. (Dynamo lists the arguments it loads first: L_x_, L_z_, then the
# lifted L_weird_b, L_weird_c; lifted inputs may be ordered differently.)
USER_DEFINED_OBJECT_OUTER = golden('''
    class GraphModule(torch.nn.Module):
        def forward(self, L_weird_b: "f32[]", L_weird_c: "f32[]", L_x_: "f32[]", L_z_: "f32[]"):
            l_weird_b = L_weird_b
            l_weird_c = L_weird_c
            l_x_ = L_x_
            l_z_ = L_z_

            fwd_body_0 = self.fwd_body_0
            bwd_body_0 = self.bwd_body_0
            autograd_function_apply = torch.ops.higher_order.autograd_function_apply(fwd_body_0, bwd_body_0, l_weird_b, l_weird_c, l_x_, l_z_, non_differentiable_idx = [], saved_for_backward_idx = [0, 1]);  fwd_body_0 = bwd_body_0 = l_weird_b = l_weird_c = l_x_ = l_z_ = None
            getitem: "f32[]" = autograd_function_apply[0];  autograd_function_apply = None
            return getitem
    ''')


def fn_mark_non_differentiable(x: torch.Tensor, y: torch.Tensor) -> Any:
    return MarkNonDifferentiable.apply(x, y)


# Seed test_mark_non_differentiable; the signature is hidden context: fn(x, y) on two scalars.
MARK_NON_DIFFERENTIABLE_OUTER = golden('''
    class GraphModule(torch.nn.Module):
        def forward(self, L_x_: "f32[]", L_y_: "f32[]"):
            l_x_ = L_x_
            l_y_ = L_y_

            fwd_body_0 = self.fwd_body_0
            bwd_body_0 = self.bwd_body_0
            autograd_function_apply = torch.ops.higher_order.autograd_function_apply(fwd_body_0, bwd_body_0, l_x_, l_y_, non_differentiable_idx = [1], saved_for_backward_idx = []);  fwd_body_0 = bwd_body_0 = l_x_ = l_y_ = None
            getitem: "f32[]" = autograd_function_apply[0]
            getitem_1: "f32[]" = autograd_function_apply[1];  autograd_function_apply = None
            return (getitem, getitem_1)
    ''')


def fn_three_applies(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = MySin.apply(x)
    b = MySin.apply(a)
    c, d = MarkNonDifferentiable.apply(b, y)
    return c * 2, d


# By hand, in the seed's layout: one get_attr pair, apply call and getitems per application,
# numbered in order (the same Function applied twice gets two body pairs); each statement of
# the function is its own source line, so a blank line separates them.
THREE_APPLIES_OUTER = golden('''
    class GraphModule(torch.nn.Module):
        def forward(self, L_x_: "f32[8, 8]", L_y_: "f32[8, 8]"):
            l_x_ = L_x_
            l_y_ = L_y_

            fwd_body_0 = self.fwd_body_0
            bwd_body_0 = self.bwd_body_0
            autograd_function_apply = torch.ops.higher_order.autograd_function_apply(fwd_body_0, bwd_body_0, l_x_, non_differentiable_idx = [], saved_for_backward_idx = [0]);  fwd_body_0 = bwd_body_0 = l_x_ = None
            getitem: "f32[8, 8]" = autograd_function_apply[0];  autograd_function_apply = None

            fwd_body_1 = self.fwd_body_1
            bwd_body_1 = self.bwd_body_1
            autograd_function_apply_1 = torch.ops.higher_order.autograd_function_apply(fwd_body_1, bwd_body_1, getitem, non_differentiable_idx = [], saved_for_backward_idx = [0]);  fwd_body_1 = bwd_body_1 = getitem = None
            getitem_1: "f32[8, 8]" = autograd_function_apply_1[0];  autograd_function_apply_1 = None

            fwd_body_2 = self.fwd_body_2
            bwd_body_2 = self.bwd_body_2
            autograd_function_apply_2 = torch.ops.higher_order.autograd_function_apply(fwd_body_2, bwd_body_2, getitem_1, l_y_, non_differentiable_idx = [1], saved_for_backward_idx = []);  fwd_body_2 = bwd_body_2 = getitem_1 = l_y_ = None
            getitem_2: "f32[8, 8]" = autograd_function_apply_2[0]
            getitem_3: "f32[8, 8]" = autograd_function_apply_2[1];  autograd_function_apply_2 = None

            mul: "f32[8, 8]" = getitem_2 * 2;  getitem_2 = None
            return (mul, getitem_3)
    ''')


class LinearModule(torch.nn.Module):
    """A module applying the seed's LinearFunction to its input and its own weight."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3, generator=torch.Generator().manual_seed(7)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LinearFunction.apply(x, self.weight).relu()


# By hand: the parameter is an attribute of the GraphModule (a get_attr named after it) rather
# than Dynamo's lifted `L_self_parameters_weight_` input; the rest is the seed's layout, all on
# the one source line of forward's return.
LINEAR_MODULE_OUTER = golden('''
    class GraphModule(torch.nn.Module):
        def forward(self, L_x_: "f32[5, 3]"):
            l_x_ = L_x_

            weight: "f32[4, 3]" = self.weight
            fwd_body_0 = self.fwd_body_0
            bwd_body_0 = self.bwd_body_0
            autograd_function_apply = torch.ops.higher_order.autograd_function_apply(fwd_body_0, bwd_body_0, weight, l_x_, non_differentiable_idx = [], saved_for_backward_idx = [0, 1]);  fwd_body_0 = bwd_body_0 = weight = l_x_ = None
            getitem: "f32[5, 4]" = autograd_function_apply[0];  autograd_function_apply = None
            relu: "f32[5, 4]" = getitem.relu();  getitem = None
            return relu
    ''')


class ParameterOnlyModule(torch.nn.Module):
    """A module applying a Function to nothing but its own parameter (PyTorch's LowerBound test shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(8)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + MySin.apply(self.gamma)


_GLOBAL_WEIGHT = torch.randn(4, 3, generator=torch.Generator().manual_seed(25))


def fn_linear_with_global_weight(x: torch.Tensor) -> torch.Tensor:
    return LinearFunction.apply(x, _GLOBAL_WEIGHT)


def assert_module_trace_matches_eager(module: torch.nn.Module, gm: fx.GraphModule, x: torch.Tensor) -> None:
    """Run eager ``module(x)`` and ``gm(x)``: same output, same input grad, same parameter grads."""
    params = list(module.parameters())
    x_eager, x_traced = clone_args((x,))[0], clone_args((x,))[0]
    eager_out = module(x_eager)
    (eager_out * 1.5).sum().backward()
    eager_param_grads = [p.grad.clone() for p in params]
    module.zero_grad(set_to_none=True)
    traced_out = gm(x_traced)
    torch.testing.assert_close(traced_out, eager_out)
    (traced_out * 1.5).sum().backward()
    torch.testing.assert_close(x_traced.grad, x_eager.grad)
    for p, expected in zip(params, eager_param_grads, strict=True):
        assert p.grad is not None, "the parameter got no gradient through the traced module"
        torch.testing.assert_close(p.grad, expected, msg=lambda s: f"parameter grad: {s}")


class TestTrace:
    def test_rewired_bwd_output_outer_graph(self) -> None:
        """The seed's test_rewired_bwd_output fn: outer ops before and after the apply call, in the seed's layout."""
        x, y = r(8, 8, seed=1), r(8, 8, seed=2)
        gm = minihop.trace(fn_rewired_bwd_output, x, y)
        assert outer_text(gm) == REWIRED_BWD_OUTPUT_OUTER

    def test_rewired_bwd_output_runs_like_eager(self) -> None:
        """The traced test_rewired_bwd_output fn gives eager's output and grads of x and y."""
        args = (r(8, 8, seed=1), r(8, 8, seed=2))
        gm = minihop.trace(fn_rewired_bwd_output, *args)
        assert gm.meta["minihop_inputs"] == ["x", "y"]
        assert_trace_runs_like_eager(fn_rewired_bwd_output, gm, args, lambda a: a)

    def test_udf_output_outer_graph(self) -> None:
        """The seed's test_udf_output fn: a user object's tensors come out as getitems used by the outer adds."""
        gm = minihop.trace(fn_udf_output, *two_8x8_args())
        assert outer_text(gm) == UDF_OUTPUT_OUTER

    def test_udf_output_runs_like_eager(self) -> None:
        """The traced test_udf_output fn gives eager's output and grads."""
        args = two_8x8_args()
        gm = minihop.trace(fn_udf_output, *args)
        assert_trace_runs_like_eager(fn_udf_output, gm, args, lambda a: a)

    def test_aliasing_output_outer_graph(self) -> None:
        """The seed's test_aliasing_output fn: the apply's output is not the input object, so sin is taken."""
        gm = minihop.trace(fn_aliasing_output, *one_8x8_arg())
        assert outer_text(gm) == ALIASING_OUTPUT_OUTER

    def test_aliasing_output_runs_like_eager(self) -> None:
        """The traced test_aliasing_output fn gives eager's output (the sin branch) and grad."""
        args = one_8x8_arg()
        gm = minihop.trace(fn_aliasing_output, *args)
        assert_trace_runs_like_eager(fn_aliasing_output, gm, args, lambda a: a)

    def test_user_defined_object_outer_graph(self) -> None:
        """The seed's f(x, weird, z): weird.b and weird.c are lifted inputs passed to the apply call first."""
        gm = minihop.trace(fn_user_defined_object, *user_defined_object_args())
        assert outer_text(gm) == USER_DEFINED_OBJECT_OUTER
        assert gm.meta["minihop_inputs"] == ["weird.b", "weird.c", "x", "z"]

    def test_user_defined_object_runs_like_eager(self) -> None:
        """The traced f(x, weird, z) gives eager's output, grads for x and z, and none for weird.b."""
        args = user_defined_object_args()
        gm = minihop.trace(fn_user_defined_object, *args)
        assert_trace_runs_like_eager(fn_user_defined_object, gm, args, lambda a: (a[1].b, a[1].c, a[0], a[2]))

    def test_mark_non_differentiable_outer_graph(self) -> None:
        """The seed's test_mark_non_differentiable fn: non_differentiable_idx = [1] on the apply call."""
        gm = minihop.trace(fn_mark_non_differentiable, *mark_non_differentiable_args())
        assert outer_text(gm) == MARK_NON_DIFFERENTIABLE_OUTER

    def test_mark_non_differentiable_runs_like_eager(self) -> None:
        """The traced fn gives eager's outputs, the second not requiring grad, and eager's grads."""
        args = mark_non_differentiable_args()
        gm = minihop.trace(fn_mark_non_differentiable, *args)
        assert_trace_runs_like_eager(fn_mark_non_differentiable, gm, args, lambda a: a)

    def test_apply_nodes_carry_the_users_source_line(self) -> None:
        """Every node recorded for an F.apply call points at the user's line, as the seed's Dynamo graphs do."""
        gm = minihop.trace(fn_rewired_bwd_output, r(8, 8, seed=1), r(8, 8, seed=2))
        for node in gm.graph.nodes:
            if node.op in ("get_attr", "call_function") and node.name != "add":
                trace = node.meta.get("stack_trace") or ""
                assert "z = RewiredBwdOutput.apply(torch.cos(x), torch.cos(y))" in trace, (
                    f"{node.name} ({node.op}) has no stack trace of the user's apply line: {trace!r}")

    def test_two_functions_and_one_twice_outer_graph(self) -> None:
        """Three applications (MySin twice, then MarkNonDifferentiable) get fwd_body_0/1/2 and their own apply calls."""
        gm = minihop.trace(fn_three_applies, r(8, 8, seed=3), r(8, 8, seed=4))
        assert outer_text(gm) == THREE_APPLIES_OUTER
        names = [name for name, _ in gm.named_children()]
        assert names == ["fwd_body_0", "bwd_body_0", "fwd_body_1", "bwd_body_1", "fwd_body_2", "bwd_body_2"]
        # The two MySin applications are separate body pairs computing the same thing.
        assert_same_graph(gm.fwd_body_0, gm.fwd_body_1, check_meta=True)
        assert_same_graph(gm.bwd_body_0, gm.bwd_body_1, check_meta=True)
        for i in range(3):
            minihop.check_consistent(getattr(gm, f"fwd_body_{i}"), getattr(gm, f"bwd_body_{i}"))

    def test_two_functions_and_one_twice_run_like_eager(self) -> None:
        """The traced three-application function gives eager's outputs and grads."""
        args = (r(8, 8, seed=3), r(8, 8, seed=4))
        gm = minihop.trace(fn_three_applies, *args)
        assert_trace_runs_like_eager(fn_three_applies, gm, args, lambda a: a)

    def test_module_applying_function_to_input_and_parameter(self) -> None:
        """An nn.Module calling LinearFunction.apply(x, self.weight): the weight is an attribute and gets eager's grad."""
        module = LinearModule()
        x = r(5, 3, seed=5)
        gm = minihop.trace(module, x)
        assert outer_text(gm) == LINEAR_MODULE_OUTER
        assert gm.weight is module.weight
        assert_module_trace_matches_eager(module, gm, x)

    def test_closed_over_tensor_passed_to_apply(self) -> None:
        """A module-level tensor passed straight to F.apply is an attribute of the graph, and the trace matches eager."""
        x = r(5, 3, seed=24)
        gm = minihop.trace(fn_linear_with_global_weight, x)
        (call,) = apply_nodes(gm)
        weight = call.args[2]  # LinearFunction's fwd inputs are (weight, x): backward reads weight first
        assert weight.op == "get_attr" and getattr(gm, weight.target) is _GLOBAL_WEIGHT
        assert_trace_runs_like_eager(fn_linear_with_global_weight, gm, (x,), lambda a: a)

    def test_module_applying_function_to_parameter_only(self) -> None:
        """An nn.Module calling MySin.apply(self.gamma): the custom backward is used, so gamma gets eager's grad."""
        module = ParameterOnlyModule()
        x = r(8, 8, seed=6)
        gm = minihop.trace(module, x)
        assert_module_trace_matches_eager(module, gm, x)
        (call,) = apply_nodes(gm)
        assert [a.target for a in call.args[2:]] == ["gamma"]


# ---------------------------------------------------------------------------------------------
# minihop.ops.autograd_function_apply: Dynamo's bodies and minihop's, against eager
# ---------------------------------------------------------------------------------------------

def _half(t: torch.Tensor) -> torch.Tensor:
    return t * 0.5


_SHIFT = torch.linspace(-1.0, 1.0, 4)


def _make_closure_function() -> type:
    scale = 3.0
    shift = _SHIFT

    class ClosureAffine(Function):
        """Reads a closed-over float, a closed-over tensor and a helper function."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return _half(x) * scale + shift

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            return _half(g) * scale + x * 0

    return ClosureAffine


ClosureAffine = _make_closure_function()


class NoneGradForInput(Function):
    """Backward returns None for a tensor input that requires grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(y)
        return x.clone() * y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (y,) = ctx.saved_tensors
        return grad * y, None


class TensorListInput(Function):
    """Tensors inside a list argument are lifted and get no gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tl: list[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(tl[0], tl[1])
        return x.clone() * (tl[0] + tl[1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        tl0, tl1 = ctx.saved_tensors
        return grad * (tl0 + tl1), None


class ScaleByNumber(Function):
    """A Python number argument kept on ctx."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, k: float) -> torch.Tensor:
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return g * ctx.k, None


class IntermediateOnCtx(Function):
    """An intermediate kept as a ctx attribute next to a save_for_backward'd input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        s = x.exp()
        ctx.s = s
        ctx.save_for_backward(y)
        return s * y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (y,) = ctx.saved_tensors
        return g * ctx.s * y, g * ctx.s


class ValueAndIndex(Function):
    """An integer output marked non-differentiable next to a float one."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = x.argmax(dim=1)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(x)
        return x.tanh(), idx

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, g_idx: Any) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * (1 - x.tanh() ** 2)


class CubeSavesOutput(Function):
    """Saves its input and its output; backward reads both."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x ** 3
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        x, y = ctx.saved_tensors
        return g * 3 * y / x


class MulTwoInplace(Function):
    """mark_dirty on an input changed in place (Dynamo 2.13 refuses it; minihop's pair only)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


@dataclasses.dataclass(frozen=True)
class OpCase:
    fn_cls: type
    make_args: Callable[[], tuple[Any, ...]]
    # The pair's inputs pulled out of the arguments by hand, in the apply call's order.
    op_inputs: Callable[[tuple[Any, ...]], tuple[torch.Tensor, ...]]


OP_CASES: dict[str, OpCase] = {
    "single_output_saved_input": OpCase(MySin, one_8x8_arg, lambda a: a),
    "multi_output_saved_input_intermediate_output": OpCase(RewiredBwdOutput, two_8x8_args, lambda a: a),
    "user_object_output": OpCase(UdfOutput, two_8x8_args, lambda a: a),
    "mark_non_differentiable": OpCase(MarkNonDifferentiable, mark_non_differentiable_args, lambda a: a),
    "lifted_object_inputs_none_grads": OpCase(UserDefinedObjectAsInput, user_defined_object_args,
                                              lambda a: (a[1].b, a[1].c, a[0], a[2])),
    "saved_in_backward_read_order": OpCase(LinearFunction, linear_args, lambda a: (a[1], a[0])),
    "returns_its_input": OpCase(AliasingOutput, one_8x8_arg, lambda a: a),
    "closure_values": OpCase(ClosureAffine, lambda: (r(4, seed=9),), lambda a: (a[0], _SHIFT)),
    "none_grad_for_tensor_input": OpCase(NoneGradForInput, lambda: (r(3, seed=10), r(3, seed=11)), lambda a: a),
    "tensor_list_input": OpCase(TensorListInput, lambda: (r(3, seed=12), [r(3, seed=13), r(3, seed=14)]),
                                lambda a: (a[0], a[1][0], a[1][1])),
    "number_argument": OpCase(ScaleByNumber, lambda: (r(3, seed=15), 2.5), lambda a: (a[0],)),
    "intermediate_on_ctx": OpCase(IntermediateOnCtx, lambda: (r(3, seed=16), r(3, seed=17)), lambda a: a),
    "integer_output_non_differentiable": OpCase(ValueAndIndex, lambda: (r(3, 4, seed=18),), lambda a: a),
    "saves_output": OpCase(CubeSavesOutput, lambda: (r(3, seed=19),), lambda a: a),
}


def dynamo_apply_kwargs(outer: fx.GraphModule) -> dict[str, Any]:
    """The keyword arguments of the single autograd_function_apply call in Dynamo's outer graph."""
    (call,) = apply_nodes(outer)
    return dict(call.kwargs)


def assert_op_matches_eager(case: OpCase, fwd: fx.GraphModule, bwd: fx.GraphModule,
                            kwargs: dict[str, Any]) -> None:
    """``minihop.ops.autograd_function_apply(fwd, bwd, ...)`` against eager ``F.apply``: outputs and every grad."""
    args = case.make_args()
    eager_args, op_args = clone_args(args), clone_args(args)
    eager_out = tensors(case.fn_cls.apply(*eager_args))
    op_out = minihop.ops.autograd_function_apply(fwd, bwd, *case.op_inputs(op_args), **kwargs)
    assert isinstance(op_out, tuple) and len(op_out) == len(eager_out)
    for i, (e, o) in enumerate(zip(eager_out, op_out, strict=True)):
        torch.testing.assert_close(o, e, msg=lambda s: f"output {i}: {s}")
    for i in kwargs.get("non_differentiable_idx", ()):
        assert not op_out[i].requires_grad, f"output {i} is in non_differentiable_idx but requires grad"
    flags = [e.requires_grad for e in eager_out]
    eager_loss, op_loss = weighted_loss(eager_out, flags), weighted_loss(list(op_out), flags)
    assert eager_loss is not None and op_loss is not None
    eager_loss.backward()
    op_loss.backward()
    assert_grads_equal(eager_args, op_args)


FRESH_OPS_CHECK = """\
import sys
import torch
import minihop

assert "minihop.ops" in sys.modules and minihop.ops.autograd_function_apply


class MySin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


graphs = []


def backend(gm, example_inputs):
    graphs.append(gm)
    return gm.forward


x = torch.randn(4, requires_grad=True)
torch.compile(lambda t: MySin.apply(t), backend=backend, fullgraph=True)(x)
outer = graphs[0]
(call,) = [n for n in outer.graph.nodes if n.op == "call_function" and "autograd_function_apply" in str(n.target)]
kwargs = {k: v for k, v in call.kwargs.items() if k in ("non_differentiable_idx", "saved_for_backward_idx", "dirty_idx")}
a, b = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
(out,) = minihop.ops.autograd_function_apply(outer.fwd_body_0, outer.bwd_body_0, a, **kwargs)
expected = MySin.apply(b)
torch.testing.assert_close(out, expected, rtol=0, atol=0)
(out * 3).sum().backward()
(expected * 3).sum().backward()
torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
print("ok", sorted(kwargs))
"""


class TestAutogradFunctionApplyOp:
    @pytest.mark.parametrize("name", list(OP_CASES))
    def test_dynamo_bodies_match_eager(self, name: str) -> None:
        """Dynamo's fwd_body_0/bwd_body_0, run by minihop's op with the outer call's kwargs, match eager."""
        case = OP_CASES[name]
        args = case.make_args()
        dg = dynamo_graphs(case.fn_cls, *args)
        kwargs = dynamo_apply_kwargs(dg.outer)
        assert set(kwargs) <= {"non_differentiable_idx", "saved_for_backward_idx", "dirty_idx"}
        (call,) = apply_nodes(dg.outer)
        assert len(call.args) - 2 == len(case.op_inputs(args))
        assert_op_matches_eager(case, dg.fwd, dg.bwd, kwargs)

    @pytest.mark.parametrize("name", list(OP_CASES))
    def test_minihop_pairs_match_eager(self, name: str) -> None:
        """minihop's own pair, run by the op with the capture's index lists, matches eager."""
        case = OP_CASES[name]
        cap = minihop.capture(case.fn_cls, *case.make_args())
        kwargs = {"non_differentiable_idx": list(cap.non_differentiable_idx),
                  "saved_for_backward_idx": list(cap.saved_for_backward_idx),
                  "dirty_idx": list(cap.dirty_idx)}
        assert len([n for n in cap.fwd.graph.nodes if n.op == "placeholder"]) == len(case.op_inputs(case.make_args()))
        assert_op_matches_eager(case, cap.fwd, cap.bwd, kwargs)

    def test_mark_dirty_pair(self) -> None:
        """A mark_dirty pair run with dirty_idx returns the input object itself and gives eager's grad."""
        base_eager, base_op = r(3, seed=20), r(3, seed=20)
        cap = minihop.capture(MulTwoInplace, base_eager.detach() * 1)
        assert cap.dirty_idx == (0,)
        x_eager, x_op = base_eager * 1, base_op * 1
        eager_out = MulTwoInplace.apply(x_eager)
        (op_out,) = minihop.ops.autograd_function_apply(
            cap.fwd, cap.bwd, x_op, non_differentiable_idx=list(cap.non_differentiable_idx),
            saved_for_backward_idx=list(cap.saved_for_backward_idx), dirty_idx=list(cap.dirty_idx))
        assert (op_out is x_op) == (eager_out is x_eager)
        torch.testing.assert_close(op_out, eager_out)
        (eager_out * 3).sum().backward()
        (op_out * 3).sum().backward()
        torch.testing.assert_close(base_op.grad, base_eager.grad)

    def test_reachable_from_import_minihop_in_a_fresh_process(self) -> None:
        """Issue 17: after a plain ``import minihop`` (no ``import minihop.ops``), a fresh process
        runs the bodies torch.compile produces for a Function through
        ``minihop.ops.autograd_function_apply`` and gets eager's output and grad."""
        code = FRESH_OPS_CHECK
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=300, cwd=Path(__file__).resolve().parent.parent)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("ok")

    def test_the_two_systems_cross_run(self) -> None:
        """Dynamo's fwd with minihop's bwd (and the reverse) agree where the pairs share their contract."""
        case = OP_CASES["multi_output_saved_input_intermediate_output"]
        dg = dynamo_graphs(case.fn_cls, *case.make_args())
        cap = minihop.capture(case.fn_cls, *case.make_args())
        kwargs = dynamo_apply_kwargs(dg.outer)
        assert kwargs["saved_for_backward_idx"] == list(cap.saved_for_backward_idx)
        assert_op_matches_eager(case, dg.fwd, cap.bwd, kwargs)
        assert_op_matches_eager(case, cap.fwd, dg.bwd, kwargs)


# ---------------------------------------------------------------------------------------------
# minihop.testing.assert_same_graph: minihop's bodies against Dynamo's
# ---------------------------------------------------------------------------------------------

SEED_CASES: dict[str, tuple[type, Callable[[], tuple[Any, ...]]]] = {
    "user_defined_object_as_input": (UserDefinedObjectAsInput, user_defined_object_args),
    "linear": (LinearFunction, linear_args),
    "mark_non_differentiable": (MarkNonDifferentiable, mark_non_differentiable_args),
    "rewired_bwd_output": (RewiredBwdOutput, rewired_bwd_output_args),
    "udf_output": (UdfOutput, two_8x8_args),
    "aliasing_output": (AliasingOutput, one_8x8_arg),
    "invoke_subgraph_mysin": (MySin, one_8x8_arg),
}


def fn_rewired_apply(x: torch.Tensor, y: torch.Tensor) -> Any:
    return RewiredBwdOutput.apply(x, y)


def dynamo_graphs_dynamic_dim0(args: tuple[Any, ...]) -> fx.GraphModule:
    """Dynamo's outer graph for ``fn_rewired_apply`` with dim 0 of x and y marked dynamic, as the seed's test does.

    The function's parameters are named x and y, as the seed's ``fn(x, y)``: Dynamo names size
    symbols after their source, and of two equal symbols keeps one by name.
    """
    graphs: list[fx.GraphModule] = []

    def record(gm: fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    leaves = clone_args(args)
    for t in leaves:
        torch._dynamo.mark_dynamic(t, 0)
    torch.compiler.reset()
    torch.compile(fn_rewired_apply, backend=record, fullgraph=True)(*leaves)
    (outer,) = graphs
    return outer


def diff_lines(message: str) -> tuple[list[str], list[str]]:
    """The removed and added lines of assert_same_graph's unified diff."""
    lines = message.split("\n")
    removed = [l[1:] for l in lines if l.startswith("-") and not l.startswith("---")]
    added = [l[1:] for l in lines if l.startswith("+") and not l.startswith("+++")]
    return removed, added


class TestAssertSameGraph:
    @pytest.mark.parametrize("name", list(SEED_CASES))
    def test_minihop_bodies_equal_dynamos(self, name: str) -> None:
        """For each seed case, minihop's fwd and bwd are node for node Dynamo's, shapes and dtypes included."""
        fn_cls, make_args = SEED_CASES[name]
        cap = minihop.capture(fn_cls, *make_args())
        dg = dynamo_graphs(fn_cls, *make_args())
        assert_same_graph(cap.fwd, dg.fwd, check_meta=True)
        assert_same_graph(cap.bwd, dg.bwd, check_meta=True)

    def test_dynamic_rewired_bwd_output_differs_only_in_symbol_names(self) -> None:
        """The seed's dynamic test_rewired_bwd_output: the same graphs but for the size symbols' names."""
        # Why: Dynamo names a size symbol after a hash of its source (`L['y'].size()[0]` is the
        # seed's s17); minihop's ShapeEnv names its own. Both mean the same size, so the only
        # difference is the symbol's name in each shape annotation.
        args = rewired_bwd_output_args()
        cap = minihop.capture(RewiredBwdOutput, *args, dynamic={"x": [0], "y": [0]})
        outer = dynamo_graphs_dynamic_dim0(args)

        def size_symbol(gm: fx.GraphModule) -> str:
            node = next(n for n in gm.graph.nodes if n.op == "placeholder"
                        and isinstance(n.meta.get("val", n.meta.get("example_value")), torch.Tensor))
            return str(node.meta.get("val", node.meta.get("example_value")).shape[0])

        for mine, theirs in ((cap.fwd, outer.fwd_body_0), (cap.bwd, outer.bwd_body_0)):
            assert_same_graph(mine, theirs)  # structure: identical
            mine_sym, theirs_sym = size_symbol(mine), size_symbol(theirs)
            if mine_sym == theirs_sym:  # the names happened to agree: nothing differs
                assert_same_graph(mine, theirs, check_meta=True)
                continue
            with pytest.raises(AssertionError, match="graphs differ") as info:
                assert_same_graph(mine, theirs, check_meta=True)
            removed, added = diff_lines(str(info.value))
            assert removed, "the diff lists no line"
            assert [re.sub(rf"\b{mine_sym}\b", theirs_sym, line) for line in removed] == added

    def test_names_do_not_matter(self) -> None:
        """Node names never matter; x.sin() vs torch.sin(x) is the same graph only with normalize=True (strict is the default)."""

        def f(a: torch.Tensor) -> torch.Tensor:
            t = a.sin()
            return t * 2

        def g(b: torch.Tensor) -> torch.Tensor:
            u = torch.sin(b)
            return operator.mul(u, 2)

        assert_same_graph(fx.symbolic_trace(f), fx.symbolic_trace(g), normalize=True)
        with pytest.raises(AssertionError, match=r"-sin = Tensor\.sin\(a,\)\n\+sin = torch\.sin\(b,\)"):
            assert_same_graph(fx.symbolic_trace(f), fx.symbolic_trace(g))

    def test_different_op_raises_with_a_diff(self) -> None:
        """A body computing cos where the other computes sin fails with a diff naming both lines."""

        class MyCos(Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
                ctx.save_for_backward(x)
                return torch.cos(x)

            @staticmethod
            def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
                (x,) = ctx.saved_tensors
                return x * torch.cos(grad_out)

        sin_cap = minihop.capture(MySin, *one_8x8_arg())
        cos_cap = minihop.capture(MyCos, *one_8x8_arg())
        assert_same_graph(sin_cap.bwd, cos_cap.bwd, check_meta=True)  # the backwards are the same
        with pytest.raises(AssertionError) as info:
            assert_same_graph(sin_cap.fwd, cos_cap.fwd)
        message = str(info.value)
        assert message.startswith("graphs differ (up to node names):\n--- a\n+++ b\n")
        # Nodes by their own names, not positions (%2), each with the user's line that made it.
        assert diff_lines(message) == (["outs = torch.sin(l_x_,)"], ["outs = torch.cos(l_x_,)"])
        assert "      at test_oracle.py:" in message and ": return torch.cos(x)" in message

    def test_different_shapes_raise_only_with_check_meta(self) -> None:
        """The same ops on 8x8 and 4x4 inputs are equal without check_meta and differ, in the annotations, with it."""
        big = minihop.capture(MySin, r(8, 8))
        small = minihop.capture(MySin, r(4, 4))
        assert_same_graph(big.fwd, small.fwd)
        with pytest.raises(AssertionError, match=r"-l_x_ = placeholder\(\)  # float32\[8, 8\]\n") as info:
            assert_same_graph(big.fwd, small.fwd, check_meta=True)
        removed, added = diff_lines(str(info.value))
        assert [line.replace("[8, 8]", "[4, 4]") for line in removed] == added


# ---------------------------------------------------------------------------------------------
# Fresh processes: the artifact loader, the plugin's separate project and the CLI
# ---------------------------------------------------------------------------------------------
# Each starts a new interpreter (importing torch takes seconds), so the three are started
# together by one fixture, on first use, and run side by side; each test waits for its own.

_LOADER = textwrap.dedent("""
    import sys
    import torch
    import minihop

    for name in ("static", "dynamic"):
        ref = torch.load(name + "_ref.pt")
        cap = minihop.load(name + ".mh")
        x, w = (t.detach().clone().requires_grad_() for t in ref["inputs"])
        outs = cap(x, w, ref["k"])
        assert len(outs) == len(ref["outputs"])
        for o, e in zip(outs, ref["outputs"]):
            torch.testing.assert_close(o, e)
            assert o.requires_grad
        sum((o * wt).sum() for o, wt in zip(outs, ref["weights"])).backward()
        torch.testing.assert_close(x.grad, ref["grads"][0])
        torch.testing.assert_close(w.grad, ref["grads"][1])
        print("ok", name, tuple(x.shape))
    print("test_oracle imported:", "test_oracle" in sys.modules)
""")


def _make_local_function() -> type:
    # Defined in a function body: its qualified name (_make_local_function.<locals>.LocalTanhLinear)
    # cannot be imported by any process, and the loading process never imports this file.
    class LocalTanhLinear(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.tanh(x @ w) * k
            ctx.save_for_backward(x, w, y)
            ctx.k = k
            return y, x.sum(0)

        @staticmethod
        def backward(ctx: Any, gy: torch.Tensor, gs: torch.Tensor) -> tuple[Any, ...]:
            x, w, y = ctx.saved_tensors
            gz = gy * (ctx.k - y * y / ctx.k)
            return gz @ w.t() + gs, x.t() @ gz, None

    return LocalTanhLinear


def _eager_reference(fn_cls: type, x: torch.Tensor, w: torch.Tensor, k: float) -> dict[str, Any]:
    """Eager outputs and grads for fixed loss weights: what the loading process must reproduce."""
    x, w = clone_args((x, w))
    outs = fn_cls.apply(x, w, k)
    weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(30 + i)) for i, o in enumerate(outs)]
    sum((o * wt).sum() for o, wt in zip(outs, weights)).backward()
    return {"inputs": [x.detach(), w.detach()], "k": k, "outputs": [o.detach() for o in outs],
            "weights": weights, "grads": [x.grad, w.grad]}


def _write_artifacts(directory: Path) -> None:
    """A static and a dynamic capture of a non-importable Function, with eager references."""
    fn_cls = _make_local_function()
    x, w = r(4, 3, seed=21), r(3, 5, seed=22)
    minihop.capture(fn_cls, x, w, 2.0).save(str(directory / "static.mh"))
    torch.save(_eager_reference(fn_cls, x, w, 2.0), directory / "static_ref.pt")
    # Captured at batch 4 with dim 0 dynamic; the loading process runs it at batch 7.
    minihop.capture(fn_cls, x, w, 2.0, dynamic={"x": [0]}).save(str(directory / "dynamic.mh"))
    torch.save(_eager_reference(fn_cls, r(7, 3, seed=23), w, 2.0), directory / "dynamic_ref.pt")


_PLUGIN_PROJECT_TEST = textwrap.dedent("""
    import torch


    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, g * x


    def test_uses_the_oracle(minihop_oracle):
        x = torch.randn(3, 3, requires_grad=True)
        y = torch.randn(3, 3, requires_grad=True)
        cap = minihop_oracle.capture(Mul, x, y)
        minihop_oracle.check_consistent(cap.fwd, cap.bwd)
        minihop_oracle.assert_matches_eager(Mul, x, y)
        minihop_oracle.assert_same_graph(cap.fwd, minihop_oracle.capture(Mul, x, y).fwd, check_meta=True)
        (out,) = minihop_oracle.autograd_function_apply(
            cap.fwd, cap.bwd, x, y, saved_for_backward_idx=list(cap.saved_for_backward_idx))
        torch.testing.assert_close(out, x * y)
""")

_CLI_MODULE = textwrap.dedent("""
    import torch


    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, g * x
""")


def write_cli_module(directory: Path) -> str:
    (directory / "oracle_cli_fn.py").write_text(_CLI_MODULE)
    return f"{directory / 'oracle_cli_fn.py'}:Mul"


class TestDynamoGraphs:
    """``dynamo_graphs`` leaves the caller's state alone, so any test (and the suite's sweep)
    may call it."""

    def test_the_function_never_runs(self) -> None:
        """Dynamo traces the Function; its compiled code (which would replay forward's Python
        side effects after the graph) never runs."""
        log: list[int] = []

        class Logs(Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
                log.append(1)
                return x * 2

            @staticmethod
            def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
                return g * 2

        x = torch.rand(3, requires_grad=True)
        dg = dynamo_graphs(Logs, x)
        assert log == [] and x.grad is None and x._version == 0
        assert [n.target for n in dg.fwd.graph.nodes if n.op == "call_function"][1] is operator.mul

    def test_the_callers_compiled_functions_are_not_compiled_again(self) -> None:
        """Nothing is reset: a function the caller compiled keeps its compiled code."""
        compiles: list[int] = []

        def counting(gm: fx.GraphModule, example_inputs: Any) -> Any:
            compiles.append(1)
            return gm.forward

        compiled = torch.compile(lambda x: x.sin() + 1, backend=counting)
        x = torch.rand(3)
        compiled(x)
        dynamo_graphs(MySin, torch.rand(3, requires_grad=True))
        compiled(x)
        assert len(compiles) == 1

    def test_shapes_stay_static_across_calls(self) -> None:
        """Each call is a first compile: sizes seen by earlier calls do not make dims dynamic."""
        for n in (3, 5, 7):
            dg = dynamo_graphs(MySin, torch.rand(n, requires_grad=True))
            first = next(iter(dg.fwd.graph.nodes))
            assert list(first.meta["example_value"].shape) == [n]

    def test_no_hop_is_a_clear_error(self) -> None:
        """Without an argument that requires grad Dynamo inlines forward: there are no bodies."""
        with pytest.raises(ValueError, match=r"Dynamo did not capture MySin.apply as an "
                           r"autograd_function_apply.*\n.*requires_grad=True"):
            dynamo_graphs(MySin, torch.rand(3))


@dataclasses.dataclass(frozen=True)
class Started:
    """A subprocess already running, its output going to files; ``result()`` waits for it."""

    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def result(self) -> subprocess.CompletedProcess[str]:
        self.proc.wait(timeout=300)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode,
                                           self.stdout.read_text(), self.stderr.read_text())


def start(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Started:
    out, err = cwd / "_stdout.txt", cwd / "_stderr.txt"
    with open(out, "wb") as out_file, open(err, "wb") as err_file:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out_file, stderr=err_file)
    return Started(proc, out, err)


@pytest.fixture(scope="module")
def fresh_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Started]]:
    """The file's three subprocesses, started together: artifact loader, plugin project, CLI --check."""
    artifacts = tmp_path_factory.mktemp("artifacts")
    _write_artifacts(artifacts)
    project = tmp_path_factory.mktemp("plugin_project")
    (project / "test_project.py").write_text(_PLUGIN_PROJECT_TEST)
    cli = tmp_path_factory.mktemp("cli")
    target = write_cli_module(cli)
    # The plugin must come from the installed entry point: nothing may switch autoloading off.
    plugin_env = {k: v for k, v in os.environ.items()
                  if k not in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS", "PYTEST_ADDOPTS")}
    started = {
        "artifacts": start([sys.executable, "-c", _LOADER], artifacts),
        # Unrelated third-party plugins are switched off only to start faster.
        "plugin": start([sys.executable, "-m", "pytest", "-q", "test_project.py", "-p", "no:cacheprovider",
                         "-p", "no:hypothesispytest", "-p", "no:benchmark"], project, plugin_env),
        "cli": start([sys.executable, "-m", "minihop", "show", target, "--args", "f32[8,8], f32[8,8]", "--check"], cli),
    }
    yield started
    for s in started.values():
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _start_fresh_processes_first(request: pytest.FixtureRequest) -> None:
    """When a selected test needs the subprocesses, start them with the module so they overlap the in-process tests."""
    if any(item.module is request.module and "fresh_processes" in getattr(item, "fixturenames", ())
           for item in request.session.items):
        request.getfixturevalue("fresh_processes")


# ---------------------------------------------------------------------------------------------
# Artifacts: Capture.save / minihop.load
# ---------------------------------------------------------------------------------------------

_ARTIFACT_SCALE = 2.0
_ARTIFACT_LOG: list[int] = []
_ARTIFACT_ACT = torch.tanh


class _ScaleByGlobal(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * _ARTIFACT_SCALE

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * _ARTIFACT_SCALE


class _LogsCalls(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _ARTIFACT_LOG.append(x.shape[0])
        return x.sin()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class _GlobalActivation(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = _ARTIFACT_ACT(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


class TestArtifacts:
    def test_save_load_in_fresh_process_runs_like_eager(self, fresh_processes: dict[str, Started]) -> None:
        """Static and dynamic captures of a non-importable Function, loaded in a fresh process, give eager's outputs and grads."""
        result = fresh_processes["artifacts"].result()
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n")[:3] == ["ok static (4, 3)", "ok dynamic (7, 3)", "test_oracle imported: False"]

    def test_user_object_output_is_refused_at_save(self, tmp_path: Path) -> None:
        """A capture whose output holds a user object cannot be saved, and no file is written."""
        cap = minihop.capture(UdfOutput, *two_8x8_args())
        path = tmp_path / "udf.mh"
        with pytest.raises(minihop.UnsupportedOutputError,
                           match=r"Cannot save the capture of UdfOutput: its output holds a Foo \(object\)"):
            cap.save(str(path))
        assert not path.exists()

    def test_capture_reading_a_global_value_is_refused_at_save(self, tmp_path: Path) -> None:
        """A loaded capture checks only its arguments: one whose forward read a global float
        would keep the value seen when saving after the caller changed it (eager reads the new
        one), so saving it is refused, naming the global, and no file is written."""
        cap = minihop.capture(_ScaleByGlobal, torch.randn(3, requires_grad=True))
        path = tmp_path / "g.mh"
        with pytest.raises(minihop.UnsupportedOutputError,
                           match=r"Cannot save the capture of _ScaleByGlobal: its forward reads _ARTIFACT_SCALE"):
            cap.save(str(path))
        assert not path.exists()

    def test_capture_writing_python_state_is_refused_at_save(self, tmp_path: Path) -> None:
        """Forward appends to a global log on every eager call; a loaded capture would not."""
        cap = minihop.capture(_LogsCalls, torch.randn(3, requires_grad=True))
        with pytest.raises(minihop.UnsupportedOutputError,
                           match=r"Cannot save the capture of _LogsCalls: its forward writes _ARTIFACT_LOG"):
            cap.save(str(tmp_path / "w.mh"))

    def test_global_holding_a_library_function_is_carried(self, tmp_path: Path) -> None:
        """A global holding torch.tanh is code the graphs resolved to tanh: the capture saves,
        and the loaded one gives eager's output and grad."""
        x = torch.randn(5, requires_grad=True)
        path = tmp_path / "act.mh"
        minihop.capture(_GlobalActivation, x).save(str(path))
        loaded = minihop.load(str(path))
        xe, xm = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        ye, ym = _GlobalActivation.apply(xe), loaded(xm)
        ye.sum().backward()
        ym.sum().backward()
        assert torch.equal(ye, ym) and torch.equal(xe.grad, xm.grad)

    def test_wrong_version_is_refused(self, tmp_path: Path) -> None:
        """A file whose manifest has another version is refused with a ValueError naming both versions."""
        path = tmp_path / "mysin.mh"
        minihop.capture(MySin, *one_8x8_arg()).save(str(path))
        data = torch.load(path, weights_only=False)
        manifest = json.loads(data["manifest"])
        manifest["version"] = 99
        data["manifest"] = json.dumps(manifest)
        torch.save(data, path)
        with pytest.raises(ValueError, match=r"is not a minihop-capture version 1 file "
                                             r"\(found 'minihop-capture' version 99\)"):
            minihop.load(str(path))


# ---------------------------------------------------------------------------------------------
# The pytest plugin (entry point `minihop`, fixture `minihop_oracle`)
# ---------------------------------------------------------------------------------------------

class TestPytestPlugin:
    def test_fixture_in_a_separate_project(self, fresh_processes: dict[str, Started]) -> None:
        """A separate project's test gets `minihop_oracle` through the installed entry point and passes."""
        result = fresh_processes["plugin"].result()
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 passed" in result.stdout


# ---------------------------------------------------------------------------------------------
# python -m minihop show
# ---------------------------------------------------------------------------------------------

def show_in_process(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    """``python -m minihop show ...`` through ``minihop.__main__.main``, undoing its sys.path/sys.modules changes."""
    from minihop.__main__ import main

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "_minihop_show_target", None)
    return main(["show", *argv])


class TestShowCli:
    def test_check_prints_graphs_and_ok(self, fresh_processes: dict[str, Started]) -> None:
        """`python -m minihop show FILE.py:Mul --args ... --check` prints the three graphs and the ok line, exit code 0."""
        result = fresh_processes["cli"].result()
        assert result.returncode == 0, result.stdout + result.stderr
        out = result.stdout
        assert out.startswith("class GraphModule(torch.nn.Module):\n")
        assert "    class fwd_body_0(torch.nn.Module):\n" in out and "    class bwd_body_0(torch.nn.Module):\n" in out
        # By hand: Mul saves both inputs, both through save_for_backward.
        assert ("autograd_function_apply(fwd_body_0, bwd_body_0, l_x_, l_y_, non_differentiable_idx = [], "
                "saved_for_backward_idx = [0, 1])") in out
        assert out.rstrip("\n").split("\n")[-1] == "ok Mul: outputs and every grad match eager"

    def test_bad_args_spec_is_a_clear_error(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """An unknown dtype in --args exits with one message naming the item and the known dtypes (exit status 1)."""
        target = write_cli_module(tmp_path)
        with pytest.raises(SystemExit) as info:
            show_in_process(monkeypatch, target, "--args", "f32[8,8], q32[3]")
        # A string code: Python prints it to stderr and exits with status 1.
        assert info.value.code == "--args: unknown dtype 'q32' in 'q32[3]'; use one of f32, f64, f16, bf16, i64, i32, bool"

    def test_explain_prints_the_report(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
        """`--explain` adds minihop.explain's report: the Function, its inputs and what it saved."""
        target = write_cli_module(tmp_path)
        assert show_in_process(monkeypatch, target, "--args", "f32[8,8], f32[8,8]", "--explain") == 0
        out = capsys.readouterr().out
        assert "minihop.explain: Mul\n  captured: yes\n" in out
        assert "  fwd inputs: l_x_ <- x, l_y_ <- y\n" in out
        assert "  saved for backward:\n" in out
